"""AdamW over FP32 master weights, for models whose weights live in BF16/FP16.

Why masters: BF16 keeps 8 bits of mantissa, so near 1.0 its spacing is 2^-8 (below) / 2^-7 (above). A typical
late-training update lr * adam_step ~ 1e-5 .. 1e-6 is far below half that spacing, so `w - update` rounds
straight back to `w` and training silently stalls. Keeping an FP32 copy of every low-precision weight (and
FP32 moments) lets those small updates accumulate; the BF16 weight is refreshed from the master after every
step. FP32 parameters (the CPU path) are optimised in place: there is nothing to gain from a copy.

Nothing in `step()` reads a value back to the host, so a training step never waits for the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from cs336_basics.errors import ConfigError

__all__ = ["MasterWeightAdamW", "STATE_DICT_FORMAT"]

# Bumped whenever the layout of `state_dict()` changes incompatibly.
STATE_DICT_FORMAT = "MasterWeightAdamW/v1"

# Dtypes whose rounding would swallow small updates; everything else (fp32, fp64) is stepped in place.
_LOW_PRECISION = (torch.bfloat16, torch.float16)

# Group hyperparameters restored from a checkpoint. Implementation switches (fused, foreach, capturable) are
# deliberately NOT restored: they describe the machine that wrote the checkpoint, not the one resuming it
# (a fused-CUDA checkpoint must still load into a CPU run).
_RESTORED_HPARAMS = ("lr", "betas", "eps", "weight_decay")

# torch.compile wraps a module as `_orig_mod`; parameter names taken from the wrapper would carry this
# prefix, and names are the keys of our state dict, so they are normalised to the plain module's names.
_COMPILE_PREFIX = "_orig_mod."


def _clean_name(name: str) -> str:
    return name.replace(_COMPILE_PREFIX, "")


class MasterWeightAdamW:
    """torch.optim.AdamW on FP32 tensors, mirrored into the model's (possibly BF16) parameters.

    Args:
        named_params: `(name, parameter)` pairs, normally `model.named_parameters()` of the uncompiled
            model. Names key the state dict, so checkpoints survive a change of model precision.
        lr, betas, eps, weight_decay: as in torch.optim.AdamW (decoupled weight decay).
        fused: None picks the fused CUDA kernel when every parameter is on CUDA, otherwise the foreach
            implementation. True/False force the choice (torch supports fused AdamW on CPU too).

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
        self.names: list[str] = []
        self.params: list[nn.Parameter] = []  # the model's own parameters, any float dtype
        self.masters: list[torch.Tensor] = []  # what AdamW steps: the param itself if fp32, else a copy
        seen: set[int] = set()
        for raw_name, p in named_params:
            if not p.requires_grad or id(p) in seen:  # frozen, or a tied weight listed twice
                continue
            if not p.is_floating_point():
                raise ConfigError(f"parameter {raw_name!r} has dtype {p.dtype}; only float weights can train.")
            seen.add(id(p))
            name = _clean_name(raw_name)
            if name in self.names:
                raise ConfigError(f"two different parameters are both named {name!r}; names must be unique.")
            self.names.append(name)
            self.params.append(p)
            if p.dtype in _LOW_PRECISION:
                # A detached fp32 leaf: it needs no autograd history, only a .grad slot that step() fills.
                self.masters.append(p.detach().to(torch.float32).clone())
            else:
                self.masters.append(p)
        if not self.params:
            raise ConfigError("MasterWeightAdamW got no trainable parameters (none with requires_grad=True).")
        self._index = {name: i for i, name in enumerate(self.names)}
        # Positions (into self.params) of the parameters that need mirroring through a master copy.
        self._lowp = [i for i, p in enumerate(self.params) if p.dtype in _LOW_PRECISION]

        groups: list[dict[str, Any]] = []
        for group_name, decay in (("decay", weight_decay), ("no_decay", 0.0)):
            members = [i for i, m in enumerate(self.masters) if (m.ndim >= 2) == (group_name == "decay")]
            if members:  # torch rejects empty groups
                # Named params: torch keeps them as the group's "param_names", which load_state_dict uses.
                groups.append(
                    {
                        "params": [(self.names[i], self.masters[i]) for i in members],
                        "weight_decay": decay,
                        "group_name": group_name,
                    }
                )

        all_cuda = all(m.device.type == "cuda" for m in self.masters)
        use_fused = all_cuda if fused is None else fused
        # foreach on CPU too: torch's auto choice there is the per-tensor loop; the foreach path (with its
        # CPU fallback) computes the same formula and keeps one code path across devices.
        self._inner = torch.optim.AdamW(
            groups,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            fused=True if use_fused else None,
            foreach=None if use_fused else True,
        )

    # ---- views ----
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimiser's groups: a schedule may set `group["lr"]` directly."""
        return self._inner.param_groups

    @property
    def inner(self) -> torch.optim.AdamW:
        return self._inner

    def set_lr(self, lr: float) -> None:
        for group in self._inner.param_groups:
            group["lr"] = lr

    def master_params(self) -> dict[str, torch.Tensor]:
        """name -> the fp32 tensor AdamW updates (the parameter itself when it is already fp32)."""
        return dict(zip(self.names, self.masters, strict=True))

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        return zip(self.names, self.params, strict=True)

    # ---- the step ----
    @torch.no_grad()
    def step(self, max_grad_norm: float | None = None) -> torch.Tensor:
        """One AdamW update from the gradients now in the model's `.grad`s.

        Clips the global L2 norm of all gradients to `max_grad_norm` (None: no clipping) and returns the
        pre-clip norm as a 0-d fp32 device tensor; nothing is read back to the host.
        """
        # (1) Low-precision grads -> fp32 master grads. Those buffers exist only during step(): holding
        # 4 bytes/param across forward and backward would be pure waste. Params without a grad get none,
        # so AdamW skips them exactly as it would skip the parameter itself.
        dst, src = [], []
        for i in self._lowp:
            p, m = self.params[i], self.masters[i]
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None:
                m.grad = torch.empty_like(m)
            dst.append(m.grad)
            src.append(p.grad)
        if dst:
            torch._foreach_copy_(dst, src)  # one multi-tensor launch, casting bf16 -> fp32

        # (2) Global-norm clipping over the fp32 grads. foreach=None lets torch use its multi-tensor kernels
        # where the device has them (CUDA) and a loop elsewhere: foreach=True would raise on CPU.
        with_grad = [m for m in self.masters if m.grad is not None]
        if max_grad_norm is not None and math.isfinite(max_grad_norm):
            norm = torch.nn.utils.clip_grad_norm_(with_grad, max_grad_norm, foreach=None)
        else:
            # Norm only, for logging: no pointless multiply of every gradient by 1.
            norm = torch.nn.utils.get_total_norm([m.grad for m in with_grad], foreach=None)

        # (3) The update itself, entirely in fp32.
        self._inner.step()

        # (4) Masters -> model weights (rounded once, to nearest), then free the transient fp32 grads.
        updated = [i for i in self._lowp if self.masters[i].grad is not None]
        if updated:
            torch._foreach_copy_([self.params[i] for i in updated], [self.masters[i] for i in updated])
        for i in updated:
            self.masters[i].grad = None
        return norm.to(torch.float32)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (and any leftover master gradients)."""
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()
        for i in self._lowp:
            self.masters[i].grad = None

    # ---- checkpoints ----
    def state_dict(self) -> dict[str, Any]:
        """A name-keyed snapshot, independent of parameter order and of the model's precision.

        Layout (plain dicts/lists/tuples/numbers/strings/tensors, so `torch.load(weights_only=True)` reads it):
            format:       STATE_DICT_FORMAT
            param_names:  [name, ...]
            param_groups: [{group_name, lr, betas, eps, weight_decay, param_names, ...}, ...]
            state:        {name: {"step", "exp_avg", "exp_avg_sq"}}   (names that have been stepped)
            master:       {name: fp32 tensor}                         (every parameter)

        Tensors are references to live state, like torch's own optimisers (no copy of GPU memory):
        serialise the dict before stepping again.
        """
        inner_state = self._inner.state
        state = {}
        for name, m in zip(self.names, self.masters, strict=True):
            if m in inner_state and inner_state[m]:
                state[name] = dict(inner_state[m])
        groups = []
        for g in self._inner.param_groups:
            groups.append({k: v for k, v in g.items() if k != "params"})
        return {
            "format": STATE_DICT_FORMAT,
            "param_names": list(self.names),
            "param_groups": groups,
            "state": state,
            # detach(): store plain tensors, never nn.Parameter objects.
            "master": {name: m.detach() for name, m in zip(self.names, self.masters, strict=True)},
        }

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from `state_dict()`, matching parameters by name.

        Works across a change of model precision. Load the model's weights first: the fp32 masters from the
        checkpoint then overwrite them, so a BF16 -> FP32 switch recovers the full-precision weights rather
        than their BF16 rounding, and an FP32 -> BF16 switch keeps the exact fp32 values as masters.
        All tensors are copied, so the optimiser never shares storage with `state_dict`.
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
        masters = state_dict["master"]
        for name, m in zip(self.names, self.masters, strict=True):
            saved = masters[name]
            if tuple(saved.shape) != tuple(m.shape):
                raise ConfigError(
                    f"parameter {name!r} has shape {tuple(m.shape)} but the checkpoint has "
                    f"{tuple(saved.shape)}; resume with the model configuration the checkpoint was written with."
                )

        # Inner AdamW state in torch's positional layout, built from the name-keyed one. Our own groups'
        # settings are kept, except the hyperparameters in _RESTORED_HPARAMS (torch's usual semantics).
        saved_groups = {g.get("group_name"): g for g in state_dict["param_groups"]}
        groups, state, position = [], {}, 0
        for g in self._inner.param_groups:
            new = {k: v for k, v in g.items() if k != "params"}
            old = saved_groups.get(g["group_name"], {})
            new.update({k: old[k] for k in _RESTORED_HPARAMS if k in old})
            ids = []
            for name in g["param_names"]:
                ids.append(position)
                if name in state_dict["state"]:
                    state[position] = {
                        # "step" stays a CPU scalar (torch moves it to the device itself for fused/capturable);
                        # a CUDA step for the foreach path would force a host sync on every bias correction.
                        k: (v.detach().to("cpu", torch.float32).clone() if k == "step" else v.detach().clone())
                        for k, v in state_dict["state"][name].items()
                    }
                position += 1
            new["params"] = ids
            groups.append(new)
        self._inner.load_state_dict({"state": state, "param_groups": groups})

        for name, p, m in zip(self.names, self.params, self.masters, strict=True):
            m.copy_(masters[name])  # fp32 param: writes the exact stored weight into the model
            if m is not p:
                p.copy_(m)  # low-precision param: round the master once, as step() does
