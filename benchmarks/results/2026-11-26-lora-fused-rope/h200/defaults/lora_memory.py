"""What is alive at a LoRA step's peak (1.3b, rank 16, attention, a random base): the BF16 base, the FP8 base from the
defaults, and the FP8 base with its head in BF16. Not part of the package: the probe behind lora-memory.log here.

Records the allocator history from before the first step (compile and CUDA-graph capture included) through the
measured steps, then replays it to the moment of the global peak and groups the blocks alive then by size and site.

    python3 benchmarks/results/2026-11-26-lora-fused-rope/h200/defaults/lora_memory.py [config flags for every variant]

(GPU; from the checkout's root with the package importable. It ran as next/lora_memory.py, with the allocator
recording written out inline; memory_peak.allocation_trace holds those lines since.)
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from pathlib import Path

import torch

from cs336_basics.build import build
from cs336_basics.cli import config_from_args, config_parser
from cs336_basics.diagnostics.amdahl.measure import measurement_plan, measurement_tokens
from cs336_basics.diagnostics.measurement import release_memory, train_for_measurement
from cs336_basics.sweep.lora_analysis import write_random_base
from lab.memory_peak import allocation_trace, grouped, live_at_peak

BASE = ["--preset", "1.3b", "--lora_rank", "16", "--lora_targets", "attn"]
VARIANTS = {
    "bf16 auto": ([], False),
    "fp8 auto": ([], True),
    "fp8 auto, bf16 head": (["--no_fp8_lm_head"], True),
}


def main() -> None:
    extra = sys.argv[1:]
    parser = config_parser("lora memory probe", prog="lora_memory")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.pt"
        args = parser.parse_args(BASE)
        write_random_base(args, base)
        for name, (flags, use_fp8) in VARIANTS.items():
            try:
                probe(name, parser, base, flags, use_fp8, extra)
            except Exception:
                traceback.print_exc()
                release_memory()


def probe(name, parser, base, flags, use_fp8, extra) -> None:
    args = parser.parse_args([*BASE, "--init_from", str(base), *flags, *extra])
    config = config_from_args(args)
    plan = measurement_plan(config, 6)
    tokens = measurement_tokens(plan.config)
    torch.cuda.reset_peak_memory_stats()
    built = build(plan.with_fp8(use_fp8))

    def train(built=built):
        trainer, result = train_for_measurement(built, *tokens, log=lambda m: None)
        for _ in range(2):
            trainer.train_step()
        return trainer, result

    start, trace, (trainer, result) = allocation_trace(train, max_entries=2_000_000)
    peak, index, blocks = live_at_peak(trace, start)
    c = built.config
    print(
        f"\n== {name}: {result.tokens_per_sec:,.0f} tok/s, compile_mode {c.train.compile_mode}, "
        f"scaling {c.fp8.fp8_scaling}, fp8 head {c.fp8.fp8_lm_head}; max_allocated "
        f"{torch.cuda.max_memory_allocated() / 2**30:.3f} GiB, replayed {peak / 2**30:.3f}, before steps "
        f"{start / 2**30:.3f}, peak at event {index} of {len(trace)}"
    )
    for row in grouped(blocks, 14):
        print(f"  {row['total_mib']:9.1f} MiB = {row['count']:3d} x {row['size_mib']:8.2f} MiB  {row['site']}")
    del trainer, built, trace, blocks
    release_memory()


if __name__ == "__main__":
    main()
