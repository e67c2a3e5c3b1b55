"""train_h100.py with the BF16 base's joint q/k/v and w1/w3 switched off (a measurement of the joins alone)."""

import runpy
import sys

import cs336_basics.lora.apply as apply

joined = apply._group_layers
apply._group_layers = lambda model, fp8, report: joined(model, fp8, report) if fp8 is not None else None
sys.argv = ["train_h100.py", *sys.argv[1:]]
runpy.run_path("train_h100.py", run_name="__main__")
