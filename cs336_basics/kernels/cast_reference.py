"""A tensor's delayed-scaling FP8 cast with its transposed copy in plain torch: the definition the Triton kernel
(cast_triton.py) must match.

`cast_transposed(x, scale, dtype, record, amax_rows, saturated_rows)` -> (x in FP8, its transpose in FP8, row-major).
x is 2-D and row-major; `scale` is one float32 value, of shape () or (1,). The cast is cast_to_fp8's. With `record`
x's amax and its count of values that saturate are filed, in place, into a site's row buffers `amax_rows` and
`saturated_rows` (max-accumulated and added; into which entries is each implementation's choice, as the update reduces
each buffer to one number; here entry 0), as SiteScaling.cast does for the casts it runs itself; without it they are
not touched. SiteScaling runs the kernel on CUDA only; elsewhere it casts and transposes as two torch operations, with
the same numerics.
"""

from __future__ import annotations

import torch

from cs336_basics.kernels.fp8_format import cast_to_fp8, record_into_entry0


def cast_transposed(
    x: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    amax_rows: torch.Tensor,
    saturated_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    scale = scale.reshape(())
    x_fp8 = cast_to_fp8(x, scale, dtype)
    if record:
        record_into_entry0(x, scale, dtype, amax_rows, saturated_rows)
    return x_fp8, x_fp8.t().contiguous()
