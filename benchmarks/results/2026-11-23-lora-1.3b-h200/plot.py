"""The committed plot: this folder's rank and target rows (default compile, head + fast accumulation), one figure."""

import json
from pathlib import Path

from cs336_basics.benchmark.lora_analysis import write_lora_plot

here = Path(__file__).parent
records = [
    r
    for d in ("idle-default", "ranks-8-64", "ranks-32-128", "targets")
    for r in json.loads((here / d / "lora.json").read_text())["runs"]
]
write_lora_plot(here / "lora-ranks-targets.png", records)
