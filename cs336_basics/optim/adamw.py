"""AdamW over FP32 master weights, for models whose weights live in BF16/FP16.

Why masters: BF16 keeps 8 bits of mantissa, so near 1.0 its spacing is 2^-8 (below) / 2^-7 (above). A typical
late-training update lr * adam_step ~ 1e-5 .. 1e-6 is far below half that spacing, so `w - update` rounds
straight back to `w` and training silently stalls. Keeping an FP32 copy of every low-precision weight (and
FP32 moments) lets those small updates accumulate; the BF16 weight is refreshed from the master after every
step. FP32 parameters (the CPU path) are optimised in place: there is nothing to gain from a copy.

Why our own update rather than torch.optim.AdamW on the masters: that needs the BF16 grads cast into fp32
copies, a clipping pass over them, AdamW's kernel, and a copy back into the BF16 weights: four passes over
memory, about 52 bytes per parameter. On CUDA, kernels/adamw_triton.py does the whole update in one pass (read the BF16
grad, master and moments; write master, moments and the BF16 weight: 28 bytes per parameter), in one launch per
parameter group rather than one per parameter.
`adamw_update` below is the same formula op by op: the CPU path, and the reference the kernel is tested against;
it is itself tested against torch.optim.AdamW. The gain is measured by lab/optimizer_step.py.

Nothing in `step()` reads a value back to the host, so a training step never waits for the GPU.

Sharded parameters (FSDP2's DTensors): every tensor the optimizer keeps (master, moments) is the size of this rank's
local shard, and the update (the fused kernel on CUDA) runs on the local shards; only the gradient norm for clipping
needs the other ranks (one all-reduce of a scalar, on the device).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from cs336_basics.compiled import plain_name
from cs336_basics.errors import ConfigError
from cs336_basics.optim.clipping import clip_coefficient, global_grad_norm
from cs336_basics.parallel.shards import is_sharded, local_tensor, shard_of

__all__ = ["MasterWeightAdamW", "STATE_DICT_FORMAT", "adamw_update", "fused_by_default"]

# Bumped whenever the layout of `state_dict()` changes incompatibly.
STATE_DICT_FORMAT = "MasterWeightAdamW/v1"

# Dtypes whose rounding would swallow small updates; everything else (fp32, fp64) is stepped in place.
_LOW_PRECISION = (torch.bfloat16, torch.float16)

# Group hyperparameters restored from a checkpoint (torch's usual semantics for load_state_dict).
_RESTORED_HPARAMS = ("lr", "betas", "eps", "weight_decay")


def fused_by_default(device: torch.device) -> bool:
    """Whether MasterWeightAdamW(fused=None) runs the Triton kernel on `device` (the config summary says so)."""
    return device.type == "cuda"


def adamw_update(
    grad: torch.Tensor,
    master: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    lr: torch.Tensor,
    grad_scale: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    param: torch.Tensor | None,
) -> None:
    """One AdamW step (Loshchilov & Hutter, decoupled weight decay) of one tensor, in place, all in fp32.

    `grad` may be BF16; it is multiplied by `grad_scale` (the clipping factor). `master`, `exp_avg`,
    `exp_avg_sq` are fp32 and updated in place; `step` (0-d fp32) is the step number, already incremented.
    `param`, when given, is the low-precision weight that receives the rounded master. The order of operations
    is torch.optim.AdamW's. This is the reference formula and the CPU path; kernels/adamw_triton.py fuses it for CUDA.
    Scalars that change every step (lr, step, grad_scale) are device tensors, so nothing syncs with the host.
    """
    g = grad.float() * grad_scale
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = exp_avg_sq.sqrt() / (1 - beta2**step).sqrt() + eps
    master.sub_(step_size * exp_avg / denom)
    if param is not None:
        param.copy_(master)


class MasterWeightAdamW:
    """AdamW on FP32 master copies of the model's (possibly BF16) parameters, with global-norm clipping.

    Args:
        named_params: `(name, parameter)` pairs, normally `model.named_parameters()` of the uncompiled
            model. Names key the state dict, so checkpoints survive a change of model precision.
        lr, betas, eps, weight_decay: as in torch.optim.AdamW (decoupled weight decay).
        fused: run the update as one Triton kernel launch per parameter group (kernels/adamw_triton.py), and the
            gradient norm as one per gradient dtype (kernels/grad_norm_triton.py). None (default): on CUDA; on CPU the
            same formula runs op by op (`adamw_update`) and the norm with torch's multi-tensor ops (`global_grad_norm`).

    Weight decay applies only to parameters with ndim >= 2 (linear weights, embeddings); 1-D parameters
    (RMSNorm gains, biases) are not decayed: shrinking a gain towards 0 has no regularising meaning.
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, nn.Parameter]],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool | None = None,
    ):
        self._take_parameters(named_params)
        # Two groups, like torch's param_groups: a schedule may set group["lr"]; step() reads it every time.
        self.param_groups: list[dict[str, Any]] = []
        for group_name, decay in (("decay", weight_decay), ("no_decay", 0.0)):
            decayed = group_name == "decay"
            members = [name for name, m in zip(self.names, self.masters, strict=True) if (m.ndim >= 2) == decayed]
            if members:
                self.param_groups.append(
                    {"group_name": group_name, "lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": decay,
                     "param_names": members}
                )  # fmt: skip
        # name -> {"step", "exp_avg", "exp_avg_sq"}; filled the first time a parameter gets a gradient.
        self.state: dict[str, dict[str, torch.Tensor]] = {}
        self.fused = fused_by_default(self.device) if fused is None else fused
        self._grad_norm = global_grad_norm
        if self.fused:
            self._new_launch, grad_norm_launch = self._fused_kernels()
            self._grad_norm = grad_norm_launch()
        # The fused kernel's launches, one per parameter group and dtype, each keeping its address tables.
        self._launches: dict[tuple, Any] = {}
        # Device scalars refreshed in place each step (a fill_ is a kernel launch, never a host sync).
        self._lr = torch.zeros((), device=self.device)
        self._one = torch.ones((), device=self.device)

    def _take_parameters(self, named_params: Iterable[tuple[str, nn.Parameter]]) -> None:
        """The trainable parameters, their names, local data and fp32 masters; refused where AdamW cannot step them."""
        self.names: list[str] = []
        self.params: list[nn.Parameter] = []  # the model's own parameters, any float dtype (DTensors if sharded)
        self.locals: list[torch.Tensor] = []  # each parameter's local data, a plain tensor (all of it if unsharded)
        self.masters: list[torch.Tensor] = []  # what AdamW steps: the local param itself if fp32, else a copy
        seen: set[int] = set()
        for raw_name, p in named_params:
            if not p.requires_grad or id(p) in seen:  # frozen, or a tied weight listed twice
                continue
            if not p.is_floating_point():
                raise ConfigError(f"parameter {raw_name!r} has dtype {p.dtype}; only float weights can train.")
            seen.add(id(p))
            name = plain_name(raw_name)  # names key the state dict: never torch.compile's wrapper names
            if name in self.names:
                raise ConfigError(f"two different parameters are both named {name!r}; names must be unique.")
            self.names.append(name)
            self.params.append(p)
            local = local_tensor(p)
            self.locals.append(local)
            is_low = p.dtype in _LOW_PRECISION
            self.masters.append(local.detach().to(torch.float32).clone() if is_low else local)
        if not self.params:
            raise ConfigError("MasterWeightAdamW got no trainable parameters (none with requires_grad=True).")
        self._index = {name: i for i, name in enumerate(self.names)}
        self.device = self.masters[0].device
        if any(m.device != self.device for m in self.masters):
            raise ConfigError("MasterWeightAdamW needs every parameter on one device.")
        sharded = [is_sharded(p) for p in self.params]
        if any(sharded) and not all(sharded):
            raise ConfigError("MasterWeightAdamW needs every parameter sharded (FSDP2 on the whole model) or none.")
        # The group whose ranks hold the other shards: the gradient norm is summed over it.
        self._shard_group = self.params[0].device_mesh.get_group() if all(sharded) else None

    def _fused_kernels(self) -> tuple[type, type]:
        """The fused kernels' launch classes (kernels/adamw_triton.py, kernels/grad_norm_triton.py), or a ConfigError
        that says why they cannot run here."""
        if self.device.type != "cuda":
            raise ConfigError("the fused AdamW kernel runs on CUDA only; use fused=False on other devices.")
        if not all(p.is_contiguous() for p in self.locals):
            raise ConfigError("the fused AdamW kernel needs contiguous parameters (it writes them as flat arrays).")
        try:
            from cs336_basics.kernels.adamw_triton import AdamWLaunch  # imports triton
            from cs336_basics.kernels.grad_norm_triton import GradNormLaunch
        except ImportError as exc:
            raise ConfigError(
                f"the fused AdamW kernel needs triton ({exc}); it ships with torch's Linux CUDA wheels. "
                "Install triton, or build the optimizer with fused=False (op by op: several times slower steps)."
            ) from exc
        return AdamWLaunch, GradNormLaunch

    # ---- views ----
    def set_lr(self, lr: float) -> None:
        for group in self.param_groups:
            group["lr"] = lr

    def master_params(self) -> dict[str, torch.Tensor]:
        """name -> the fp32 tensor AdamW updates (the parameter itself when it is already fp32)."""
        return dict(zip(self.names, self.masters, strict=True))

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return zip(self.names, self.params, strict=True)

    def _state_for(self, name: str, master: torch.Tensor) -> dict[str, torch.Tensor]:
        if name not in self.state:
            self.state[name] = {
                "step": torch.zeros((), dtype=torch.float32, device=self.device),
                "exp_avg": torch.zeros_like(master, memory_format=torch.contiguous_format),
                "exp_avg_sq": torch.zeros_like(master, memory_format=torch.contiguous_format),
            }
        return self.state[name]

    # ---- the step ----
    @torch.no_grad()
    def step(self, max_grad_norm: float | None = None) -> torch.Tensor:
        """One AdamW update from the gradients now in the model's `.grad`s.

        Clips the global L2 norm of all gradients to `max_grad_norm` (None or inf: no clipping) and returns the
        pre-clip norm as a 0-d fp32 device tensor. The gradients themselves are left as they are: the clipping
        factor is applied inside the update. Parameters without a gradient are skipped, as torch does.
        """
        grads = {  # each gradient's local part (this rank's shard under FSDP2), taken once for the norm and update
            name: local_tensor(p.grad) for name, p in zip(self.names, self.params, strict=True) if p.grad is not None
        }
        if not grads:
            return torch.zeros((), device=self.device)
        norm = self._grad_norm(list(grads.values()))  # accumulated in fp32 straight from the BF16 grads
        if self._shard_group is not None:  # this rank's shards only: sum the squares over the ranks
            import torch.distributed as dist

            norm_sq = norm.square()
            dist.all_reduce(norm_sq, group=self._shard_group)
            norm = norm_sq.sqrt()
        if max_grad_norm is not None and max_grad_norm < float("inf"):
            grad_scale = clip_coefficient(norm, max_grad_norm)
        else:
            grad_scale = self._one

        states = {name: self._state_for(name, self.masters[self._index[name]]) for name in grads}
        torch._foreach_add_([s["step"] for s in states.values()], 1.0)  # one launch for every step counter
        for group in self.param_groups:
            self._lr.fill_(group["lr"])  # reusable: kernels run in stream order, the last group read it already
            hparams = (*group["betas"], group["eps"], group["weight_decay"])
            # Per tensor: (grad, master, exp_avg, exp_avg_sq, step, the low-precision weight to write or None).
            tensors = [
                (grads[name], self.masters[i], s["exp_avg"], s["exp_avg_sq"], s["step"],
                 None if self.masters[i] is self.locals[i] else self.locals[i])
                for name, i, s in ((name, self._index[name], states.get(name)) for name in group["param_names"])
                if s is not None and self.locals[i].numel() > 0  # an empty shard: a rank's part of a small parameter
            ]  # fmt: skip
            if self.fused:
                self._launch_fused(group["group_name"], tensors, grad_scale, hparams)
            else:
                for grad, master, exp_avg, exp_avg_sq, step, param in tensors:
                    adamw_update(grad, master, exp_avg, exp_avg_sq, step, self._lr, grad_scale, *hparams, param)
        return norm

    def _launch_fused(self, group_name: str, tensors: list[tuple], grad_scale: torch.Tensor, hparams: tuple) -> None:
        """A group's update in one kernel launch per (gradient dtype, weight dtype) among its tensors: one, as a
        rule."""
        launches: dict[tuple, list[tuple]] = {}
        for row in tensors:
            kind = (group_name, row[0].dtype, None if row[-1] is None else row[-1].dtype)
            launches.setdefault(kind, []).append(row)
        for kind, rows in launches.items():
            grads, masters, exp_avgs, exp_avg_sqs, steps, params = map(list, zip(*rows, strict=True))
            if kind not in self._launches:
                self._launches[kind] = self._new_launch()
            self._launches[kind](grads, masters, exp_avgs, exp_avg_sqs, steps, self._lr, grad_scale, *hparams,
                                 None if kind[2] is None else params)  # fmt: skip

    @torch.no_grad()
    def state_is_finite(self) -> bool:
        """Whether every master weight and moment is finite (one host sync: call it at checkpoint time only)."""
        tensors = [*self.masters, *(s[k] for s in self.state.values() for k in ("exp_avg", "exp_avg_sq"))]
        return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients."""
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    # ---- checkpoints ----
    def state_dict(self) -> dict[str, Any]:
        """A name-keyed snapshot, independent of parameter order and of the model's precision.

        Layout (plain dicts/lists/tuples/numbers/strings/tensors, so `torch.load(weights_only=True)` reads it):
            format:       STATE_DICT_FORMAT
            param_names:  [name, ...]
            param_groups: [{group_name, lr, betas, eps, weight_decay, param_names}, ...]
            state:        {name: {"step", "exp_avg", "exp_avg_sq"}}   (names that have been stepped)
            master:       {name: fp32 tensor}                         (every parameter)

        Tensors are references to live state, like torch's own optimisers (no copy of GPU memory):
        serialise the dict before stepping again. With sharded parameters they are this rank's local shards.
        """
        return {
            "format": STATE_DICT_FORMAT,
            "param_names": list(self.names),
            "param_groups": [dict(g, param_names=list(g["param_names"])) for g in self.param_groups],
            "state": {name: dict(s) for name, s in self.state.items()},
            # detach(): store plain tensors, never nn.Parameter objects.
            "master": {name: m.detach() for name, m in zip(self.names, self.masters, strict=True)},
        }

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from `state_dict()`, matching parameters by name.

        Works across a change of model precision. Load the model's weights first: the fp32 masters from the
        checkpoint then overwrite them, so a BF16 -> FP32 switch recovers the full-precision weights rather
        than their BF16 rounding, and an FP32 -> BF16 switch keeps the exact fp32 values as masters.
        All tensors are copied, so the optimiser never shares storage with `state_dict`. With sharded parameters a
        tensor may be whole (a checkpoint of another world size, or of one process): this rank takes its shard.
        """
        if not isinstance(state_dict, dict) or state_dict.get("format") != STATE_DICT_FORMAT:
            found = state_dict.get("format") if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ConfigError(
                f"optimizer state has format {found!r}, expected {STATE_DICT_FORMAT!r}; it was not written by "
                "MasterWeightAdamW.state_dict() (or by an incompatible version). Start the optimizer fresh."
            )
        saved_names = list(state_dict["param_names"])
        missing = [n for n in self.names if n not in set(saved_names)]
        unexpected = [n for n in saved_names if n not in self._index]
        if missing or unexpected:
            raise ConfigError(
                "optimizer state does not match the model's parameters: "
                f"missing from the checkpoint: {missing or 'none'}; not in the model: {unexpected or 'none'}. "
                "Resume with the model configuration the checkpoint was written with."
            )
        masters = {name: self._as_local(name, saved) for name, saved in state_dict["master"].items()}

        saved_groups = {g.get("group_name"): g for g in state_dict["param_groups"]}
        for group in self.param_groups:
            old = saved_groups.get(group["group_name"], {})
            group.update({k: (tuple(old[k]) if k == "betas" else old[k]) for k in _RESTORED_HPARAMS if k in old})
        self.state = {
            name: {
                key: (value if key == "step" else self._as_local(name, value))
                .detach()
                .to(device=self.device, dtype=torch.float32, copy=True)
                for key, value in saved.items()
            }
            for name, saved in state_dict["state"].items()
        }
        for name, local, m in zip(self.names, self.locals, self.masters, strict=True):
            m.copy_(masters[name])  # fp32 param: writes the exact stored weight into the model
            if m is not local:
                local.copy_(m)  # low-precision param: round the master once, as step() does

    def _as_local(self, name: str, saved: torch.Tensor) -> torch.Tensor:
        """A saved master or moment as this rank holds it: as it is, or this rank's shard of a whole tensor."""
        i = self._index[name]
        param, local = self.params[i], self.locals[i]
        if is_sharded(param) and tuple(saved.shape) == tuple(param.shape) != tuple(local.shape):
            return shard_of(saved, param)
        if tuple(saved.shape) != tuple(local.shape):
            raise ConfigError(
                f"parameter {name!r} has shape {tuple(param.shape)} but the checkpoint has {tuple(saved.shape)}; "
                "resume with the model configuration the checkpoint was written with."
            )
        return saved
