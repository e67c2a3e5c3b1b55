"""The sweep's command line: the grid flags, the train_h100.py settings passed through to every configuration,
the plan printed first, and the outputs written as results arrive."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

import cs336_basics.sweep.lora as sweep_lora
import cs336_basics.sweep.run as sweep_run
from cs336_basics.cli import add_config_arguments, load_config_file, overrides_from_args, positive_int
from cs336_basics.config import ATTENTION_BACKENDS, PRESETS, lora_target_list
from cs336_basics.devices import require_cuda
from cs336_basics.errors import ConfigError, run_program
from cs336_basics.files.output_paths import check_output_path
from cs336_basics.measure.results import check_results_file, environment
from cs336_basics.sweep.plan import (
    COMPILE_CHOICES,
    DEFAULTS,
    LORA_DEFAULTS,
    PARALLEL_CHOICES,
    PRECISIONS,
    QUICK,
    Grid,
    Planned,
    SweepOptions,
    amdahl_targets,
    check_pass_through,
    default_out_dir,
    parse_batch_sizes,
    parse_choices,
    parse_on_off,
    parse_positive_ints,
    parse_variants,
    parse_world_sizes,
    plan_sweep,
)
from cs336_basics.sweep.report import format_amdahl, write_outputs
from cs336_basics.training.signals import terminate_raises
from cs336_basics.training.trainer import WARMUP_STEPS_EXCLUDED

EPILOG = """\
Every other flag is a train_h100.py setting applied to every configuration, e.g. --dim/--n_layers/--context_length
(a custom shape on top of each preset), --no_fp8_shape_filter, --fp8_format, --device, --seed, --lr,
--dataset, --train_data/--val_data, --config FILE. Flags the sweep sets itself (--batch_size, --attention,
--use_fp8, --compile_mode, ...) are refused with the sweep flag to use instead, in a --config file too.

examples:
  optimize_performance.py --quick                       # 366m, bf16 vs the default fp8, compile auto, 20 steps
  optimize_performance.py --presets 366m,1.3b --precisions bf16,fp8-tensorwise --compile default \\
      --attention sdpa --ac off --batch_sizes 4,8
  optimize_performance.py --presets 1.3b --fp8_lm_head off,on --dry_run   # print the plan only
  optimize_performance.py --presets gpt2-small --precisions bf16,fp8 --compile default --repeats 3 --cold
      # three first runs of each (fresh processes, empty compile caches): the median and the range
  optimize_performance.py --presets 1.3b --precisions bf16,fp8-tensorwise --compile default --attention sdpa \\
      --ac off --batch_sizes 4 --world_sizes 1,2 --parallel ddp,fsdp   # 1 GPU vs 2 (torchrun), DDP and FSDP2
  optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --world_sizes 2 --parallel fsdp \\
      --vary fsdp_reshard_after_forward=on,off --repeats 2 --cold   # a setting's two values in one command
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optimize_performance.py",
        description="Throughput sweep: each configuration trained for a few steps in its own process; step time, "
        "tokens/s, MFU, peak memory, compile time, loss and the speedup over BF16 + compile(default).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    full = lambda key: ",".join(DEFAULTS[key])  # noqa: E731
    grid = parser.add_argument_group("the grid (comma-separated subsets; defaults: the full grid)")
    grid.add_argument("--presets", help=f"from {', '.join(PRESETS)} (default {full('presets')})")
    grid.add_argument("--precisions", help=f"from {', '.join(PRECISIONS)} (default {full('precisions')})")
    grid.add_argument(
        "--fp8_lm_head",
        help="off,on: also convert the output projection; multiplies only the FP8 precisions (default: as each "
        "precision says: fp8-* off unless named +lm_head, fp8 its path's default, as in train_h100.py)",
    )
    grid.add_argument("--compile", help=f"from {', '.join(COMPILE_CHOICES)} (default {full('compile')})")
    grid.add_argument("--attention", help=f"from {', '.join(ATTENTION_BACKENDS)} (default {full('attention')})")
    grid.add_argument("--ac", help="activation checkpointing: off,on (default off,on)")
    grid.add_argument("--batch_sizes", help="e.g. 4,8, per GPU (default: each preset's own batch size)")
    grid.add_argument(
        "--world_sizes",
        help="processes (GPUs) per configuration, e.g. 1,2; above 1 the sweep launches them with torchrun (default 1)",
    )
    grid.add_argument(
        "--parallel",
        help=f"from {', '.join(PARALLEL_CHOICES)}: the --parallel mode of each world size above 1 (default "
        f"{full('parallel')})",
    )
    grid.add_argument(
        "--vary", action="append", default=[], metavar="SETTING=A,B",
        help="any other train_h100.py setting as a grid axis, e.g. --vary ddp_bucket_mb=25,100 or --vary "
        "fsdp_reshard_after_forward=on,off (a switch takes on,off); once per setting, every combination. Each value "
        "gets its own BF16 baseline, and each record names its values (field 'varied'): a lever and the setting it "
        "replaces in one command, taking turns with --repeats",
    )  # fmt: skip
    lora = parser.add_argument_group(
        "LoRA mode: BF16 vs FP8 base fine-tuned with adapters, profiled, with three predictions (lora.json, lora.md)"
    )
    lora.add_argument("--lora_ranks", help="e.g. 8,16,32: LoRA mode with these adapter ranks")
    lora.add_argument(
        "--lora_targets",
        help="e.g. attn,mlp,all (q+v for several layers in one configuration; default attn). The base is --init_from "
        "if given, else a freshly initialised model of each preset",
    )
    run = parser.add_argument_group("the run")
    run.add_argument("--steps", type=int, help=f"optimizer steps per configuration (default {DEFAULTS['steps']})")
    run.add_argument(
        "--timeout_s", type=float, help=f"per-configuration limit in seconds (default {DEFAULTS['timeout_s']:g})"
    )
    run.add_argument("--out_dir", help="default benchmarks/results/<date>-sweep-<gpu>")
    run.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['presets'][0]}, bf16 vs fp8 (the default FP8), compile auto (the trainer's default), sdpa, AC "
        f"off, batch {QUICK['batch_sizes'][0]}, {QUICK['steps']} steps, {QUICK['timeout_s']:g} s per config at most, "
        "then the Amdahl analysis; explicit grid flags still override",
    )
    run.add_argument(
        "--amdahl",
        action="store_true",
        help="after the sweep, for each preset/batch with an FP8 + compile configuration: where the time goes "
        "(profiled GEMM share X, FP8 GEMM speedup s, Amdahl prediction vs measured, cast cost in ms); on with --quick",
    )
    run.add_argument(
        "--repeats", type=positive_int, default=1,
        help="run each configuration N times, each in a fresh process, the configurations taking turns (A, B, A, B, "
        "...); its row is the median run, with the range of tokens/s beside it (default 1)",
    )  # fmt: skip
    run.add_argument(
        "--cold", action="store_true",
        help="give every run empty compile caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR), as on a machine's first "
        "run: compile times and first-run speeds are then a user's",
    )  # fmt: skip
    run.add_argument("--dry_run", action="store_true", help="print the planned configurations and exit")
    return parser


