"""Where the 2-D RoPE gradient kernel's time goes (H200, raw/3-variants-h200.json): a throwaway experiment, kept as
the script that made that file (run from the repository root as `python3 rope_variants.py OUT.json`).

For each shape and tile, GPU time per launch (20 launches in a CUDA graph, timing.graph_kernel_ms) of:
- v0: the kernel as committed (rope_triton._launch), delayed scaling's settings, q/k (rotated);
- no_rotate: the same kernel on v's gradient (no rotation), the cost of the rotation being the difference;
- v2: a variant that loads even and odd channels as two tiles (no split/join) and writes the transposed copy per
  parity (T1), or not at all (T0); `v2_equal`: its FP8 outputs equal v0's byte for byte (only meaningful for the
  first tile of each shape, where the recordings start from the same state).
`ideal_us`: the bytes moved (BF16 read, FP8 written twice) at 4.5 TB/s.
"""

import json
import sys

import torch
import triton
import triton.language as tl

from cs336_basics.kernels import rope_triton as rt
from cs336_basics.kernels.tiles import Tile
from cs336_basics.measure.timing import graph_kernel_ms
from cs336_basics.precision.fused.scaling import E5M2


@triton.jit
def _v2(g_ptr, cos_ptr, sin_ptr, out_ptr, out_t_ptr, scale_ptr, amax_ptr, sat_ptr, M, F, seq, stride_b, stride_h,
        stride_s, recorded_rows, HEAD_DIM: tl.constexpr, LIMIT: tl.constexpr, TRANSPOSED: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.program_id(1) * (BLOCK_F // 2) + tl.arange(0, BLOCK_F // 2)
    row_mask = rows < M
    mask = row_mask[:, None] & (pairs * 2 < F)[None, :]
    batch, pos = rows // seq, rows % seq
    token = batch.to(tl.int64) * stride_b + pos.to(tl.int64) * stride_s
    even = pairs * 2
    chan = (even // HEAD_DIM) * stride_h + even % HEAD_DIM
    base = g_ptr + token[:, None] + chan[None, :]
    g1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    g2 = tl.load(base + 1, mask=mask, other=0.0).to(tl.float32)
    angle = pos.to(tl.int64)[:, None] * (HEAD_DIM // 2) + (pairs % (HEAD_DIM // 2))[None, :]
    c = tl.load(cos_ptr + angle, mask=mask, other=0.0)
    s = tl.load(sin_ptr + angle, mask=mask, other=0.0)
    r1 = (g1 * c + g2 * s).to(tl.bfloat16).to(tl.float32)
    r2 = (g2 * c - g1 * s).to(tl.bfloat16).to(tl.float32)
    scale = tl.load(scale_ptr)
    y1 = tl.minimum(tl.maximum(r1 * scale, -LIMIT), LIMIT).to(out_ptr.dtype.element_ty)
    y2 = tl.minimum(tl.maximum(r2 * scale, -LIMIT), LIMIT).to(out_ptr.dtype.element_ty)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    y = tl.reshape(tl.join(y1, y2), (BLOCK_M, BLOCK_F))
    tl.store(out_ptr + rows[:, None].to(tl.int64) * F + cols[None, :], y, mask=row_mask[:, None] & (cols < F)[None, :])
    if TRANSPOSED:
        tl.store(out_t_ptr + even[None, :].to(tl.int64) * M + rows[:, None], y1, mask=mask)
        tl.store(out_t_ptr + (even + 1)[None, :].to(tl.int64) * M + rows[:, None], y2, mask=mask)
    m1 = tl.maximum(tl.abs(r1), tl.abs(r2))
    sat = tl.sum(((tl.abs(r1) * scale > LIMIT).to(tl.int32) + (tl.abs(r2) * scale > LIMIT).to(tl.int32)), axis=1)
    entry = rows % recorded_rows
    tl.atomic_max(amax_ptr + entry, tl.max(m1, axis=1), mask=row_mask)
    tl.atomic_add(sat_ptr + entry, sat, mask=row_mask)


SHAPES = {"366m": (8, 2048, 896, 14), "1.3b": (4, 2048, 2048, 16), "gpt2-small": (16, 1024, 768, 12)}
TILES = [Tile(32, 64, 8), Tile(32, 128, 4), Tile(64, 128, 8), Tile(64, 64, 4), Tile(128, 64, 8), Tile(64, 256, 8)]


def measure(preset: str, batch: int, seq: int, dim: int, heads: int) -> list[dict]:
    hd = dim // heads
    grad = torch.randn(batch, seq, heads, hd, device="cuda").to(torch.bfloat16).transpose(1, 2)
    cos, sin = (torch.rand(seq, hd // 2, device="cuda") for _ in range(2))
    outs = (torch.empty(batch * seq, dim, device="cuda", dtype=E5M2),
            torch.empty(dim, batch * seq, device="cuda", dtype=E5M2))  # fmt: skip
    rec = (torch.zeros(batch * seq, device="cuda"), torch.zeros(batch * seq, device="cuda", dtype=torch.int32))
    scale = torch.ones(1, device="cuda")
    m = batch * seq
    sb, sh, ss, _ = grad.stride()

    def v0(tile: Tile, rotate: bool = True) -> None:
        rt._launch(grad, cos, sin, None, outs, scale, E5M2, rotate, rec, tile)

    def v2(tile: Tile, transposed: bool = True) -> None:
        _v2[tile.grid(m, dim)](grad, cos, sin, *outs, scale, *rec, m, dim, seq, sb, sh, ss, m, HEAD_DIM=hd,
                               LIMIT=57344.0, TRANSPOSED=transposed, **tile.launch_options())  # fmt: skip

    rows = []
    for tile in TILES:
        # Each lambda is called at once, inside graph_kernel_ms, so the loop variables are the current ones.
        res = dict(preset=preset, tile=tuple(tile), v0_us=graph_kernel_ms(lambda: v0(tile)) * 1e3,  # noqa: B023
                   no_rotate_us=graph_kernel_ms(lambda: v0(tile, rotate=False)) * 1e3)  # noqa: B023  # fmt: skip
        for transposed in (True, False):
            res[f"v2_T{int(transposed)}_us"] = graph_kernel_ms(lambda: v2(tile, transposed)) * 1e3  # noqa: B023
        v0(tile)
        expected = [o.clone() for o in outs]
        v2(tile)
        same = [torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(expected, outs, strict=True)]
        res["v2_equal"] = all(same)
        res["ideal_us"] = m * dim * 4 / 4.5e12 * 1e6
        print(res, flush=True)
        rows.append(res)
    return rows


def main(out_path: str) -> None:
    rows = [row for preset, shape in SHAPES.items() for row in measure(preset, *shape)]
    with open(out_path, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
