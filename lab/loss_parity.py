"""Loss parity: does an FP8 variant learn like BF16? The same run (config, seed, data order, steps) in each precision,
one run each; the validation loss of every variant at every evaluation is compared with BF16's at that step.

python -m lab.loss_parity --out_dir DIR [--variants bf16,fp8-fused-dynamic,fp8-fused-dynamic+lm_head]
    [--tolerance 0.005] [--nproc_per_node 2] [--seed_spread 1,2]
    [any train_h100.py setting, e.g. --preset 366m --max_steps 400 --eval_every 100 --eval_batches 16
     --train_data train.txt --val_data val.txt]

Each variant trains in DIR/<variant> (a normal run folder: metrics, plot, checkpoint), with --nproc_per_node above 1
as that many processes under torchrun (one per GPU; --parallel auto: DDP where a replica fits). DIR/parity.json holds
one results-schema record per variant with its validation curve, its largest relative gap to BF16 and whether every
gap is within the tolerance; DIR/parity.png plots the curves. Exit code 0 when every variant is within the tolerance at
every evaluation, 1 when one is not (or a run failed), 2 for bad settings.

--seed_spread trains BF16 again with other seeds (other initial weights and batch order), as variants named
bf16-seed<N>: how far BF16 parts from itself at each evaluation, the scale to read FP8's gaps against. They are
reported, not judged; each FP8 variant's record says whether every gap of its was within the largest spread gap at
that evaluation (`within_seed_spread`).
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cs336_basics.cli import add_config_arguments, overrides_from_args, positive_int
from cs336_basics.config import RunConfig, TrainConfig
from cs336_basics.config_layers import build_config
from cs336_basics.errors import ConfigError, report_error
from cs336_basics.measure.results import write_results
from cs336_basics.sweep.plan import PRECISIONS, WITH_LM_HEAD, parse_choices, parse_positive_ints, precision_settings
from cs336_basics.sweep.run import torchrun_command
from cs336_basics.training.metrics import read_metrics

BASELINE = "bf16"
# Settings each variant sets itself; as pass-through flags they would be overridden, so they are refused.
SET_PER_VARIANT = {("fp8", "use_fp8"), ("fp8", "fp8_path"), ("fp8", "fp8_scaling"), ("fp8", "fp8_recipe"),
                   ("fp8", "fp8_lm_head"), ("train", "dtype"), ("train", "out_dir"), ("train", "resume")}  # fmt: skip


def variant_overrides(base: dict[str, Any], precision: str, run_dir: Path, **train: Any) -> dict[str, Any]:
    """`base` in `precision`, trained in `run_dir`, with any more `train` settings (a seed-spread run's seed)."""
    values = copy.deepcopy(base)
    for section, settings in precision_settings(precision).items():
        values.setdefault(section, {}).update(settings)
    values.setdefault("train", {}).update(out_dir=str(run_dir), overwrite=True, resume=False, **train)
    return values


SPREAD_PREFIX = f"{BASELINE}-seed"  # BF16 again with another seed: bf16-seed1, ...


def val_curve(run_dir: Path) -> list[tuple[int, float]]:
    return [
        (r["step"], r["val_loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if r.get("val_loss") is not None
    ]


def compare(
    curves: dict[str, list[tuple[int, float]]], tolerance: float, spread: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    """Per variant: the relative gap to BF16 at each evaluation both have, the largest, and whether all are within.
    With `spread` (BF16 runs of other seeds, among the curves): also whether each gap of every other variant is within
    the largest spread gap at its evaluation."""
    baseline = dict(curves[BASELINE])
    verdicts = {}
    for variant, curve in curves.items():
        gaps = [(step, (loss - baseline[step]) / baseline[step]) for step, loss in curve if step in baseline]
        if len(gaps) != len(baseline) or not gaps:
            raise ValueError(f"{variant} was evaluated at steps {[s for s, _ in curve]}, BF16 at {sorted(baseline)}")
        worst = max(abs(gap) for _, gap in gaps)
        verdicts[variant] = {"val_rel_gap": gaps, "max_abs_rel_gap": worst, "within_tolerance": worst <= tolerance}
    if spread:
        spread_gaps = [dict(verdicts[s]["val_rel_gap"]) for s in spread]
        widest = {step: max(abs(gaps[step]) for gaps in spread_gaps) for step in baseline}
        for variant, verdict in verdicts.items():
            if variant not in spread:
                verdict["within_seed_spread"] = all(abs(gap) <= widest[step] for step, gap in verdict["val_rel_gap"])
    return verdicts


def passed(verdicts: dict[str, dict[str, Any]], spread: tuple[str, ...]) -> bool:
    """Every variant but the seed-spread runs (reported, not judged) within the tolerance at every evaluation."""
    return all(v["within_tolerance"] for variant, v in verdicts.items() if variant not in spread)


def plot(curves: dict[str, list[tuple[int, float]]], runs: dict[str, Path], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant, run_dir in runs.items():
        train = [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if r.get("loss") is not None]
        ax_train.plot(*zip(*train, strict=True), label=variant, alpha=0.8)
        ax_val.plot(*zip(*curves[variant], strict=True), "o-", label=variant, alpha=0.8)
    for ax, what in ((ax_train, "train loss"), (ax_val, "validation loss")):
        ax.set_xlabel("step")
        ax.set_ylabel(f"{what} (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def run_variant(overrides: dict[str, Any]) -> int:
    """Train one variant in this process (the parent starts one process per variant)."""
    from cs336_basics.run import run_training

    run_training(build_config(overrides))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab.loss_parity", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument(
        "--variants", default=f"{BASELINE},fp8-fused-dynamic", help=f"from {', '.join(PRECISIONS + WITH_LM_HEAD)}"
    )
    parser.add_argument("--tolerance", type=float, default=0.005, help="largest relative gap to BF16 allowed")
    parser.add_argument(
        "--nproc_per_node", type=positive_int, default=1,
        help="processes (GPUs) each variant trains on; above 1 under torchrun (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--seed_spread", help="also train BF16 with these seeds, comma-separated (e.g. 1,2): how far BF16 parts from "
        "itself, reported beside FP8's gaps",
    )  # fmt: skip
    parser.add_argument("--run_variant", help=argparse.SUPPRESS)  # internal: one variant's overrides as JSON
    add_config_arguments(parser)
    return parser


def plan_variants(args: argparse.Namespace) -> tuple[Path, dict[str, dict[str, Any]], dict[str, RunConfig]]:
    """(out_dir, each variant's overrides, each variant's config), BF16 first if --variants left it out. Every config
    is built, and so checked, before anything runs; a ConfigError for bad settings."""
    variants = parse_choices(args.variants, PRECISIONS + WITH_LM_HEAD, "--variants")
    if BASELINE not in variants:
        variants = (BASELINE, *variants)
    base = overrides_from_args(args)
    if "out_dir" not in base.get("train", {}):
        raise ConfigError("--out_dir is required: the folder that will hold each variant's run and the results.")
    out_dir = Path(base["train"].pop("out_dir"))
    refused = [f"--{name}" for section, name in SET_PER_VARIANT if name in base.get(section, {})]
    if refused:
        raise ConfigError(f"{', '.join(refused)}: each variant sets this itself (--variants).")
    planned = {v: variant_overrides(base, v, out_dir / v) for v in variants}
    seed = base.get("train", {}).get("seed", TrainConfig.seed)
    for other in parse_positive_ints(args.seed_spread, "--seed_spread", "1,2") if args.seed_spread else ():
        if other == seed:
            raise ConfigError(f"--seed_spread {other}: that is the compared runs' own seed (--seed); name others.")
        name = f"{SPREAD_PREFIX}{other}"
        planned[name] = variant_overrides(base, BASELINE, out_dir / name, seed=other)
    configs = {v: build_config(o) for v, o in planned.items()}
    return out_dir, planned, configs


def run_variants(planned: dict[str, dict[str, Any]], nproc: int = 1) -> list[str]:
    """Train each variant in a process of its own (or `nproc` under torchrun), one after the other; the variants whose
    run failed."""
    failed = []
    for variant, overrides in planned.items():
        print(f"== {variant}", flush=True)
        command = [sys.executable, "-m", "lab.loss_parity", "--run_variant", json.dumps(overrides)]
        if nproc > 1:
            command = torchrun_command(command, nproc)
        if subprocess.run(command).returncode != 0:
            failed.append(variant)
    return failed


def print_verdicts(
    curves: dict[str, list[tuple[int, float]]],
    verdicts: dict[str, dict[str, Any]],
    tolerance: float,
    spread: tuple[str, ...] = (),
) -> None:
    """One line per variant: its final validation loss, its largest relative gap to BF16 and whether it is within
    (and within the seed spread, where there is one; a spread run's line says it is one)."""
    print(f"{'variant':24s} {'final val':>10s} {'max |gap|':>10s}  within {tolerance:.2%}"
          + ("  within the seed spread" if spread else ""))  # fmt: skip
    for variant, v in verdicts.items():
        line = f"{variant:24s} {curves[variant][-1][1]:10.4f} {v['max_abs_rel_gap']:10.4%}  {v['within_tolerance']}"
        if spread:
            line += "  (a spread run)" if variant in spread else f"  {v['within_seed_spread']}"
        print(line)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run_variant:
        return run_variant(json.loads(args.run_variant))
    try:
        out_dir, planned, configs = plan_variants(args)
    except ConfigError as exc:
        return report_error(exc)

    failed = run_variants(planned, args.nproc_per_node)
    if failed:
        print(f"loss parity: {', '.join(failed)} failed; see the output above.", file=sys.stderr)
        return 1

    runs = {v: Path(config.train.out_dir) for v, config in configs.items()}
    curves = {v: val_curve(run_dir) for v, run_dir in runs.items()}
    if not curves[BASELINE]:
        return report_error(ConfigError("no validation loss was recorded: set --eval_every (and --eval_batches)."))
    spread = tuple(name for name in configs if name.startswith(SPREAD_PREFIX))
    verdicts = compare(curves, args.tolerance, spread)
    records = []
    for variant, run_dir in runs.items():
        record = json.loads((run_dir / "result.json").read_text())
        records.append({**record, "variant": variant, "val_curve": curves[variant], **verdicts[variant]})
    write_results(out_dir / "parity.json", records, tolerance=args.tolerance)
    c = configs[BASELINE]
    title = f"{c.preset}: {c.train.max_steps} steps, batch {c.train.batch_size} x {c.model.context_length}"
    if args.nproc_per_node > 1:
        title += f" per GPU, {args.nproc_per_node} GPUs"
    plot(curves, runs, out_dir / "parity.png", title)

    print_verdicts(curves, verdicts, args.tolerance, spread)
    print(f"wrote {out_dir / 'parity.json'} and {out_dir / 'parity.png'}")
    return 0 if passed(verdicts, spread) else 1


if __name__ == "__main__":
    sys.exit(main())
