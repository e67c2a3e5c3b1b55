"""The committed plot: this folder's rank and target rows (default compile, head + fast accumulation), one figure.

From the repository root, `uv run python benchmarks/results/2026-11-23-lora-1.3b-h200/plot.py` rewrites
lora-ranks-targets.png.
"""

import json
from pathlib import Path

from cs336_basics.sweep.lora_analysis import write_lora_plot

HERE = Path(__file__).parent
FOLDERS = ("idle-default", "ranks-8-64", "ranks-32-128", "targets")


def main() -> None:
    records = [r for d in FOLDERS for r in json.loads((HERE / d / "lora.json").read_text())["runs"]]
    write_lora_plot(HERE / "lora-ranks-targets.png", records)


if __name__ == "__main__":
    main()
