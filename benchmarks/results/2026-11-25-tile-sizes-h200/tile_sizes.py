"""GPU time of the fused path's tiled FP8 producer kernels (SwiGLU forward and backward, the FP8 transpose) at the
366m and 1.3b shapes, for several tile sizes and warp counts.

    python3 tile_sizes.py run RAW.json                  # GPU: the measurements, as the device wrote them (raw/)
    python3 tile_sizes.py schema OUT.json RAW.json ...  # CPU: the results schema's records from raw files

Each kernel is launched directly (not through its torch op) with delayed scaling's settings (cast, transposed copy,
amax and saturation recorded). 20 back-to-back launches are captured in a CUDA graph, so that the host's launch cost
(some microseconds per Triton launch, more than a small kernel takes) is not timed; the graph's replays are timed
with CUDA events, median of 15 rounds."""

from __future__ import annotations

import itertools
import json
import sys

import torch

from cs336_basics.kernels.swiglu_triton import _swiglu_grad_kernel, _swiglu_kernel
from cs336_basics.kernels.transpose_triton import _transpose_kernel
from cs336_basics.measure.timing import graph_kernel_ms
from cs336_basics.precision.fused.scaling import E4M3, E5M2, fp8_max

SWIGLU_SHAPES = {"366m": (16384, 3584), "1.3b": (8192, 5632)}
TRANSPOSE_SHAPES = {"366m": [(16384, 896), (16384, 3584)], "1.3b": [(8192, 2048), (8192, 5632)]}
TILES = [(bm, bf, w) for bm, bf, w in itertools.product((32, 64, 128, 256), (32, 64, 128), (4, 8)) if bm * bf <= 16384]


def swiglu_launches(m: int, f: int, bm: int, bf: int, warps: int):
    dev = "cuda"
    h1, h3, dg = (torch.randn(m, f, device=dev, dtype=torch.bfloat16) for _ in range(3))
    grid = (triton_cdiv(m, bm), triton_cdiv(f, bf))
    slots = grid[0] * grid[1]
    amax = torch.empty(2, slots, device=dev)
    sat = torch.zeros(2, slots, device=dev, dtype=torch.int32)
    scale = torch.ones(2, device=dev)
    fwd = [torch.empty(m, f, device=dev, dtype=E4M3), torch.empty(f, m, device=dev, dtype=E4M3)]
    bwd = [torch.empty(*s, device=dev, dtype=E5M2) for s in ((m, f), (f, m), (m, f), (f, m))]
    common = dict(CAST=True, AMAX=True, TRANSPOSE=True, BLOCK_M=bm, BLOCK_F=bf, num_warps=warps)

    def forward():
        _swiglu_kernel[grid](h1, h3, *fwd, scale, amax, sat, m, f, LIMIT=fp8_max(E4M3), **common)

    def backward():
        _swiglu_grad_kernel[grid](dg, h1, h3, *bwd, scale, amax, sat, m, f, LIMIT=fp8_max(E5M2), **common)

    return forward, backward


def transpose_launch(m: int, f: int, bm: int, bf: int, warps: int):
    x = torch.randn(m, f, device="cuda").to(E4M3)
    out = torch.empty(f, m, device="cuda", dtype=E4M3)
    grid = (triton_cdiv(m, bm), triton_cdiv(f, bf))
    return lambda: _transpose_kernel[grid](x, out, m, f, BLOCK_M=bm, BLOCK_F=bf, num_warps=warps)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def run(out_path: str) -> None:
    rows = []
    for (preset, (m, f)), (bm, bf, warps) in itertools.product(SWIGLU_SHAPES.items(), TILES):
        forward, backward = swiglu_launches(m, f, bm, bf, warps)
        for kernel, fn, gb in (("swiglu", forward, m * f * 6 / 1e9), ("swiglu_grad", backward, m * f * 10 / 1e9)):
            ms = graph_kernel_ms(fn)
            rows.append(dict(preset=preset, kernel=kernel, m=m, f=f, block_m=bm, block_f=bf, warps=warps, ms=ms,
                             tb_per_s=gb / ms))  # fmt: skip
    for preset, shapes in TRANSPOSE_SHAPES.items():
        for (m, f), (bm, bf, warps) in itertools.product(shapes, TILES):
            ms = graph_kernel_ms(transpose_launch(m, f, bm, bf, warps))
            rows.append(dict(preset=preset, kernel="transpose", m=m, f=f, block_m=bm, block_f=bf, warps=warps, ms=ms,
                             tb_per_s=m * f * 2 / 1e9 / ms))  # fmt: skip
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, command=" ".join(sys.argv))
    with open(out_path, "w") as fh:
        json.dump(dict(meta, rows=rows), fh, indent=1)
    print("| preset | kernel | M x F | now (128x64, 8 warps) ms | best tile | best ms | best TB/s |")
    print("|---|---|---|---|---|---|---|")
    shape = lambda r: (r["preset"], r["kernel"], r["m"], r["f"])  # noqa: E731
    for key, group in itertools.groupby(sorted(rows, key=shape), key=shape):
        group = list(group)
        now = next(r for r in group if (r["block_m"], r["block_f"], r["warps"]) == (128, 64, 8))
        best = min(group, key=lambda r: r["ms"])
        tile = f"{best['block_m']}x{best['block_f']}, {best['warps']} warps"
        print(f"| {key[0]} | {key[1]} | {key[2]}x{key[3]} | {now['ms']:.4f} | {tile} | {best['ms']:.4f} | "
              f"{best['tb_per_s']:.2f} |")  # fmt: skip


def schema(out_path: str, raw_paths: list[str]) -> None:
    """One results file (the shared schema: a record per kernel, shape and tile) from the raw files of `run`."""
    from cs336_basics.config_layers import build_config
    from cs336_basics.measure.results import run_record, write_results_from_raw

    fp8 = {"use_fp8": True, "fp8_path": "fused", "fp8_scaling": "delayed", "fp8_lm_head": True}

    def record(raw: dict, path: str, row: dict) -> dict:
        config = build_config({"preset": row["preset"], "fp8": fp8})
        return run_record(config, compile=False, attention=None, gpu=raw["gpu"], torch=raw["torch"],
                          measured=f"one {row['kernel']} kernel launch, GPU time", **row)  # fmt: skip

    write_results_from_raw(out_path, raw_paths, "tile_sizes.py", record)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        schema(sys.argv[2], sys.argv[3:])
