"""Fine-tuning from a base model: --init_from (full fine-tuning), and LoRA adapters on a frozen base (BF16 or FP8)."""

from cs336_basics.lora.apply import LoRAConverter, LoRAReport, apply_lora, count_frozen_fp8_linears
from cs336_basics.lora.base import Base, load_base, read_base
from cs336_basics.lora.checks import check_finetune_request

__all__ = [
    "Base", "LoRAConverter", "LoRAReport", "apply_lora", "check_finetune_request", "count_frozen_fp8_linears",
    "load_base", "read_base",
]  # fmt: skip
