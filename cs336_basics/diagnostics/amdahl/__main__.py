"""python -m cs336_basics.diagnostics.amdahl --preset P --batch_size B [--json out.json]: where the time goes."""

from __future__ import annotations

import sys

from cs336_basics.diagnostics.amdahl.measure import analyse
from cs336_basics.diagnostics.amdahl.report import format_shape_table, format_table, format_top_kernels
from cs336_basics.errors import ConfigError, report_error
from cs336_basics.measure.results import write_results


def main(argv: list[str] | None = None) -> int:
    from cs336_basics.cli import config_from_args, config_parser, positive_int

    parser = config_parser(
        "Where the time goes: Amdahl's-law prediction of the FP8 speedup vs the measured one.",
        prog="python -m cs336_basics.diagnostics.amdahl",
    )
    parser.add_argument("--steps", type=int, default=8, help="training steps per precision before timing (>= 3)")
    parser.add_argument("--timing_steps", type=positive_int, default=5, help="CUDA-event-timed steps (median)")
    parser.add_argument("--profile_steps", type=positive_int, default=1, help="profiled steps (averaged)")
    parser.add_argument(
        "--top_kernels", type=positive_int, default=8, help="name each precision's N kernels with the most time"
    )
    parser.add_argument("--json", help="write the result here ({gpu, torch, torchao, command, runs: [row]})")
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        row = analyse(
            config,
            steps=args.steps,
            timing_steps=args.timing_steps,
            profile_steps=args.profile_steps,
            top_kernels=args.top_kernels,
        )
    except ConfigError as exc:
        return report_error(exc)
    print(format_table([row]))
    print()
    print(format_shape_table(row.shapes))
    bf16, fp8 = row.bf16_breakdown, row.fp8_breakdown
    print(
        f"\nBF16 step {row.bf16_step_ms:.2f} ms: all linear GEMMs {bf16['linear_gemm_ms']:.2f} ms "
        f"({100 * row.all_linear_share:.1f}%, lm_head included), converted ones {bf16['converted_gemm_ms']:.2f} ms "
        f"(X = {100 * row.linear_share:.1f}%), attention {bf16['attention_ms']:.2f} ms; "
        f"FP8 _scaled_mm {fp8['fp8_gemm_ms']:.2f} ms (in-situ s = {row.in_situ_matmul_speedup:.2f}x), "
        f"FP8's extra non-GEMM kernels {row.profiled_fp8_extra_ms:+.2f} ms/step. "
        f"Kernels attributed by {row.method}, X by {row.attribution}."
    )
    for note in row.notes:
        print(f"note: {note}")
    for name, breakdown in (("BF16", bf16), ("FP8", fp8)):
        print(f"\n{format_top_kernels(name, breakdown['top_kernels'])}")
    if args.json:
        write_results(args.json, [row.to_dict()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
