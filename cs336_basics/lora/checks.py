"""What a fine-tuning request cannot have, refused before anything is built, with what to do instead."""

from __future__ import annotations

from cs336_basics.config import RunConfig
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