def parse_options(argv: Sequence[str] | None = None) -> SweepOptions:
    args, rest = build_parser().parse_known_args(argv)
    passthrough = argparse.ArgumentParser(
        prog="optimize_performance.py",
        usage="optimize_performance.py [sweep flags] [train_h100.py settings] (see --help)",
        allow_abbrev=False,
    )
    add_config_arguments(passthrough)
    train_args = passthrough.parse_args(rest)
    base = overrides_from_args(train_args)
    check_pass_through(base, lora=args.lora_ranks is not None)
    from_file = load_config_file(train_args.config) if train_args.config else {}
    check_pass_through(from_file, lora=args.lora_ranks is not None, source=f"--config {train_args.config}")

    lora_ranks = parse_positive_ints(args.lora_ranks, "--lora_ranks", "8,16") if args.lora_ranks else ()
    if args.lora_targets and not lora_ranks:
        raise ConfigError("--lora_targets sets LoRA mode's adapter targets: add --lora_ranks (e.g. 16).")
    lora_targets = tuple(t.replace("+", ",") for t in (args.lora_targets or "attn").split(",") if t)
    for targets in lora_targets:
        lora_target_list(targets)  # a ConfigError naming the bad target
    if lora_ranks:
        check_lora_mode(args)
    defaults = LORA_DEFAULTS if lora_ranks else QUICK if args.quick else DEFAULTS
    pick = lambda name, parse: parse(getattr(args, name)) if getattr(args, name) is not None else defaults[name]  # noqa: E731
    grid = Grid(
        presets=pick("presets", lambda s: parse_choices(s, tuple(PRESETS), "--presets")),
        precisions=pick("precisions", lambda s: parse_choices(s, PRECISIONS, "--precisions")),
        fp8_lm_head=pick("fp8_lm_head", lambda s: parse_on_off(s, "--fp8_lm_head")),
        compile=pick("compile", lambda s: parse_choices(s, COMPILE_CHOICES, "--compile")),
        attention=pick("attention", lambda s: parse_choices(s, ATTENTION_BACKENDS, "--attention")),
        ac=pick("ac", lambda s: parse_on_off(s, "--ac")),
        batch_sizes=pick("batch_sizes", parse_batch_sizes),
        world_sizes=pick("world_sizes", parse_world_sizes),
        parallel=pick("parallel", lambda s: parse_choices(s, PARALLEL_CHOICES, "--parallel")),
        variants=parse_variants(args.vary, base),
    )
    if args.parallel is not None and max(grid.world_sizes) == 1:
        raise ConfigError("--parallel sets the mode of world sizes above 1: add them, e.g. --world_sizes 1,2.")
    steps = args.steps if args.steps is not None else defaults["steps"]
    if steps <= WARMUP_STEPS_EXCLUDED:
        raise ConfigError(
            f"--steps must be more than {WARMUP_STEPS_EXCLUDED}: the first {WARMUP_STEPS_EXCLUDED} steps (compile, "
            "warm-up) are left out of the step-time median."
        )
    timeout_s = args.timeout_s if args.timeout_s is not None else defaults["timeout_s"]
    if not timeout_s > 0:  # NaN too: it would mean no limit
        raise ConfigError(f"--timeout_s must be a positive number of seconds, got {timeout_s:g}.")
    if lora_ranks and (args.repeats != 1 or args.cold):
        raise ConfigError("--repeats and --cold apply to the throughput sweep; LoRA mode measures each rank once.")
    return SweepOptions(
        grid=grid,
        steps=steps,
        timeout_s=timeout_s,
        out_dir=Path(args.out_dir) if args.out_dir else None,
        base_overrides=base,
        from_file=from_file,
        quick=args.quick,
        dry_run=args.dry_run,
        amdahl=args.amdahl or args.quick,
        lora_ranks=lora_ranks,
        lora_targets=lora_targets,
        repeats=args.repeats,
        cold=args.cold,
    )


