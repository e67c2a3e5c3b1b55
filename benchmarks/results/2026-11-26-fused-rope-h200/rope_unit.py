"""GPU time of attention's q/k/v + RoPE as one FP8 unit (--fp8_fused_rope) against the shared-input group it replaces,
and of the unit's gradient kernel for several tile sizes, at the 366m, 1.3b and gpt2-small shapes.

    python3 rope_unit.py run RAW.json                  # GPU: the measurements, as the device wrote them (raw/)
    python3 rope_unit.py schema OUT.json RAW.json ...  # CPU: the results schema's records from raw files

- `layer`: one attention layer (q/k/v, RoPE, SDPA, output projection) of the preset's shape and batch, converted to
  the fused FP8 path twice, with the unit and without it, each compiled (fullgraph); forward + backward after
  warm-up: the GPU's busy time (5 calls profiled; one layer's host time exceeds its kernels', so wall time says little)
  and its largest kernels, and the wall time (median of 20, CUDA events). Each preset at its default scaling
  (LAYERS). SDPA and the output projection are the same in both: the difference is what the unit saves.
- `tile`: the gradient kernel alone (delayed scaling's settings: cast, transposed copy, per-row recordings) on a
  gradient laid out as attention may hand it back, for each tile (tokens x channels) and warp count, 20 launches
  captured in a CUDA graph (timing.graph_kernel_ms).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys

import torch

from cs336_basics.config import FP8Config, ModelConfig
from cs336_basics.diagnostics.amdahl.measure import _top_kernels_us, gpu_timeline
from cs336_basics.kernels.rope_triton import _launch
from cs336_basics.kernels.tiles import ROPE_GRAD_TILE, Tile
from cs336_basics.measure.timing import graph_kernel_ms, time_calls_ms
from cs336_basics.model.attention import CausalSelfAttention
from cs336_basics.precision import FusedFP8
from cs336_basics.precision.fused.scaling import E5M2, SiteScaling

# preset: (batch, seq, dim, heads)
SHAPES = {"366m": (8, 2048, 896, 14), "1.3b": (4, 2048, 2048, 16), "gpt2-small": (16, 1024, 768, 12)}
# The layer comparison at each preset's default scaling (the tile sweep covers the kernel at every shape).
LAYERS = [("366m", "delayed"), ("1.3b", "dynamic"), ("gpt2-small", "delayed")]
TILES = [(bm, bf, w) for bm, bf, w in itertools.product((16, 32, 64, 128), (64, 128, 256), (4, 8)) if bm * bf <= 16384]


def layer(batch: int, seq: int, dim: int, heads: int, fused: bool, scaling: str):
    config = ModelConfig(vocab_size=256, context_length=seq, dim=dim, n_layers=1, n_heads=heads,
                         intermediate_size=4 * dim)  # fmt: skip
    torch.manual_seed(0)
    module = torch.nn.Sequential(CausalSelfAttention(config)).to("cuda", torch.bfloat16)
    fp8 = FP8Config(use_fp8=True, fp8_path="fused", fp8_scaling=scaling, fp8_fused_rope=fused)
    FusedFP8(fp8).convert(module)
    for site in module.modules():
        if isinstance(site, SiteScaling) and site.delayed:
            site.size_row_buffers(batch * seq)
    return torch.compile(module, fullgraph=True)


def layer_ms(batch: int, seq: int, dim: int, heads: int, fused: bool, scaling: str) -> dict:
    """GPU busy time of one forward + backward (5 profiled after warm-up), its kernels, and the wall time."""
    module = layer(batch, seq, dim, heads, fused, scaling)
    x = torch.randn(batch, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    upstream = torch.randn_like(x)

    def step():
        module(x).backward(upstream)

    wall = statistics.median(time_calls_ms(step, 20, warmup=3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    events = list(prof.events())
    kernels = [(name[:90], us / 5e3, launches / 5) for name, us, launches in _top_kernels_us(events, 12)]
    return dict(ms=gpu_timeline(events, steps=5).busy_ms, wall_ms=wall, kernels=kernels)


def tile_launch(batch: int, seq: int, dim: int, heads: int, layout: str, bm: int, bf: int, warps: int):
    head_dim = dim // heads
    # (batch, heads, seq, head_dim), stored token-major (a transposed view) or head-major (contiguous).
    if layout == "bshd":
        grad = torch.randn(batch, seq, heads, head_dim, device="cuda").to(torch.bfloat16).transpose(1, 2)
    else:
        grad = torch.randn(batch, heads, seq, head_dim, device="cuda").to(torch.bfloat16)
    cos, sin = (torch.rand(seq, head_dim // 2, device="cuda") for _ in range(2))
    outputs = (torch.empty(batch * seq, dim, device="cuda", dtype=E5M2),
               torch.empty(dim, batch * seq, device="cuda", dtype=E5M2))  # fmt: skip
    recorded = (torch.zeros(batch * seq, device="cuda"), torch.zeros(batch * seq, device="cuda", dtype=torch.int32))
    scale = torch.ones(1, device="cuda")
    return lambda: _launch(grad, cos, sin, None, outputs, scale, E5M2, True, recorded, Tile(bm, bf, warps))


def run(out_path: str) -> None:
    rows = []
    for (preset, shape), layout in itertools.product(SHAPES.items(), ("bshd", "bhsd")):
        for bm, bf, warps in TILES:
            ms = graph_kernel_ms(tile_launch(*shape, layout, bm, bf, warps))
            batch, seq, dim, _ = shape
            gb = batch * seq * dim * (2 + 2) / 1e9  # BF16 read, FP8 written twice
            rows.append(dict(kind="tile", preset=preset, layout=layout, block_m=bm, block_f=bf, warps=warps, ms=ms,
                             tb_per_s=gb / ms))  # fmt: skip
    for preset, scaling in LAYERS:
        shape = SHAPES[preset]
        for fused in (False, True):
            measured = layer_ms(*shape, fused, scaling)
            rows.append(dict(kind="layer", preset=preset, fp8_scaling=scaling, fp8_fused_rope=fused, **measured))
            torch._dynamo.reset()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, command=" ".join(sys.argv))
    with open(out_path, "w") as fh:
        json.dump(dict(meta, rows=rows), fh, indent=1)
    print(
        "| preset | scaling | group + attention's RoPE: GPU ms (wall) | unit: GPU ms (wall) | GPU ms saved per layer |"
    )
    print("|---|---|---|---|---|")
    layers = {(r["preset"], r["fp8_scaling"], r["fp8_fused_rope"]): r for r in rows if r["kind"] == "layer"}
    for preset, scaling in LAYERS:
        plain, fused = layers[preset, scaling, False], layers[preset, scaling, True]
        print(f"| {preset} | {scaling} | {plain['ms']:.3f} ({plain['wall_ms']:.3f}) | {fused['ms']:.3f} "
              f"({fused['wall_ms']:.3f}) | {plain['ms'] - fused['ms']:.3f} |")  # fmt: skip
    print("\n| preset | layout | tile now | ms | best tile | best ms | best TB/s |")
    print("|---|---|---|---|---|---|---|")
    for preset, layout in itertools.product(SHAPES, ("bshd", "bhsd")):
        tiles = [r for r in rows if r["kind"] == "tile" and (r["preset"], r["layout"]) == (preset, layout)]
        now = next(r for r in tiles if (r["block_m"], r["block_f"], r["warps"]) == tuple(ROPE_GRAD_TILE))
        best = min(tiles, key=lambda r: r["ms"])
        best_tile = f"{best['block_m']}x{best['block_f']}, {best['warps']} warps"
        print(f"| {preset} | {layout} | {tuple(ROPE_GRAD_TILE)} | {now['ms']:.4f} | {best_tile} | {best['ms']:.4f} | "
              f"{best['tb_per_s']:.2f} |")  # fmt: skip


def schema(out_path: str, raw_paths: list[str]) -> None:
    """One results file (the shared schema: a record per measurement) from the raw files of `run`."""
    from cs336_basics.config_layers import build_config
    from cs336_basics.measure.results import run_record, write_results_from_raw

    def record(raw: dict, path: str, row: dict) -> dict:
        fp8 = {"use_fp8": True, "fp8_path": "fused", "fp8_scaling": row.get("fp8_scaling", "delayed"),
               "fp8_fused_rope": row.get("fp8_fused_rope", True)}  # fmt: skip
        config = build_config({"preset": row["preset"], "fp8": fp8})
        layer_row = row["kind"] == "layer"
        what = "one attention layer, forward + backward" if layer_row else "one gradient kernel launch"
        return run_record(config, compile="default" if layer_row else False, attention="sdpa", gpu=raw["gpu"],
                          torch=raw["torch"], measured=f"{what}, GPU time", raw=path.rsplit("/", 1)[-1],
                          **row)  # fmt: skip

    write_results_from_raw(out_path, raw_paths, "rope_unit.py", record)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    else:
        schema(sys.argv[2], sys.argv[3:])
