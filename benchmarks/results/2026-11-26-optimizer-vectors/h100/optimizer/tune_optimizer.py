"""The command behind tune-*.log (GPU): the AdamW and gradient-norm kernels at one preset's parameter shapes, each
block size and warp count, with and without 16-byte vector access (ALIGNED), against torch's `_foreach_norm`.

    python3 benchmarks/results/2026-11-26-optimizer-vectors/h100/optimizer/tune_optimizer.py 1.3b

It calls the kernels of 8c05573 directly (the launch classes choose ALIGNED themselves). Bandwidth counts 28 bytes
per parameter for the update (adamw_kernel.py) and the gradient's 2 bytes for the norm.
"""

import statistics
import sys

import torch

from cs336_basics.config_layers import build_config
from cs336_basics.kernels import adamw_triton as adamw_kernel
from cs336_basics.kernels import grad_norm_triton as grad_norm_kernel
from cs336_basics.kernels.multi_tensor import BlockLayout, DeviceInts, addresses
from cs336_basics.measure.timing import time_calls_ms
from cs336_basics.model import TransformerLM
from cs336_basics.optim.clipping import global_grad_norm


def median_ms(fn) -> float:
    fn()  # compiles the kernel for this configuration
    return statistics.median(time_calls_ms(fn, 20))


def main(preset: str) -> None:
    config = build_config({"preset": preset, "train": {"dtype": "bfloat16"}, "fp8": {"use_fp8": False}})
    params = list(TransformerLM(config.model).to("cuda", torch.bfloat16).parameters())
    grads = [torch.randn_like(p) * 1e-3 for p in params]
    masters = [p.float() for p in params]
    exp_avgs, exp_avg_sqs = [torch.zeros_like(m) for m in masters], [torch.zeros_like(m) for m in masters]
    steps = [torch.ones((), device="cuda") for _ in params]
    lr, grad_scale = torch.tensor(1e-4, device="cuda"), torch.ones((), device="cuda")
    tables = [addresses(DeviceInts(), ts) for ts in (grads, masters, exp_avgs, exp_avg_sqs, steps, params)]
    n = sum(p.numel() for p in params)
    print(f"{preset}: {n / 1e6:.0f}M params, 28 B/param = {28 * n / 1e9:.1f} GB per update; grads {2 * n / 1e9:.2f} GB")
    hparams = (0.9, 0.95, adamw_kernel._log2(0.9), adamw_kernel._log2(0.95), 1e-8, 0.1)
    for block in (1024, 2048, 4096):
        layout = BlockLayout(block)(masters)
        blocks = (layout.tensor_of_block, layout.first_block, layout.numel)
        for warps in (4, 8):
            for aligned in (False, True):
                ms = median_ms(
                    lambda layout=layout, blocks=blocks, warps=warps, aligned=aligned, block=block: (
                        adamw_kernel._adamw_kernel[(layout.programs,)](
                            *tables, *blocks, grads[0], params[0], lr, grad_scale, *hparams, WRITE_PARAM=True,
                            ALIGNED=aligned, BLOCK_SIZE=block, num_warps=warps,
                        )
                    )
                )  # fmt: skip
                bandwidth = 28 * n / ms / 1e9
                print(f"adamw block {block} warps {warps} aligned {aligned}: {ms:.3f} ms = {bandwidth:.2f} TB/s")
    print(f"norm foreach (global_grad_norm): {median_ms(lambda: global_grad_norm(grads)):.3f} ms")
    reference = global_grad_norm(grads)
    for block in (2048, 4096, 8192, 16384):
        layout = BlockLayout(block)(grads)
        for warps in (4, 8, 16):
            for aligned in (False, True):
                sums = torch.empty(layout.programs, device="cuda")

                def norm(layout=layout, sums=sums, warps=warps, aligned=aligned, block=block):
                    grad_norm_kernel._sum_of_squares_kernel[(layout.programs,)](
                        tables[0], layout.tensor_of_block, layout.first_block, layout.numel, grads[0], sums,
                        ALIGNED=aligned, BLOCK_SIZE=block, num_warps=warps,
                    )  # fmt: skip
                    return sums.sum().sqrt()

                error = abs(norm() - reference).item() / reference.item()
                ms = median_ms(norm)
                print(
                    f"norm block {block} warps {warps} aligned {aligned}: {ms:.3f} ms ({2 * n / ms / 1e9:.2f} TB/s) "
                    f"rel err {error:.2e}"
                )
    launch = grad_norm_kernel.GradNormLaunch()
    print(f"GradNormLaunch: {median_ms(lambda: launch(grads)):.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
