"""FP8 casts and their scales: dynamic (from the tensor's own amax) and delayed (from earlier steps' amaxes).

A tensorwise FP8 cast is `fp8(clamp(x * scale, -max, max))` with one float32 `scale` per tensor; the GEMM multiplies
its output by each operand's inverse scale, 1/scale, so a cast hands the GEMM that inverse with the FP8 tensor.
Every GEMM site has three operands that are cast, its *roles*: the input, the weight and the output gradient.

- Dynamic scaling takes scale = FP8 max / amax(x), computed from x itself, so the cast must wait for a full pass
  over x (TorchAO's tensorwise recipe; the same formula and float64 arithmetic, so the numerics match).
- Delayed scaling takes the scale from the amax history of earlier steps, as Transformer Engine's DelayedScaling
  does: scale = FP8 max / (amax * 2^margin), amax being the history's max or its most recent entry. The cast can
  then run in the same pass that produces x, and records x's amax for later steps. Values beyond the range the
  scale covers saturate at the FP8 max, and are counted so a run can report them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# The formats are named here too (re-exported): a cast's callers choose one by these names.
from cs336_basics.kernels.fp8_format import E4M3 as E4M3
from cs336_basics.kernels.fp8_format import E5M2 as E5M2
from cs336_basics.kernels.fp8_format import cast_to_fp8, fp8_max

ROLES = ("input", "weight", "grad")
INPUT, WEIGHT, GRAD = range(3)
# Buffer names per role, read through nn.Module._buffers: the once-per-step update reads some hundreds of them, and
# attribute lookup on a module costs the host a microsecond each.
_AMAX = tuple(f"amax_{role}" for role in ROLES)
_SATURATED = tuple(f"saturated_{role}" for role in ROLES)
_SCALE_INV = tuple(f"scale_inv_{role}" for role in ROLES)
# torchao's floor on amax before dividing by it (torchao/float8/float8_utils.py: EPS): an all-zero tensor gets a
# large finite scale instead of inf.
AMAX_FLOOR = 1e-12


def amax_to_scale(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dynamic scaling's scale for a tensor whose max |value| is `amax` (computed in float64, as torchao does, so
    that eager and compiled code agree)."""
    return (fp8_max(dtype) / torch.clamp(amax.to(torch.float64), min=AMAX_FLOOR)).to(torch.float32)


