"""How far fast backward accumulation moves a LoRA fine-tune's adapter gradients (exploration script; not part of
the package).

Builds the fine-tune of ARGV (train_h100.py flags: --init_from, --train_data, --lora_rank, ...) with a BF16 base and
with an FP8 base in several fast-accumulation settings, gives every variant the same random adapters (B nonzero, so
that both A and B get gradients) and the same batch of the fine-tune's validation tokens, and prints each variant's
loss and the relative error of its adapter gradients against the BF16 base's, overall and per layer kind. Eager (no
compile); dynamic scaling. Writes $OUT/w/fa_grads.json.
"""

import json
import os
import sys

import numpy as np
import torch

from cs336_basics.build import build
from cs336_basics.cli import config_from_args, config_parser
from cs336_basics.data import prepare_data

BASE = sys.argv[1:]
VARIANTS = {  # name: (flags, which FP8 sites keep fast accumulation in the backward: None = all the flag gives)
    "bf16": (["--no_use_fp8"], None),
    "fp8": (["--use_fp8", "--no_fp8_shape_filter", "--fp8_lm_head", "--fp8_path", "fused"], None),
    "fp8-fast-accum": (
        ["--use_fp8", "--no_fp8_shape_filter", "--fp8_lm_head", "--fp8_path", "fused", "--fp8_fast_accum_backward"],
        None,
    ),
    "fp8-fast-accum-not-head": (
        ["--use_fp8", "--no_fp8_shape_filter", "--fp8_lm_head", "--fp8_path", "fused", "--fp8_fast_accum_backward"],
        lambda fqn: fqn != "lm_head",
    ),
    "fp8-fast-accum-head-only": (
        ["--use_fp8", "--no_fp8_shape_filter", "--fp8_lm_head", "--fp8_path", "fused", "--fp8_fast_accum_backward"],
        lambda fqn: fqn == "lm_head",
    ),
}


def run(flags, keep_fast):
    config = config_from_args(config_parser("").parse_args(BASE + flags))
    built = build(config)
    model = built.model
    if keep_fast is not None:
        assert getattr(model.get_submodule("lm_head"), "scaling", None) is not None, "the head is not FP8"
        for fqn, m in model.named_modules():
            if getattr(m, "scaling", None) is not None:
                m.scaling.fast_accum_backward = keep_fast(fqn)
    data = prepare_data(built.config.data, built.config.model.vocab_size)
    val = np.asarray(data.val)
    t, b = built.config.model.context_length, int(os.environ.get("BATCH", "8"))
    starts = np.arange(b) * ((len(val) - t - 1) // b)
    x = torch.stack([torch.from_numpy(val[s : s + t].astype(np.int64)) for s in starts]).to(built.device)
    y = torch.stack([torch.from_numpy(val[s + 1 : s + t + 1].astype(np.int64)) for s in starts]).to(built.device)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and name.endswith("lora_b"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.train()
    loss = model(x, targets=y)
    loss.backward()
    grads = {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.requires_grad}
    return loss.item(), grads


def rel(a, b):
    return float((a - b).norm() / b.norm())


results = {}
ref_loss, ref = run(*VARIANTS["bf16"])
for name, variant in VARIANTS.items():
    loss, grads = (ref_loss, ref) if name == "bf16" else run(*variant)
    kinds = {}
    for n, g in grads.items():
        kind = n.split(".")[-2] + "." + n.split(".")[-1]  # e.g. q.lora_a
        kinds.setdefault(kind, []).append(rel(g, ref[n]))
    whole = rel(torch.cat([g.flatten() for g in grads.values()]), torch.cat([g.flatten() for g in ref.values()]))
    results[name] = {
        "loss": loss,
        "grad_rel_err": whole,
        "per_kind_mean": {k: float(np.mean(v)) for k, v in kinds.items()},
        "per_layer_q_lora_b": [rel(grads[n], ref[n]) for n in grads if n.endswith("q_proj.lora_b")],
    }
    print(
        f"{name:26s} loss {loss:.4f}  adapter-grad rel err {whole:.4f}  "
        + " ".join(f"{k} {v:.3f}" for k, v in results[name]["per_kind_mean"].items()),
        flush=True,
    )
out = os.environ.get("OUT", "/tmp") + "/w"
os.makedirs(out, exist_ok=True)
with open(out + "/fa_grads.json", "w") as f:
    json.dump({"argv": BASE, "batch": int(os.environ.get("BATCH", "8")), "variants": results}, f, indent=1)
