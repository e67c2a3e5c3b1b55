"""What every precision path gives the build stage and the Trainer: one Converter per path.

The build stage calls `convert(model)` once, on the uncompiled model in BF16 on its device, then `count(model)` as
the independent check of the report (build.py). The Trainer calls the step hooks and nothing else: it never imports
a path's classes. A path whose scales advance once per step (delayed scaling) keeps that state here, in its
converter, not on the model: `prepare` sizes it before the first compiled step, `after_optimizer_step` advances it,
`take_saturated` reads its saturation count for the metrics, and `state_dict` / `load_state_dict` carry it in a
checkpoint's extras for exact resume (it is not in the model's state dict, so checkpoints interchange across paths).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from cs336_basics.config import FP8Config, RunConfig
from cs336_basics.precision.fused.scaling import DelayedScalingState, SiteScaling, max_over_ranks


class Converter:
    """One way a model's linear layers change precision. This base class converts nothing: a BF16 or FP32 run."""

    scaling: DelayedScalingState | None = None  # delayed scaling's amax histories, once convert() made them

    def convert(self, model: nn.Module) -> Any:
        """Change `model`'s linears in place and return the path's report of what was converted and skipped."""
        return None

    def count(self, model: nn.Module) -> int:
        """The linears of `model` whose GEMMs this path runs in FP8, counted from its modules, not from a report."""
        return 0

    def fp8_report(self, report: Any) -> Any:
        """The FP8 part of convert()'s report (an FP8ConversionReport, or None without FP8): what count() checks."""
        return report

    def prepare(self, tokens_per_micro_batch: int, micro_batches: int) -> None:
        """Before the first (compiled) step, whose graph keeps the sizes of the per-row recordings, and before a
        resume's load_state_dict (which rescales saved gradient amaxes to this run's tokens per rank and step)."""
        if self.scaling is not None:
            self.scaling.set_step_tokens(tokens_per_micro_batch, micro_batches)

    def after_optimizer_step(self) -> None:
        """Once per optimizer step, after it: this step's amaxes become the next step's scales."""
        if self.scaling is not None:
            self.scaling.update()

    def take_saturated(self) -> int | None:
        """Values clamped at the FP8 maximum since the last call (None where the path does not count them)."""
        return self.scaling.take_saturated() if self.scaling is not None else None

    def state_dict(self) -> dict | None:
        """What a checkpoint must keep of this path's state for an exact resume (None: nothing)."""
        return self.scaling.scaling_state() if self.scaling is not None else None

    def load_state_dict(self, state: dict | None) -> None:
        """Restore `state_dict()`'s result. A checkpoint without it (BF16, dynamic scaling) leaves the state fresh."""
        if self.scaling is not None and state is not None:
            self.scaling.load_scaling_state(state)


NO_CONVERSION = Converter()


class FP8Converter(Converter):
    """An FP8 implementation's converter, registered under its name (choice.FP8_CONVERTERS): the defaults it gives the
    settings left automatic, and the settings it refuses, checked before anything is built (check_options, which
    choose_fp8 also calls on the chosen settings)."""

    path: str  # its name: FP8Config.fp8_path's value, and the `fp8_path` of its reports and records

    def __init__(self, fp8: FP8Config, world_size: int = 1):
        self.check_options(fp8, world_size)
        self.fp8 = fp8
        self.world_size = world_size

    @staticmethod
    def defaults(fp8: FP8Config, world_size: int, cuda_graphs: bool) -> tuple[str, dict[str, Any]]:
        """Whose defaults these are (for the summary's words), and the values they give the settings left automatic
        (lm_head, shape rule, scaling, and fast backward accumulation where this package's FP8 linears run).
        `cuda_graphs`: whether the FP8 step will replay under CUDA graphs."""
        raise NotImplementedError

    @staticmethod
    def check_options(fp8: FP8Config, world_size: int = 1) -> None:
        """Refuse, with the reason, the settings this path does not have."""
        raise NotImplementedError

    @classmethod
    def for_run(cls, config: RunConfig, world_size: int, fsdp_float8_all_gather: bool) -> Converter:
        """The converter of a planned run (its FP8 settings chosen). `fsdp_float8_all_gather`: FSDP2 will shard the
        model and all-gather FP8 weights (TorchAO's)."""
        return cls(config.fp8, world_size)


def delayed_scaling(sites: list[SiteScaling], fp8: FP8Config, world_size: int = 1) -> DelayedScalingState:
    """The amax histories of these delayed-scaling sites, with the history settings fp8 gives; on several processes
    their amaxes are reduced over the ranks once per step, so that every rank keeps the same history and scales."""
    return DelayedScalingState(
        sites, fp8.fp8_amax_history_len, fp8.fp8_amax_compute_algo, fp8.fp8_margin,
        reduce_amax=max_over_ranks if world_size > 1 else None,
    )  # fmt: skip
