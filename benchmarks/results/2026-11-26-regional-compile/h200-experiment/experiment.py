"""Compile time and step time of one process: the whole model compiled as one graph, or each block (plus the tail)
compiled on its own. The script this folder's logs came from (reformatted for the linter afterwards, logic as run).

python3 experiment.py PRECISION SCOPE MODE PRESET   # fp8|bf16  whole|regional  default|reduce-overhead  366m|gpt2-small
The FP8 side is the fused path with delayed scaling and the FP8 lm_head; the update is a plain SGD step (the
optimizer is not what is compared).
"""

import json
import sys
import time

import torch

from cs336_basics.config import FP8Config, ModelConfig
from cs336_basics.model import TransformerLM
from cs336_basics.model.functional import cross_entropy
from cs336_basics.precision.fused.convert import FusedFP8

SHAPES = {
    "366m": (dict(vocab_size=32000, context_length=2048, dim=896, n_layers=24, n_heads=14, intermediate_size=3584), 8),
    "gpt2-small": (
        dict(vocab_size=50304, context_length=1024, dim=768, n_layers=12, n_heads=12, intermediate_size=3072),
        16,
    ),
    "tiny": (dict(vocab_size=64, context_length=16, dim=32, n_layers=4, n_heads=2, intermediate_size=64), 4),
}


def main() -> None:
    precision, scope, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    preset = sys.argv[4] if len(sys.argv) > 4 else "366m"
    shape, batch = SHAPES[preset]
    cfg = ModelConfig(**shape)
    seq = cfg.context_length
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TransformerLM(cfg).to(dev, torch.bfloat16)
    conv = None
    if precision == "fp8":
        fp8 = FP8Config(
            use_fp8=True, fp8_path="fused", fp8_scaling="delayed", fp8_lm_head=True, fp8_shape_filter=False,
            fp8_emulate=dev == "cpu",
        )  # fmt: skip
        conv = FusedFP8(fp8)
        conv.convert(model)
        conv.prepare(batch * seq)

    def tail(x, targets):
        x = model.ln_final(x)
        fused = getattr(model.lm_head, "linear_cross_entropy", None)
        return fused(x, targets) if fused is not None else cross_entropy(model.lm_head(x), targets)

    if scope == "whole":
        step_fn = torch.compile(model, fullgraph=True, mode=mode)
    else:
        for block in model.layers:
            block.forward = torch.compile(block.forward, fullgraph=True, mode=mode)
        compiled_tail = torch.compile(tail, fullgraph=True, mode=mode)

        def step_fn(ids, targets):
            x = model.token_embeddings(ids)
            for block in model.layers:
                x = block(x)
            return compiled_tail(x, targets)

    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
    y = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    losses, times = [], []
    t0 = time.perf_counter()
    for step in range(16):
        if dev == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        s = time.perf_counter()
        loss = step_fn(x, y)
        loss.backward()
        with torch.no_grad():
            torch._foreach_add_(params, [p.grad for p in params], alpha=-1e-4)
            for p in params:
                p.grad = None
        if conv is not None:
            conv.after_optimizer_step()
        losses.append(loss.item())  # waits for the step: each step's time is its whole time
        times.append(time.perf_counter() - s)
        if step == 0:
            compile_s = time.perf_counter() - t0
    steady = sorted(times[4:])[len(times[4:]) // 2]
    result = dict(
        precision=precision, scope=scope, mode=mode, preset=preset, compile_s=round(compile_s, 1),
        step_ms=round(steady * 1e3, 2), tok_s=round(batch * seq / steady), loss=[round(v, 4) for v in losses[::5]],
        peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev == "cuda" else None,
    )  # fmt: skip
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
