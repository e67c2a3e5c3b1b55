"""Exploration: Triton SwiGLU FP8 producers vs inductor-compiled reference ops, 366m FFN shape."""

import json
import statistics
import sys

import torch

from cs336_basics.precision.fused import swiglu_reference as ref
from cs336_basics.precision.fused import swiglu_triton as tri
from cs336_basics.precision.fused.scaling import E4M3, E5M2, amax_to_scale
from cs336_basics.timing import time_calls_ms

M, F = int(sys.argv[1]), int(sys.argv[2])
g = torch.Generator("cuda").manual_seed(0)
dg, h1, h3 = (torch.randn(M, F, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
scale = amax_to_scale(ref.swiglu_amax(h1, h3), E4M3).reshape(1)
scales = amax_to_scale(ref.swiglu_grad_amax(dg, h1, h3), E5M2)


def dyn_fwd(ops):
    return lambda: ops.swiglu_cast(h1, h3, amax_to_scale(ops.swiglu_amax(h1, h3), E4M3), E4M3, False)


def del_fwd(ops):
    return lambda: ops.swiglu_cast(h1, h3, scale, E4M3, True)


def dyn_bwd(ops):
    return lambda: ops.swiglu_grad_cast(dg, h1, h3, amax_to_scale(ops.swiglu_grad_amax(dg, h1, h3), E5M2), E5M2, False)


def del_bwd(ops):
    return lambda: ops.swiglu_grad_cast(dg, h1, h3, scales, E5M2, True)


def cast_fwd(ops):
    return lambda: ops.swiglu_cast(h1, h3, scale, E4M3, False)


def cast_bwd(ops):
    return lambda: ops.swiglu_grad_cast(dg, h1, h3, scales, E5M2, False)


def bf16_fwd():
    return lambda: ref.swiglu(h1, h3)


def bf16_bwd():
    return lambda: ref.swiglu_grads(dg, h1, h3)


rows = []


def bench(name, f):
    for _ in range(3):
        f()
    ms = statistics.median(time_calls_ms(f, 20))
    rows.append({"op": name, "ms": ms, "M": M, "F": F})
    print(f"{name:34s} {ms * 1e3:8.1f} us", flush=True)


bench("bf16_fwd", torch.compile(bf16_fwd()))
bench("bf16_bwd", torch.compile(bf16_bwd()))
kinds = (
    ("dyn_fwd", dyn_fwd),
    ("del_fwd", del_fwd),
    ("cast_fwd", cast_fwd),
    ("dyn_bwd", dyn_bwd),
    ("del_bwd", del_bwd),
    ("cast_bwd", cast_bwd),
)
for k, mk in kinds:
    bench(f"{k}_inductor", torch.compile(mk(ref)))
for bm, bf, w in [(128, 64, 8), (64, 64, 4), (32, 128, 4), (64, 128, 4), (128, 128, 8), (64, 256, 8)]:
    tri._BLOCK_M, tri._BLOCK_F, tri._WARPS = bm, bf, w
    torch._dynamo.reset()
    for k, mk in kinds:
        bench(f"{k}_triton_{bm}x{bf}w{w}", torch.compile(mk(tri)))
with open(sys.argv[3], "w") as out:
    json.dump(rows, out, indent=1)
