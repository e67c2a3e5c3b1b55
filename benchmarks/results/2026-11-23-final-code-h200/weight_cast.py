"""The ceiling of casting weights in the optimizer (issue #10, lever 3): the GPU time per step of the weight casts the
fused FP8 path does in forward (every linear's weight cast to E4M3, plus its transposed FP8 copy), compiled.

Usage (from the repository root, on a GPU): python3 weight_cast.py PRESET OUT.json. Wall time per call is reported
too, but it is host-bound (two launches per weight); the kernel time from the profiler is the measurement.
"""

import json
import statistics
import sys

import torch
from torch import nn

from cs336_basics.config_layers import build_config
from cs336_basics.measure.timing import time_calls_ms
from cs336_basics.model import TransformerLM
from cs336_basics.precision.fused.scaling import E4M3, E5M2, WEIGHT, SiteScaling


def main(preset: str, out: str) -> None:
    config = build_config({"preset": preset})
    with torch.device("cuda"):
        model = TransformerLM(config.model).to(torch.bfloat16)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    n_params = sum(m.weight.numel() for m in linears)
    rows = []
    for scaling in ("dynamic", "delayed"):
        delayed, cuda = scaling == "delayed", torch.device("cuda")
        sites = [SiteScaling((E4M3, E4M3, E5M2), False, delayed, cuda, weight_rows=m.out_features) for m in linears]
        weights = [m.weight for m in linears]

        @torch.no_grad()
        def cast_all(weights=weights, sites=sites):
            outs = []
            for w, site in zip(weights, sites, strict=True):
                w_fp8, inv = site.cast(w, WEIGHT, True)
                outs.append((w_fp8, site.transposed(w_fp8), inv))
            return outs

        fn = torch.compile(cast_all, fullgraph=True)
        wall_ms = statistics.median(time_calls_ms(fn, 20, warmup=3))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernel_ms = sum(e.time_range.end - e.time_range.start for e in kernels) / 1e3
        rows.append({"preset": preset, "scaling": scaling, "kernel_ms_per_step": kernel_ms, "kernels": len(kernels),
                     "wall_ms_per_call": wall_ms, "linears": len(linears), "params": n_params})  # fmt: skip
        print(f"{preset} {scaling}: {len(linears)} weights, {n_params / 1e6:.0f}M params: kernels {kernel_ms:.3f} ms "
              f"({len(kernels)}), wall {wall_ms:.3f} ms")  # fmt: skip
    with open(out, "a") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
