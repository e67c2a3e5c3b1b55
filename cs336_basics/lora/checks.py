"""What a fine-tuning request cannot have, refused before anything is built, with what to do instead."""

from __future__ import annotations

from cs336_basics.config import RunConfig, lora_target_list
from cs336_basics.errors import ConfigError
from cs336_basics.lora.apply import LoRAConverter
from cs336_basics.parallel.world import World


def check_finetune_request(config: RunConfig, world: World) -> None:
    ft, fp8 = config.finetune, config.fp8
    if not ft.lora:
        return
    if world.world_size > 1:
        raise ConfigError(
            "LoRA runs on one GPU only so far (its frozen FP8 base was not built or tested under DDP or FSDP2); "
            "start it without torchrun, or fine-tune every weight (--init_from without --lora_rank) on several GPUs."
        )
    LoRAConverter.check_options(fp8)
    check_rank_fits(config)


def check_rank_fits(config: RunConfig) -> None:
    """Refuse a rank above a target layer's smaller side: its adapters B A would hold more numbers than the weight they
    change and could reach no update a smaller rank cannot (the rank of B A is at most that side)."""
    m, ft = config.model, config.finetune
    kv, ffn = min(m.dim, m.kv_heads * m.head_dim), min(m.dim, m.intermediate_size)
    smaller_side = {
        "q": m.dim, "k": kv, "v": kv, "o": m.dim, "w1": ffn, "w2": ffn, "w3": ffn, "lm_head": min(m.dim, m.vocab_size)
    }  # fmt: skip
    targets = lora_target_list(ft.lora_targets)
    too_small = [name for name in targets if ft.lora_rank > smaller_side[name]]
    if too_small:
        fits = min(smaller_side[name] for name in targets)
        raise ConfigError(
            f"--lora_rank {ft.lora_rank} is above the smaller side of the {', '.join(too_small)} layers "
            f"({', '.join(str(smaller_side[n]) for n in too_small)}): such adapters are larger than the weights they "
            f"change. Use --lora_rank {fits} or less, or fine-tune every weight (--init_from without --lora_rank)."
        )
