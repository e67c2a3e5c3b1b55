"""The model of an FP8 speedup: Amdahl's law, and the GEMMs of one training step (their shapes, counts and which
ones FP8 converts), plus the aggregate FP8 GEMM speedup s over them. Pure functions: they work on any machine."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from cs336_basics.config import FP8Config, ModelConfig
from cs336_basics.errors import ConfigError

# ---- Amdahl's law ----


def amdahl_prediction(x: float, s: float) -> float:
    """End-to-end speedup when a share x of the time is sped up s times: 1 / ((1 - x) + x / s)."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"the accelerated share x must be in [0, 1], got {x}")
    if not s > 0.0:
        raise ValueError(f"the speedup s must be positive, got {s}")
    return 1.0 / ((1.0 - x) + x / s)


def predicted_step_ms(bf16_step_ms: float, x: float, s: float) -> float:
    """The FP8 step time Amdahl's law predicts: bf16_step_ms x ((1 - x) + x / s)."""
    return bf16_step_ms / amdahl_prediction(x, s)


def cast_overhead_ms(bf16_step_ms: float, fp8_step_ms_measured: float, x: float, s: float) -> float:
    """Measured FP8 step time minus the Amdahl prediction, in ms per step: what FP8 costs besides its GEMMs
    (casting and scaling). Negative means FP8 did better than its GEMM speedup alone explains."""
    return fp8_step_ms_measured - predicted_step_ms(bf16_step_ms, x, s)


# ---- the GEMMs of one training step ----


@dataclass(frozen=True)
class GemmShape:
    """One training GEMM, (m x k) @ (k x n), run `count` times per micro-batch by the linears in `layers`.

    For a linear with in_features K, out_features N and M tokens: forward is (M x K) @ (K x N), grad_input
    (M x N) @ (N x K), grad_weight (N x M) @ (M x K). `converted` means it runs as an FP8 GEMM after conversion
    (the layer passes the FP8 filter; for rowwise_with_gw_hp the grad_weight GEMM stays BF16).
    """

    kind: str
    m: int
    k: int
    n: int
    converted: bool
    count: int = 1
    layers: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, int, int, int, bool]:
        return (self.kind, self.m, self.k, self.n, self.converted)

    @property
    def problem(self) -> tuple[int, int, int]:
        """(k, smaller outer dim, larger): the same for C = A @ B and C^T = B^T @ A^T, which cost the same."""
        return problem_key(self.m, self.k, self.n)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    def label(self) -> str:
        return f"{self.kind} {self.m}x{self.k} @ {self.k}x{self.n}"


def problem_key(m: int, k: int, n: int) -> tuple[int, int, int]:
    return (k, min(m, n), max(m, n))


def model_skeleton(model_config: ModelConfig) -> nn.Module:
    """The model `model_config` describes, built without its memory or compute: its modules and their shapes.

    This package's TransformerLM under FakeTensorMode (the "meta" device cannot run RoPE's table set-up, and the
    course init's truncated normal is data-dependent, so it is skipped here; a real CPU build where fake mode fails);
    a Hugging Face model (--hf_model) on the "meta" device.
    """
    if model_config.hf_model is not None:
        from cs336_basics.hf.models import build_causal_lm, hf_config

        return build_causal_lm(hf_config(model_config.hf_model), device="meta")
    from cs336_basics.model import TransformerLM

    try:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            return TransformerLM(model_config, init=False)
    except Exception:  # noqa: BLE001 - any fake-mode limitation: the real model has the same modules
        return TransformerLM(model_config)


def _linear_layers(model_config: ModelConfig) -> list[tuple[str, nn.Module]]:
    """(fqn, module) for every nn.Linear of the model, in torchao's traversal order."""
    model = model_skeleton(model_config)
    return [(fqn, m) for fqn, m in model.named_modules(remove_duplicate=False) if isinstance(m, nn.Linear)]


def _merge(shapes: Iterable[GemmShape]) -> list[GemmShape]:
    """Identical GEMMs (kind, m, k, n, converted) merged into one entry with summed count, first-seen order."""
    merged: dict[tuple, GemmShape] = {}
    for shape in shapes:
        seen = merged.get(shape.key)
        merged[shape.key] = (
            shape
            if seen is None
            else dataclasses.replace(seen, count=seen.count + shape.count, layers=seen.layers + shape.layers)
        )
    return list(merged.values())