def check_lora_mode(args: argparse.Namespace) -> None:
    """LoRA mode measures both bases of each configuration in one process, on one GPU, with one compile mode,
    attention and checkpointing setting."""
    if args.precisions or args.world_sizes or args.parallel or args.quick or args.amdahl or args.vary:
        raise ConfigError(
            "LoRA mode (--lora_ranks) measures a BF16 and an FP8 base together on one GPU, profiled; drop "
            "--precisions, --world_sizes, --parallel, --vary, --quick and --amdahl."
        )
    for flag in ("compile", "attention", "ac", "fp8_lm_head"):
        value = getattr(args, flag)
        if value is not None and "," in value:
            raise ConfigError(f"LoRA mode takes one --{flag} value per sweep, got {value!r}; run the sweep per value.")


def format_plan(plan: Sequence[Planned], options: SweepOptions, out_dir: Path) -> str:
    mode = " (--quick)" if options.quick else ""
    lines = [
        f"sweep plan{mode}: {len(plan)} configuration{'s' * (len(plan) != 1)}, {options.steps} steps each, "
        f"each in its own process with a {options.timeout_s:g} s limit"
        + (f", {options.repeats} times each (the median run reported)" if options.repeats > 1 else "")
        + (", every run with empty compile caches" if options.cold else "")
    ]
    width = len(str(len(plan)))
    for i, planned in enumerate(plan, 1):
        note = "  (baseline)" if planned.point.is_baseline else ""
        lines.append(f"  {i:>{width}}. {planned.point.label}{note}")
        if planned.point.world_size > 1:  # the launch, exactly as run_isolated makes it (the spec elided)
            command = sweep_run.launch_command(planned, Path("RECORD.json"))
            shown = ["SPEC" if part == json.dumps(planned.spec) else part for part in command]
            lines.append(f"  {' ' * width}  $ {shlex.join(shown)}")
    if options.from_file:
        lines.append(f"settings from the --config file for every configuration: {json.dumps(options.from_file)}")
    if options.base_overrides:
        lines.append(f"settings for every configuration: {json.dumps(options.base_overrides)}")
    if options.amdahl:
        targets = ", ".join(planned.point.label for planned in amdahl_targets(plan))
        lines.append(f"then where the time goes (--amdahl), in a process each: {targets}")
    lines.append(f"results: {out_dir}/sweep.{{json,csv,md,png}}")
    return "\n".join(lines)


class _Left:
    """What a stop signal leaves behind at this point of the sweep, said after the signal's own line (run_program)."""

    text = "Nothing was run."

    def __call__(self) -> str:
        return self.text


