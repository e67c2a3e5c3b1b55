"""Where the time goes: Amdahl's law for FP8 training.

For one model shape and batch size this measures two numbers and predicts the FP8 speedup from them:

  X  the share of the BF16 training step's wall time spent in the GEMMs that FP8 would accelerate: the forward,
     grad_input and grad_weight GEMMs of the nn.Linear layers the FP8 config converts. Their GPU kernel time comes
     from the profiler (one warm compiled step); the step time is the median of CUDA-event-timed steps. Linears
     FP8 leaves in BF16 (the shape rule's rejects, the lm_head unless --fp8_lm_head) are part of 1 - X.
  s  the FP8-over-BF16 speedup of exactly those GEMMs at their shapes: torch.mm against torch._scaled_mm, timed
     alone (no casts, no scaling), summed over the step with each shape weighted by how often it runs.

  predicted speedup = 1 / ((1 - X) + X / s)            (Amdahl's law)
  predicted FP8 step = BF16 step x ((1 - X) + X / s)

The measured FP8 step is slower than that prediction by what FP8 costs besides its GEMMs (amax reductions,
casts, transposes and scales of every operand): `cast_overhead_ms` reports the gap in milliseconds per step.

    python -m cs336_basics.diagnostics.amdahl --preset 366m --batch_size 8 --json out.json

The math and the GEMM enumeration are pure functions that work on CPU; measuring needs a CUDA GPU with FP8.
"""

from cs336_basics.diagnostics.amdahl.law import (
    GemmShape,
    MatmulTimings,
    amdahl_prediction,
    cast_overhead_ms,
    linear_gemm_shapes,
    matmul_speedup,
    predicted_step_ms,
    problem_key,
)
from cs336_basics.diagnostics.amdahl.measure import (
    StepBreakdown,
    analyse,
    breakdown_from_events,
    profile_step_breakdown,
    time_matmuls,
)
from cs336_basics.diagnostics.amdahl.report import AmdahlRow, format_shape_table, format_table, format_top_kernels

__all__ = [
    "AmdahlRow",
    "GemmShape",
    "MatmulTimings",
    "StepBreakdown",
    "amdahl_prediction",
    "analyse",
    "breakdown_from_events",
    "cast_overhead_ms",
    "format_shape_table",
    "format_table",
    "format_top_kernels",
    "linear_gemm_shapes",
    "matmul_speedup",
    "predicted_step_ms",
    "problem_key",
    "profile_step_breakdown",
    "time_matmuls",
]
