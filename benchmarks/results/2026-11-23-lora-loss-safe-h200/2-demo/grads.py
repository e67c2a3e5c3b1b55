"""How far fast backward accumulation moves gradients, per site (exploration script of ../README.md; not part of the
package).

Builds the run of ARGV (train_h100.py flags, with --init_from) with a BF16 base and with an FP8 base
(`--fp8_path fused --fp8_lm_head`, dynamic scaling) in several settings of fast accumulation, gives every variant
the same batch of validation tokens (and, for LoRA, the same random adapters, B nonzero so that A gets a gradient
too), and prints each one's loss and the relative error of its trainable parameters' gradients against the BF16
run's: overall, for the lm_head's weight (full fine-tuning) and per layer kind. Eager (no compile). The head's two
backward GEMMs are set apart from the flag by patching the package (HEAD_* columns below; None: the package's own
rule). Writes $OUT/w/grads-<lora|full>.json.
"""

import json
import os
import sys

import numpy as np
import torch

import cs336_basics.lora.layers as lora_layers
import cs336_basics.precision.fused.head as head
from cs336_basics.build import build
from cs336_basics.cli import config_from_args, config_parser
from cs336_basics.data import prepare_data
from cs336_basics.precision.fused.linear import fp8_matmul

ARGV = sys.argv[1:]
FP8 = ["--use_fp8", "--no_fp8_shape_filter", "--fp8_lm_head", "--fp8_path", "fused"]
FAST = [*FP8, "--fp8_fast_accum_backward"]
VARIANTS = {  # name: (flags, fast accumulation in the head's dx GEMM, in its dw GEMM)
    "bf16": (["--no_use_fp8"], None, None),
    "fp8": (FP8, None, None),
    "fp8-fast-accum": (FAST, None, None),
    "fp8-fast-accum-head-dx-fast": (FAST, True, False),
    "fp8-fast-accum-head-dw-fast": (FAST, False, True),
}


def patch_head(dx_fast, dw_fast):
    own = head.HEAD_FAST_ACCUM

    def backward_gemms(g, g_t, g_inv, w_t, w_inv, x_t, x_inv, fast):
        dx = fp8_matmul(g, g_inv, w_t.t(), w_inv, own if dx_fast is None else dx_fast)
        dw = fp8_matmul(g_t, g_inv, x_t.t(), x_inv, own if dw_fast is None else dw_fast)
        return dx, dw

    head.backward_gemms = backward_gemms  # the pre-training path's loss-fused head
    lora_layers.HEAD_FAST_ACCUM = own if dx_fast is None else dx_fast  # a LoRA base's head (dx only: no dw)


def run(flags, dx_fast, dw_fast):
    patch_head(dx_fast, dw_fast)
    built = build(config_from_args(config_parser("").parse_args(ARGV + flags)))
    model, lora = built.model, built.config.finetune.lora
    data = prepare_data(built.config.data, built.config.model.vocab_size)
    val = np.asarray(data.val)
    t, b = built.config.model.context_length, 8
    starts = np.arange(b) * ((len(val) - t - 1) // b)
    tokens = [torch.from_numpy(val[s : s + t + 1].astype(np.int64)) for s in starts]
    x, y = (torch.stack([w[i : i + t] for w in tokens]).to(built.device) for i in (0, 1))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora and name.endswith("lora_b"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.train()
    loss = model(x, targets=y)
    loss.backward()
    grads = {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.requires_grad}
    del model, built
    torch.cuda.empty_cache()
    return loss.item(), grads


def rel(a, b):
    return float((a - b).norm() / b.norm())


def main():
    results, ref = {}, None
    for name, variant in VARIANTS.items():
        loss, grads = run(*variant)
        ref = ref or grads
        kinds = {}
        for n, g in grads.items():
            kinds.setdefault(".".join(n.split(".")[-2:]), []).append(rel(g, ref[n]))
        flat = [torch.cat([g.flatten() for g in d.values()]) for d in (grads, ref)]
        results[name] = {
            "loss": loss,
            "grad_rel_err": rel(*flat),
            "lm_head_weight_grad_rel_err": rel(grads["lm_head.weight"], ref["lm_head.weight"])
            if "lm_head.weight" in grads
            else None,
            "per_kind_mean": {k: float(np.mean(v)) for k, v in sorted(kinds.items())},
        }
        r = results[name]
        head_err = (
            ""
            if r["lm_head_weight_grad_rel_err"] is None
            else f"  lm_head.weight {r['lm_head_weight_grad_rel_err']:.4f}"
        )
        print(f"{name:30s} loss {loss:.4f}  grad rel err {r['grad_rel_err']:.4f}{head_err}", flush=True)
    mode = "lora" if "--lora_rank" in ARGV else "full"
    out = os.environ.get("OUT", "/tmp") + "/w"
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/grads-{mode}.json", "w") as f:
        json.dump({"argv": ARGV, "batch": 8, "variants": results}, f, indent=1)


if __name__ == "__main__":
    main()
