"""Results-schema JSON from this folder's logs, where the device wrote no JSON (CPU, after the GPU runs):

    uv run python benchmarks/results/2026-11-26-optimizer-vectors/from_logs.py

- h100/optimizer/tune.json: tune_optimizer.py's printed timings (tune-*.log), one record per kernel, block, warps
  and access width;
- h100/cold-*-cut/runs-from-logs.json: every finished run of the two cut first-run commands, from its per-run log's
  `done:` line. Their sweep.json (gpt2-small's) or none (1.3b's) held only configurations whose repeats all finished.

Each run's settings are the ones its summary's "auto-selected" line names (FP8: the fused path, FP8 head, delayed
scaling, CUDA graphs; BF16: compile default; both compiled by block)."""

from __future__ import annotations

import re
from pathlib import Path

from cs336_basics.config_layers import build_config
from cs336_basics.files.atomic import write_json_atomic
from cs336_basics.measure.results import run_record

HERE = Path(__file__).parent
HEADER = dict(gpu="NVIDIA H100 80GB HBM3", torch="2.11.0+cu130", torchao="0.18.0")
FP8 = {"use_fp8": True, "fp8_path": "fused", "fp8_lm_head": True, "fp8_shape_filter": False, "fp8_scaling": "delayed"}
DONE = re.compile(
    r"^done: (?P<steps>\d+) steps, [\d,]+ tokens, loss (?P<loss>[\d.]+), val loss n/a, (?P<tok>[\d,]+) tokens/s, "
    r"MFU (?P<mfu>[\d.]+)%, peak memory (?P<peak>[\d.]+) GiB, compile (?P<compile>[\d.]+) s$",
    re.MULTILINE,
)
TUNE = re.compile(
    r"^(?P<kernel>adamw|norm) block (?P<block>\d+) warps (?P<warps>\d+) aligned (?P<aligned>True|False): "
    r"(?P<ms>[\d.]+) ms",
    re.MULTILINE,
)


def run_config(preset: str, fp8: bool):
    mode = "reduce-overhead" if fp8 else "default"
    train = {"compile_model": True, "compile_mode": mode, "compile_scope": "blocks", "dtype": "bfloat16"}
    return build_config({"preset": preset, "train": train, "fp8": FP8 if fp8 else {"use_fp8": False}})


def cut_runs(folder: Path, preset: str) -> None:
    runs = []
    for log in sorted((folder / "logs").glob("*.log")):
        done = DONE.search(log.read_text())
        if done is None:  # the run the time limit stopped
            continue
        fp8 = "_fp8_" in log.name
        measured = dict(
            tokens_per_sec=float(done["tok"].replace(",", "")), mfu=float(done["mfu"]) / 100,
            peak_mem_gib=float(done["peak"]), compile_s=float(done["compile"]), loss=float(done["loss"]),
            steps=int(done["steps"]),
        )  # fmt: skip
        runs.append(run_record(run_config(preset, fp8), cold=True, log=f"logs/{log.name}", **measured))
    command = (
        f"optimize_performance.py --presets {preset} --precisions bf16,fp8 --compile auto --attention sdpa --ac off "
        "--steps 20 --repeats 3 --cold … (cut by the device command's time limit; each record from its run's log)"
    )
    write_json_atomic(folder / "runs-from-logs.json", {**HEADER, "command": command, "runs": runs})


def tuning() -> None:
    runs = []
    for log in sorted((HERE / "h100" / "optimizer").glob("tune-*.log")):
        preset = log.stem.removeprefix("tune-")
        config = build_config({"preset": preset, "train": {"dtype": "bfloat16"}, "fp8": {"use_fp8": False}})
        for m in TUNE.finditer(log.read_text()):
            kernel = "_adamw_kernel" if m["kernel"] == "adamw" else "_sum_of_squares_kernel"
            runs.append(
                run_record(
                    config, compile=False, attention=None, kernel=kernel, block_size=int(m["block"]),
                    warps=int(m["warps"]), vector_access=m["aligned"] == "True", kernel_ms=float(m["ms"]),
                    measured="one kernel launch over the preset's parameters, GPU time (median of 20)",
                )
            )  # fmt: skip
    command = "python3 tune_optimizer.py PRESET (the script in h100/optimizer/, tidied for lint), for 1.3b and 366m"
    write_json_atomic(HERE / "h100" / "optimizer" / "tune.json", {**HEADER, "command": command, "runs": runs})


if __name__ == "__main__":
    cut_runs(HERE / "h100" / "cold-gpt2-small-cut", "gpt2-small")
    cut_runs(HERE / "h100" / "cold-1.3b-cut", "1.3b")
    tuning()