def _lora_main(options: SweepOptions, out_dir: Path, left: _Left) -> int:
    points = sweep_lora.lora_points(options)
    print(f"LoRA sweep plan: {len(points)} configurations, each a BF16 and an FP8 base, {options.steps} steps each:")
    for preset, batch, rank, targets in points:
        print(f"  {preset} batch {batch}, rank {rank}, adapters on {targets}")
    print(f"results: {out_dir}/{sweep_lora.LORA_JSON}, {sweep_lora.LORA_MD}")
    if options.dry_run:
        print("dry run: nothing was run.")
        return 0
    require_cuda("the LoRA sweep", "it times and profiles real steps, FP8 on sm_89+")
    out_dir.mkdir(parents=True, exist_ok=True)
    left.text = f"{out_dir}/{sweep_lora.LORA_JSON} holds the configurations that finished."
    with terminate_raises():
        records = sweep_lora.run_lora_sweep(options, out_dir, sweep_run.run_logged)
    print()
    print((out_dir / sweep_lora.LORA_MD).read_text())
    return 0 if len(records) >= 2 * len(points) else 1


def main(argv: Sequence[str] | None = None) -> int:
    left = _Left()
    return run_program(lambda: _main(argv, left), after_interrupt=left)


def _main(argv: Sequence[str] | None, left: _Left) -> int:
    options = parse_options(argv)
    plan = [] if options.lora_ranks else plan_sweep(options)  # LoRA mode plans its own (sweep/lora.py)
    gpu = environment()["gpu"]
    out_dir = check_output_path(options.out_dir or default_out_dir(gpu), "--out_dir", folder=True)
    if options.lora_ranks:
        return _lora_main(options, out_dir, left)
    if options.amdahl and not amdahl_targets(plan):
        raise ConfigError(
            "--amdahl analyses an FP8 configuration compiled in one process, and none is planned: add one "
            "(e.g. --precisions bf16,fp8 --compile auto)."
        )
    # An earlier sweep's results, added to: refused now if they cannot be (not a results file), not after the runs.
    check_results_file(out_dir / "sweep.json", "--out_dir's", fix="Move it away or choose another --out_dir.")
    print(format_plan(plan, options, out_dir), flush=True)
    if options.dry_run:
        print("dry run: nothing was run.")
        return 0
    if options.quick and gpu is None:
        print("note: --quick is sized for an H100/H200; without a GPU the FP8 row is skipped and 366m is slow.")
    say = lambda line: print(line, flush=True)  # noqa: E731
    # A scheduler's SIGTERM takes the Ctrl-C path: the running worker (in its own session) is stopped, not orphaned.
    with terminate_raises():
        sweep_run.prepare_all_data(plan, log=say)
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            records = sweep_run.run_sweep(plan, options, out_dir, log=say)
        except KeyboardInterrupt:
            if (out_dir / "sweep.json").exists():
                write_outputs(out_dir, plot=True)
                left.text = (
                    f"{out_dir}/sweep.{{json,csv,md,png}} hold the configurations that finished, and the finished "
                    "runs of any whose repeats were cut short."
                )
            else:
                left.text = f"No configuration finished; the logs are in {out_dir}/logs."
            raise
        report, _ = write_outputs(out_dir, plot=True)
        print()
        print(report)
        if options.amdahl:
            left.text = f"{out_dir}/sweep.{{json,csv,md,png}} hold every configuration; the Amdahl analysis stopped."
            _where_the_time_goes(plan, options, out_dir, say)
    print(f"wrote {out_dir}/sweep.json, sweep.csv, sweep.md, sweep.png (per-configuration logs in {out_dir}/logs)")
    if not any(r.get("status") == "ok" for r in records):
        print("nothing was measured: every configuration was skipped or failed (the reasons are in the table).")
        return 1
    return 1 if any(r.get("status") == "error" for r in records) else 0


def _where_the_time_goes(plan: Sequence[Planned], options: SweepOptions, out_dir: Path, say) -> None:
    """The Amdahl analysis of amdahl_targets(plan), each in a process of its own, written to amdahl.md."""
    rows = []
    for planned in amdahl_targets(plan):
        say(f"where the time goes: {planned.point.preset} batch {planned.point.batch_size} ...")
        rows.append(sweep_run.run_amdahl(planned, out_dir, options.timeout_s))
    analysis = format_amdahl(rows)
    (out_dir / "amdahl.md").write_text(analysis + "\n")
    print()
    print(analysis)