def linear_gemm_shapes(
    model_config: ModelConfig,
    batch_size: int,
    fp8_filter: FP8Config | Callable[[nn.Module, str], bool] | None = None,
) -> list[GemmShape]:
    """The three training GEMMs of every nn.Linear (lm_head included) for a micro-batch of batch_size sequences,
    deduplicated with counts. `fp8_filter` decides `converted`: an FP8Config (the package's filter:
    skip_reason(...) is None), a torchao-style `(module, fqn) -> bool`, or None for FP8Config() defaults.
    With gradient checkpointing the blocks' forward GEMMs run twice (recomputed in backward)."""
    from cs336_basics.precision import grad_weight_in_fp8, skip_reason

    if batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size}.")
    cfg = FP8Config() if fp8_filter is None else fp8_filter
    if isinstance(cfg, FP8Config):
        is_converted = lambda module, fqn: skip_reason(module, fqn, cfg) is None
        hp_grad_weight = not grad_weight_in_fp8(cfg.fp8_recipe)
    else:
        is_converted, hp_grad_weight = cfg, False
    tokens = batch_size * model_config.context_length
    recomputed = (lambda fqn: fqn.startswith("layers.")) if model_config.gradient_checkpointing else None
    return gemm_shapes(_linear_layers(model_config), tokens, is_converted, hp_grad_weight, recomputed)


def gemm_shapes(
    linears: Iterable[tuple[str, nn.Module]],
    tokens: int,
    is_converted: Callable[[nn.Module, str], bool],
    hp_grad_weight: bool = False,
    recomputed: Callable[[str], bool] | None = None,
) -> list[GemmShape]:
    """The three training GEMMs of each (fqn, nn.Linear) for `tokens` tokens per micro-batch, deduplicated with
    counts; `is_converted` says which run in FP8 (`hp_grad_weight`: not their grad_weight GEMM), `recomputed` which
    layers' forward runs twice (gradient checkpointing)."""
    shapes = []
    for fqn, module in linears:
        k, n = module.in_features, module.out_features
        converted = bool(is_converted(module, fqn))
        gemms = (
            ("forward", (tokens, k, n), 2 if recomputed is not None and recomputed(fqn) else 1),
            ("grad_input", (tokens, n, k), 1),
            ("grad_weight", (n, tokens, k), 1),
        )
        for kind, (gm, gk, gn), runs in gemms:
            fp8 = converted and not (kind == "grad_weight" and hp_grad_weight)
            shapes.append(GemmShape(kind, gm, gk, gn, fp8, runs, (fqn,)))
    return _merge(shapes)


def matmul_speedup(times: Mapping[GemmShape, tuple[float, float]]) -> float:
    """Aggregate FP8 GEMM speedup over the converted GEMMs: sum(count x bf16) / sum(count x fp8); nan if none."""
    pairs = [(shape.count * bf16, shape.count * fp8) for shape, (bf16, fp8) in times.items() if shape.converted]
    bf16_total, fp8_total = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    if not pairs or not fp8_total > 0:
        return math.nan
    return bf16_total / fp8_total


@dataclass(eq=False)
class MatmulTimings(Mapping):
    """GemmShape -> (bf16_ms, fp8_ms) per call (fp8 nan where FP8 cannot run), and the aggregate speedup."""

    recipe: str
    times: dict[GemmShape, tuple[float, float]] = field(default_factory=dict)

    def __getitem__(self, shape: GemmShape) -> tuple[float, float]:
        return self.times[shape]

    def __iter__(self) -> Iterator[GemmShape]:
        return iter(self.times)

    def __len__(self) -> int:
        return len(self.times)

    @property
    def speedup(self) -> float:
        return matmul_speedup(self.times)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "kind": s.kind,
                "m": s.m,
                "k": s.k,
                "n": s.n,
                "count": s.count,
                "converted": s.converted,
                "bf16_ms": bf16,
                "fp8_ms": fp8,
                "speedup": bf16 / fp8 if fp8 > 0 else math.nan,
                "bf16_tflops": s.flops / (bf16 * 1e9) if bf16 > 0 else math.nan,
                "fp8_tflops": s.flops / (fp8 * 1e9) if fp8 > 0 else math.nan,
                "layers": _layer_summary(s.layers),
            }
            for s, (bf16, fp8) in self.times.items()
        ]


def _layer_summary(layers: tuple[str, ...]) -> str:
    """e.g. "layers.*.ffn.w1 (24)" instead of 24 names."""
    groups: dict[str, int] = {}
    for fqn in layers:
        parts = fqn.split(".")
        generic = ".".join("*" if p.isdigit() else p for p in parts)
        groups[generic] = groups.get(generic, 0) + 1
    return ", ".join(f"{g} ({c})" if c > 1 else g for g, c in groups.items())
