"""Throughput sweep over precision (BF16 / FP8 recipes, FP8 lm_head), torch.compile mode, attention kernel,
activation checkpointing, batch size, model preset and world size (GPUs, under torchrun, with DDP or FSDP2); every
configuration in its own process (or torchrun launch).

uv run optimize_performance.py --quick        # 366m: BF16 vs the default FP8, compile auto (< 8 min on an H100)
uv run optimize_performance.py --presets 366m,1.3b --precisions bf16,fp8-tensorwise --compile default \\
    --attention sdpa --ac off --batch_sizes 4,8
uv run optimize_performance.py --presets 1.3b --precisions bf16,fp8-tensorwise --compile default --attention sdpa \\
    --ac off --batch_sizes 4 --world_sizes 1,2 --parallel ddp,fsdp   # 1 GPU vs 2 (torchrun), DDP and FSDP2
uv run optimize_performance.py --dry_run      # the full grid's plan, nothing run
uv run optimize_performance.py --help         # every flag

Results: OUT_DIR/sweep.json (appended after every configuration), sweep.csv, sweep.md (also printed), sweep.png.
"""

from __future__ import annotations

import sys

from cs336_basics.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
