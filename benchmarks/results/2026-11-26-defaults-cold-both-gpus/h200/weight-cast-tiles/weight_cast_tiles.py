"""GPU time of the weight cast kernel (cast_triton.py, WEIGHT_CAST_TILE) at every weight shape of 366m and 1.3b, for
several tiles: the command behind this folder's weight-cast-tiles.json (GPU; run from the checkout root).

    python3 benchmarks/results/2026-11-26-defaults-cold-both-gpus/h200/weight-cast-tiles/weight_cast_tiles.py RAW.json

Launched directly with delayed scaling's settings (record on), 20 launches captured in a CUDA graph and replayed
(timing.graph_kernel_ms), as the tile-sizes study did."""

from __future__ import annotations

import itertools
import json
import sys

import torch

from cs336_basics.kernels.cast_triton import _cast_transposed_kernel
from cs336_basics.kernels.tiles import WEIGHT_CAST_TILE
from cs336_basics.measure.timing import graph_kernel_ms
from cs336_basics.precision.fused.scaling import E4M3, fp8_max

# (out_features, in_features) of each weight, and how many of each per step.
WEIGHTS = {
    "366m": {(896, 896): 96, (3584, 896): 48, (896, 3584): 24, (32000, 896): 1},
    "1.3b": {(2048, 2048): 88, (5632, 2048): 44, (2048, 5632): 22, (32000, 2048): 1},
}
TILES = [(bm, bf, w) for bm, bf, w in itertools.product((32, 64, 128), (64, 128, 256), (4, 8)) if bm * bf <= 16384]


def cast_launch(m: int, f: int, bm: int, bf: int, warps: int):
    x = torch.randn(m, f, device="cuda", dtype=torch.bfloat16)
    out, out_t = torch.empty(m, f, device="cuda", dtype=E4M3), torch.empty(f, m, device="cuda", dtype=E4M3)
    scale = torch.ones(1, device="cuda")
    amax = torch.zeros(1024, device="cuda")
    saturated = torch.zeros(1024, device="cuda", dtype=torch.int32)
    grid = (-(-m // bm), -(-f // bf))
    return lambda: _cast_transposed_kernel[grid](
        x, out, out_t, scale, amax, saturated, m, f, amax.numel(), LIMIT=fp8_max(E4M3), RECORD=True,
        BLOCK_M=bm, BLOCK_F=bf, num_warps=warps,
    )  # fmt: skip


def main(out_path: str) -> None:
    rows = []
    for preset, weights in WEIGHTS.items():
        for ((m, f), count), (bm, bf, warps) in itertools.product(weights.items(), TILES):
            ms = graph_kernel_ms(cast_launch(m, f, bm, bf, warps))
            rows.append(dict(preset=preset, kernel="cast_transposed", m=m, f=f, per_step=count, block_m=bm,
                             block_f=bf, warps=warps, ms=ms, tb_per_s=m * f * 4 / 1e9 / ms))  # fmt: skip
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, command=" ".join(sys.argv))
    with open(out_path, "w") as fh:
        json.dump(dict(meta, rows=rows), fh, indent=1)
    now = (WEIGHT_CAST_TILE.block_m, WEIGHT_CAST_TILE.block_f, WEIGHT_CAST_TILE.warps)
    print("| preset | tile | ms per step (all weights) |")
    print("|---|---|---|")
    for preset in WEIGHTS:
        per_tile = {}
        for r in rows:
            if r["preset"] == preset:
                key = (r["block_m"], r["block_f"], r["warps"])
                per_tile[key] = per_tile.get(key, 0.0) + r["ms"] * r["per_step"]
        for key in sorted(per_tile, key=per_tile.get)[:5] + [now]:
            print(f"| {preset} | {key}{' (now)' if key == now else ''} | {per_tile[key]:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1])
