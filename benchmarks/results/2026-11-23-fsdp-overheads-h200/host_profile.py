"""Where the host's time goes in a 1.3b step (4 x 2048), one process plain or one rank of FSDP2 (no communication):

    [torchrun --standalone --nproc_per_node 1] host_profile.py LABEL PRECISION MODE     (MODE: plain, fsdp)

trains 8 steps, then times 5 steps as the host issues them (no synchronisation) and with the GPU's finish, then runs
3 more under cProfile. Writes $OUT/LABEL.txt (the issue and wall times per step, then the profile by own time and by
cumulative time). Ran as the third device command of this folder (README, item 3).
"""

import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

import numpy as np
import torch

from cs336_basics.benchmark.sweep.plan import SweepPoint
from cs336_basics.build import build, plan
from cs336_basics.config import build_config
from cs336_basics.parallel.world import process_group
from cs336_basics.training.trainer import Trainer

label, precision, mode = sys.argv[1:4]
out = os.environ["OUT"]
point = SweepPoint("1.3b", 4, precision, False, "default", "sdpa", False)
o = point.overrides({"data": {"train_data": "scratch/tok/train.npy", "val_data": "scratch/tok/val.npy"}}, steps=8)
o["train"].update(parallel="fsdp" if mode == "fsdp" else "auto", out_dir=tempfile.mkdtemp())
config = build_config(o)
train, val = (np.load(f"scratch/tok/{s}.npy", mmap_mode="r") for s in ("train", "val"))
with process_group("cuda", 600) as world:
    built = build(plan(config))
    tr = Trainer(built.model, built.config, train, val, built.device, log=lambda *a: None, parallel=built.parallel)
    tr.train()
    torch.cuda.synchronize()
    # Host time per step when the host runs ahead freely: time 5 steps' issue on the host, then sync.
    t0 = time.perf_counter()
    for _ in range(5):
        tr.train_step()
    host = (time.perf_counter() - t0) / 5
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 5
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3):
        tr.train_step()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(60)
    times = f"host issue {host * 1e3:.1f} ms/step, wall {wall * 1e3:.1f} ms/step"
    with open(f"{out}/{label}.txt", "w") as f:
        f.write(times + "\n" + s.getvalue())
    print(f"CPROF {label}: {times}", flush=True)