def dynamic_cast(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x cast to FP8 with dynamic tensorwise scaling (the scale from x's own amax, as torchao's tensorwise recipe),
    and the inverse of that scale (what the GEMM takes)."""
    scale = amax_to_scale(x.abs().amax(), dtype)
    return cast_to_fp8(x, scale, dtype), scale.reciprocal()


def producer_scales(amax: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Dynamic scaling for a producer kernel that writes n tensors: their scales, shape (n,), from their amaxes, and
    the inverses for the GEMMs, one tensor each (a GEMM's scale must not be a view into a larger tensor; SiteScaling
    says why)."""
    scales = amax_to_scale(amax, dtype)
    return scales, tuple(scale.reciprocal() for scale in scales.unbind())


def produce_scales(
    scalings: tuple[SiteScaling, ...], role: int, amax_fn
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The scales, shape (n,), with which a producer kernel casts the n tensors it writes (one per site, each in
    `role`), and their inverses for the GEMMs, one tensor each: with delayed scaling each site's current ones; with
    dynamic scaling those of the amaxes that `amax_fn()` returns (the producer's first pass)."""
    if scalings[0].delayed:
        return torch.stack([site.scale[role] for site in scalings]), tuple(site.scale_inv(role) for site in scalings)
    return producer_scales(amax_fn(), scalings[0].dtypes[role])


# Delayed scaling records a tensor's amax and saturation count row by row. Reducing a tensor row by row runs in the
# same loop as its cast (and as a producer that reduces rows, such as RMSNorm), so inductor computes both in the
# kernel that writes the FP8 tensor; a reduction of the whole tensor to one number would cost a second pass over it
# or a chain of small kernels per cast. Each site keeps one buffer per role and statistic with one entry per row:
# max-accumulating a cast's row results into it is then a pointwise epilogue of that same kernel, with no kernel of
# its own. The entries become one amax per role once per step, in DelayedScalingState.update. A weight has its
# out_features rows; an input or an output gradient has the micro-batch's tokens (`size_row_buffers`), and until
# those are known, or for results of another length, the results are first folded into bins (a small kernel).
# The Triton producers (SwiGLU, RoPE's backward) and, with delayed scaling on CUDA, the weight's cast
# (`cast_transposed`) file their results into these buffers themselves (`producer_rows`).
BINS = 16


def _fold(values: torch.Tensor, length: int, reduce) -> torch.Tensor:
    """`values` (n,) reduced to gcd(n, length) bins and zero-padded to `length` (zero is neutral for an amax and a
    count)."""
    bins = math.gcd(values.numel(), length)
    return F.pad(reduce(values.reshape(bins, -1), dim=-1), (0, length - bins))


class SiteScaling(nn.Module):
    """How one FP8 linear scales its three casts (input, weight, output gradient): dynamically, or, with delayed
    scaling, from its own `scale` buffer (and the inverses the GEMMs take, `scale_inv_<role>`) while max-accumulating
    this step's amaxes into its own buffers.

    Each linear owns its small buffers, one per role and statistic, so that a compiled step updates each in place
    in the kernel that computes it (an update of one shared buffer becomes a copy of that buffer per cast, and a
    graph that updates one buffer for every linear compiles in time that grows much faster than the number of
    linears). The buffers are not in the model's state dict.
    """

    def __init__(self, dtypes: tuple[torch.dtype, torch.dtype, torch.dtype], fast_accum_backward: bool = False,
                 delayed: bool = False, device: torch.device | str | None = None, weight_rows: int = BINS,
                 grad_row: int | None = None):  # fmt: skip
        super().__init__()
        self.dtypes = dtypes
        self.fast_accum_backward = fast_accum_backward
        self.delayed = delayed
        # The output gradient's amax is recorded per `grad_row` features instead of per whole row when its producer
        # writes it in such pieces: q/k/v's gradients come from attention one head at a time, and a reduction over
        # whole token rows across heads compiles into a slow pass of its own
        # (INDEX.md: 2026-11-23-lora-delayed-h200).
        self.grad_row = grad_row
        self._separate_transpose = self._cast_transposed = None  # see transposed() and cast_transposed()
        if not delayed:
            return
        if torch.device(device or "cpu").type == "cuda":
            from cs336_basics.kernels.cast_triton import cast_transposed  # imports triton
            from cs336_basics.kernels.transpose_triton import transpose

            self._separate_transpose, self._cast_transposed = transpose, cast_transposed
        for role in ROLES:
            self._register_row_buffers(role, weight_rows if role == "weight" else BINS, device)
        # Before any history, scale 1: the first step casts unscaled (and warm-up starts at lr 0 anyway). The inverses
        # are kept beside it, written by the same update, so no GEMM launches a kernel to invert one; one buffer per
        # role, as a GEMM's scale must not be a view into a larger tensor (inductor's lowering of _scaled_mm fails on
        # one in torch 2.11).
        self.register_buffer("scale", torch.ones(3, device=device), persistent=False)
        for role in ROLES:
            self.register_buffer(f"scale_inv_{role}", torch.ones((), device=device), persistent=False)

    def _register_row_buffers(self, role: str, rows: int, device) -> None:
        # Counts of one row stay far below 2^31 between two take_saturated() calls (at most the row's length per cast).
        self.register_buffer(f"amax_{role}", torch.zeros(rows, device=device), persistent=False)
        self.register_buffer(f"saturated_{role}", torch.zeros(rows, device=device, dtype=torch.int32), persistent=False)

    def size_row_buffers(self, tokens: int) -> None:
        """One entry per token for the input and gradient recordings (each micro-batch's rows), so that recording
        rides in the casting kernel. Call before the first compiled step: a compiled graph is traced for the sizes
        it first sees."""
        device = self.scale.device
        for role in ("input", "grad"):
            self._register_row_buffers(role, tokens, device)

    def scale_inv(self, role: int) -> torch.Tensor:
        return getattr(self, _SCALE_INV[role])

    def scale_inv_buffers(self) -> list[torch.Tensor]:
        return [self._buffers[name] for name in _SCALE_INV]

    def row_buffers(self, role: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The role's (amax, saturated) row buffers, for a producer kernel that records into them itself."""
        return self._buffers[_AMAX[role]], self._buffers[_SATURATED[role]]

    def producer_rows(self, role: int, record: bool, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The (amax, saturated) row buffers a producer kernel that casts this site's `role` tensor records into: the
        role's own with delayed scaling in training (`record`); otherwise empty stand-ins on `like`'s device, which it
        leaves alone (a custom op that may mutate them still takes tensors)."""
        if record and self.delayed:
            return self.row_buffers(role)
        empty = like.new_empty(0, dtype=torch.float32)
        return empty, empty.to(torch.int32)

    def amax_buffers(self) -> list[torch.Tensor]:
        return [self._buffers[name] for name in _AMAX]

    def saturated_buffers(self) -> list[torch.Tensor]:
        return [self._buffers[name] for name in _SATURATED]

    @property
    def amax(self) -> torch.Tensor:
        """This step's amax per role so far, shape (3,)."""
        return torch.stack([buffer.amax() for buffer in self.amax_buffers()])

    @property
    def saturated(self) -> torch.Tensor:
        """Values saturated per role since the counts were last taken, shape (3,)."""
        return torch.stack([buffer.sum(dtype=torch.int64) for buffer in self.saturated_buffers()])

    def accumulate(self, role: int, amax: torch.Tensor, saturated: torch.Tensor) -> None:
        """Max-accumulate amaxes and add saturation counts (per row, or any number of them) into the role's
        buffers, in place."""
        amax_buffer = getattr(self, f"amax_{ROLES[role]}")
        saturated_buffer = getattr(self, f"saturated_{ROLES[role]}")
        rows = amax_buffer.numel()
        if amax.numel() != rows:
            amax, saturated = _fold(amax, rows, torch.amax), _fold(saturated, rows, torch.sum)
        amax_buffer.copy_(torch.maximum(amax_buffer, amax.float()))
        saturated_buffer.add_(saturated.to(saturated_buffer.dtype))

    def cast(self, x: torch.Tensor, role: int, record: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(FP8 tensor, the inverse of its float32 scale). With delayed scaling and `record`, also max-accumulates
        x's amax (so recomputation under activation checkpointing, or several micro-batches, never record a wrong
        one) and counts the values that saturate."""
        dtype = self.dtypes[role]
        if not self.delayed:
            return dynamic_cast(x, dtype)
        scale = self.scale[role]
        if record:
            row = self.grad_row if role == GRAD and self.grad_row else x.shape[-1]
            magnitude = x.reshape(-1, row).abs()
            saturated = (magnitude.float() * scale > fp8_max(dtype)).sum(dim=-1)
            self.accumulate(role, magnitude.amax(dim=-1), saturated)
        return cast_to_fp8(x, scale, dtype), self.scale_inv(role)

    def transposed(self, x_fp8: torch.Tensor) -> torch.Tensor:
        """x_fp8 (2-D) transposed, row-major, as a backward GEMM takes it. With delayed scaling on CUDA, a kernel of
        its own: inductor would fold it into the kernel that casts and records x by rows, where it writes badly
        (kernels/transpose_triton.py). Dynamic scaling's casts are plain pointwise kernels that write it well
        themselves."""
        if self._separate_transpose is not None and x_fp8.is_cuda:
            return self._separate_transpose(x_fp8)
        return x_fp8.t().contiguous()

    def cast_transposed(
        self, x: torch.Tensor, role: int, record: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`cast` and `transposed` of a 2-D x: (FP8 x, FP8 x^T row-major, the inverse of x's scale). With delayed
        scaling on CUDA one kernel (kernels/cast_triton.py) reads x once and writes both, recording into the role's row
        buffers itself; a weight, cast every step, needs no other pass. Elsewhere the cast and transpose above."""
        if self._cast_transposed is None or not x.is_cuda:
            x_fp8, scale_inv = self.cast(x, role, record)
            return x_fp8, self.transposed(x_fp8), scale_inv
        rows = self.producer_rows(role, record, x)
        x_fp8, x_fp8_t = self._cast_transposed(x, self.scale[role], self.dtypes[role], record, *rows)
        return x_fp8, x_fp8_t, self.scale_inv(role)

    def extra_repr(self) -> str:
        return "delayed" if self.delayed else "dynamic"


def max_over_ranks(amax: torch.Tensor) -> None:
    """Each element of `amax` (on the process group's device: the GPU under NCCL, the CPU under gloo) becomes its
    maximum over the ranks, in place; a NaN on any rank stays a NaN. A backend's maximum is not promised to keep a NaN
    (an fmax-style one drops it), so it travels as +inf and comes back as NaN: an infinite amax then keeps its scale,
    as a NaN does (either stops the run: its loss or gradient norm is not finite)."""
    from cs336_basics.parallel.world import all_reduce_

    torch.nan_to_num_(amax, nan=math.inf, posinf=math.inf)
    all_reduce_(amax, "max")
    amax.masked_fill_(amax == math.inf, math.nan)


class DelayedScalingState(nn.Module):
    """The amax histories of a model's delayed-scaling linears, and the once-per-step update of their scales.

    During a step each SiteScaling reads its `scale` and max-accumulates its amaxes. `update()` runs once per
    optimizer step: it files them into the history (one row per linear, one column per role) and derives the next
    scales, as Transformer Engine's DelayedScaling does. The history is not part of the model's state dict (so
    checkpoints interchange across FP8 paths and BF16); `scaling_state()` / `load_scaling_state()` carry it in a
    checkpoint's extras for exact resume.

    On several processes (`reduce_amax=max_over_ranks`) each step's amaxes are reduced to their maximum over the ranks
    before they are filed, once per step, as Transformer Engine reduces its amaxes: every rank then keeps the same
    history and scales (those of the global batch), so any rank's state, the one a checkpoint keeps, is every rank's.
    Its output gradients' amaxes are those of one rank's tokens per step (`step_tokens`): a resume with another count
    rescales them (load_scaling_state).
    """

    def __init__(self, sites: list[SiteScaling], history_len: int = 16, algo: str = "max", margin: int = 0,
                 one_launch: bool | None = None,
                 reduce_amax: Callable[[torch.Tensor], object] | None = None):  # fmt: skip
        super().__init__()
        if algo not in ("max", "most_recent"):
            raise ValueError(f"amax compute algo must be max or most_recent, got {algo!r}")
        self.sites = tuple(sites)  # not registered: each lives in its linear
        self.history_len = history_len
        self.algo = algo
        self.margin = margin
        self.cursor = 0  # the history column the next update writes
        # The tokens of one optimizer step on this rank (micro-batch tokens x micro-batches; set by set_step_tokens).
        # The backward sees each token's loss divided by this count (a mean per micro-batch, divided by the number of
        # micro-batches), so the output gradients and their recorded amaxes scale with its inverse: a run that
        # resumes with another count (another world size at the same global batch, another batch or accumulation)
        # rescales the saved gradient amaxes to its own, else its first steps cast with scales off by the ratio.
        self.step_tokens: int | None = None
        self.reduce_amax = reduce_amax  # reduces a step's amaxes (one per history row) in place; None: this process's
        device = sites[0].scale.device
        self.register_buffer("history", torch.zeros(len(sites), 3, history_len, device=device), persistent=False)
        limits = torch.tensor([fp8_max(d) for d in sites[0].dtypes], device=device)
        self.register_buffer("limits", limits, persistent=False)
        # `one_launch` (default: on CUDA): update() as one Triton kernel launch, the same arithmetic as the op-by-op
        # update below with a fraction of its host time (kernels/scaling_update_triton.py).
        self._launch = None
        if one_launch if one_launch is not None else device.type == "cuda":
            from cs336_basics.kernels.scaling_update_triton import ScaleUpdateLaunch  # imports triton

            self._launch = ScaleUpdateLaunch()

    def size_row_buffers(self, tokens: int) -> None:
        """Size every site's input and gradient recordings for micro-batches of `tokens` rows (SiteScaling's)."""
        for site in self.sites:
            site.size_row_buffers(tokens)

    def set_step_tokens(self, tokens_per_micro_batch: int, micro_batches: int) -> None:
        """Size the row recordings for micro-batches of `tokens_per_micro_batch` rows and note this rank's tokens per
        optimizer step (`step_tokens`). Call before the first compiled step and before load_scaling_state."""
        self.size_row_buffers(tokens_per_micro_batch)
        self.step_tokens = tokens_per_micro_batch * micro_batches

    @torch.no_grad()
    def update(self) -> None:
        """File this step's amaxes into the history and compute the next step's scales (one kernel launch on CUDA;
        no host synchronisation)."""
        rows = [buffer for site in self.sites for buffer in site.amax_buffers()]
        if self._launch is not None:
            scales = [site.scale for site in self.sites]
            inverses = [buffer for site in self.sites for buffer in site.scale_inv_buffers()]
            self._launch(rows, scales, inverses, self.history, self.limits, self.cursor, self.margin,
                         most_recent=self.algo == "most_recent", reduce=self.reduce_amax)  # fmt: skip
        else:
            self._update_op_by_op(rows)
        self.cursor = (self.cursor + 1) % self.history_len

    def _update_op_by_op(self, rows: list[torch.Tensor]) -> None:
        """The update in torch ops: the CPU path, and the reference the kernel is tested against."""
        amax = torch.stack(torch._foreach_max(rows))
        if self.reduce_amax is not None:
            self.reduce_amax(amax)
        self.history[:, :, self.cursor] = amax.view(len(self.sites), 3)
        amax = self.history.amax(dim=-1) if self.algo == "max" else self.history[:, :, self.cursor]
        old = self._scales()
        # A role with no amax recorded yet (all-zero history) keeps its scale.
        new = torch.where(amax > 0, self.limits / (amax * 2.0**self.margin), old)
        self._set_scales(new)
        torch._foreach_zero_(rows)

    def _scales(self) -> torch.Tensor:
        """Every site's scales, (sites, 3): what _set_scales writes."""
        return torch.stack([site.scale for site in self.sites])

    def _set_scales(self, scales: torch.Tensor) -> None:
        """Every site's scales from `scales` (sites, 3), and their inverses."""
        torch._foreach_copy_([site.scale for site in self.sites], list(scales.unbind(0)))
        inverses = [buffer for site in self.sites for buffer in site.scale_inv_buffers()]
        torch._foreach_copy_(inverses, list(scales.reciprocal().flatten().unbind()))

    def take_saturated(self) -> int:
        """Values cast since the last call that were beyond the scale's range (clamped to the FP8 max); resets."""
        counts = [buffer for site in self.sites for buffer in site.saturated_buffers()]
        total = int(torch.cat(counts).sum(dtype=torch.int64).item())
        torch._foreach_zero_(counts)
        return total

    def scaling_state(self) -> dict:
        return {
            "history": self.history.cpu(), "scale": self._scales().cpu(), "cursor": self.cursor,
            "step_tokens": self.step_tokens,
        }  # fmt: skip

    @torch.no_grad()
    def load_scaling_state(self, state: dict) -> None:
        if tuple(state["history"].shape) != tuple(self.history.shape):
            raise ValueError(
                f"delayed-scaling state of shape {tuple(state['history'].shape)} does not fit this model's "
                f"{tuple(self.history.shape)} (another model, FP8 filter or --fp8_amax_history_len)."
            )
        self.history.copy_(state["history"])
        self._set_scales(state["scale"].to(self.history))
        torch._foreach_zero_([buffer for site in self.sites for buffer in site.amax_buffers()])
        self.cursor = int(state["cursor"])
        saved = state.get("step_tokens")  # None: taken as this run's (the trainer fills an old checkpoint's in)
        if saved and self.step_tokens and saved != self.step_tokens:
            self._rescale_gradients(saved / self.step_tokens)

    def _rescale_gradients(self, factor: float) -> None:
        """The output gradients' amaxes (the history's and the scales derived from them) as if recorded `factor` times
        as large. A role with no amax recorded yet keeps its initial scale, as update() leaves it."""
        grad = self.history[:, GRAD]
        grad.mul_(factor)
        scales = self._scales()
        scales[:, GRAD] = torch.where(grad.amax(dim=-1) > 0, scales[:, GRAD] / factor, scales[:, GRAD])
        self._set_scales(scales)
