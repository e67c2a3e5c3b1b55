"""What a fine-tuning request cannot have, refused before anything is built, with what to do instead."""

from __future__ import annotations

from cs336_basics.config import RunConfig
from cs336_basics.errors import ConfigError
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
    if fp8.use_fp8 is not False and fp8.fp8_recipe != "tensorwise":
        raise ConfigError(
            f"the frozen FP8 base of a LoRA run scales tensorwise; --fp8_recipe {fp8.fp8_recipe} was asked for. Use "
            "--fp8_recipe tensorwise, or --no_use_fp8 for a BF16 base."
        )
    if fp8.use_fp8 and fp8.fp8_emulate:
        raise ConfigError(
            "--fp8_emulate: a LoRA run's frozen FP8 base always runs real FP8 casts and GEMMs (torch._scaled_mm, "
            "on an FP8 GPU or with torch's CPU kernel on the CPU), never high-precision emulation. Drop --fp8_emulate."
        )
