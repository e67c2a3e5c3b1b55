"""FSDP2 on one rank with K transformer blocks per FSDP2 unit (fully_shard over a list of K blocks; the package
shards one block per unit), 1.3b, 4 x 2048, 30 steps as measure.py trains them, then 2 profiled steps:

    torchrun --standalone --nproc_per_node 1 blocks_per_unit.py LABEL PRECISION K

An experiment, not a setting of the package: it replaces parallel.wrap.parallelize for FSDP2. Item 4 of README.md.
"""

import sys
import tempfile

import numpy as np

from cs336_basics.benchmark.amdahl.measure import gpu_timeline, profiled_steps
from cs336_basics.benchmark.sweep.plan import SweepPoint
from cs336_basics.build import build, plan
from cs336_basics.config import build_config
from cs336_basics.parallel import wrap
from cs336_basics.parallel.world import process_group
from cs336_basics.training import trainer as trainer_module
from cs336_basics.training.trainer import Trainer

label, precision, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
_orig = wrap.parallelize


def parallelize(model, compiled, p, device):
    if p.mode != wrap.FSDP or k == 1:
        return _orig(model, compiled, p, device)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (p.world.world_size,))
    dtype = next(model.parameters()).dtype
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    blocks = list(model.layers)
    groups = [blocks[i : i + k] for i in range(0, len(blocks), k)]
    for gi, g in enumerate(groups):
        fully_shard(g, mesh=mesh, mp_policy=policy, reshard_after_forward=gi < len(groups) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


wrap.parallelize = parallelize
trainer_module.parallelize = parallelize

point = SweepPoint("1.3b", 4, precision, False, "default", "sdpa", False)
o = point.overrides({"data": {"train_data": "scratch/tok/train.npy", "val_data": "scratch/tok/val.npy"}}, steps=30)
o["train"].update(parallel="fsdp", out_dir=tempfile.mkdtemp())
config = build_config(o)
train, val = (np.load(f"scratch/tok/{s}.npy", mmap_mode="r") for s in ("train", "val"))
with process_group("cuda", 600) as world:
    built = build(plan(config))
    tr = Trainer(built.model, built.config, train, val, built.device, log=lambda *a: None, parallel=built.parallel)
    r = tr.train()
    step = 1e3 * 4 * 2048 / r.tokens_per_sec
    tl = gpu_timeline(profiled_steps(tr, 2), 2)
    print(
        f"UNITS {label}: k={k} {r.tokens_per_sec:,.0f} tok/s step {step:.2f} ms busy {tl.busy_ms:.2f} "
        f"idle {tl.idle_ms(step):.2f} peak {r.peak_mem_gib:.2f}",
        flush=True,
    )
