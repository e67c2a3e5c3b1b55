"""--init_from: the weights a fine-tune starts from, and the model shape they imply.

Three kinds of base are read: a run folder (its checkpoint.pt, its config.json's shape and its tokenizer), a
checkpoint file written by the trainer (or by `cs336_basics.programs.export`), and a course-layout state dict (a .pt
file holding the model's tensors alone, as the course's `save_checkpoint` or `torch.save(model.state_dict())` write
it). The shape comes from the base: a checkpoint's saved config gives every field; a bare state dict gives the
sizes its tensors have (dim, layers, d_ff, vocab), and the rest (heads, context length, ...) comes from the flags. A
shape flag given on the command line that disagrees with the base is an error, never silently overridden.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cs336_basics.config import with_fixed_shape
from cs336_basics.errors import ConfigError
from cs336_basics.files.integrity import verify_zip
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, is_sharded_checkpoint, read_checkpoint

# ModelConfig fields that are the model's shape (the rest, e.g. attention backend or checkpointing, are how it runs).
SHAPE_FIELDS = (
    "vocab_size", "context_length", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size", "rope_theta",
    "norm_eps", "tie_embeddings",
)  # fmt: skip
TOKENIZER_DIR = "tokenizer"


@dataclass(frozen=True)
class Base:
    path: Path  # the file the weights were read from
    state: dict[str, torch.Tensor]  # plain (course-layout) keys
    shape: dict[str, Any]  # the ModelConfig fields the base fixes
    tokenizer: Path | None  # the base run's tokenizer folder, if it has one
    kind: str  # "run folder", "checkpoint" or "state dict"
    lora: bool = False  # a LoRA run's checkpoint (adapters only)
    kv_dim: int | None = None  # a bare state dict's k_proj outputs: checked against the heads the flags give

    def whole(self) -> Base:
        """This base, if it is a whole model; a ConfigError saying what to do if it is a LoRA run's adapters."""
        if self.lora:
            raise ConfigError(
                f"--init_from {self.path} is a LoRA run's checkpoint: it holds adapters, not a whole model. Merge "
                f"them into their base first (python -m cs336_basics.programs.merge_lora {self.path.parent} --output "
                "merged.pt) and start from merged.pt."
            )
        return self


def base_tokenizer(init_from: str) -> Path | None:
    """The tokenizer of the run --init_from names (a run folder, or a checkpoint.pt in one), without reading the base;
    None for a state dict (a merged or exported file), which carries none."""
    path = Path(init_from).expanduser()
    tokenizer = (path if path.is_dir() else path.parent) / TOKENIZER_DIR
    return tokenizer if (path.is_dir() or path.name == CHECKPOINT_NAME) and tokenizer.is_dir() else None


def read_base(init_from: str) -> Base:
    """Read --init_from (mapped, not copied: a large base costs no memory until used). ConfigError if it is not a
    base this package can start from."""
    path = Path(init_from).expanduser()
    if path.is_dir():
        if not (path / CHECKPOINT_NAME).is_file():
            raise ConfigError(f"--init_from {path}: a folder, but it holds no {CHECKPOINT_NAME}; is it a run folder?")
        return dataclasses.replace(
            _from_checkpoint(path / CHECKPOINT_NAME, kind="run folder"), tokenizer=base_tokenizer(init_from)
        )
    if not path.is_file():
        raise ConfigError(f"--init_from {path}: no such file or folder.")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise ConfigError(
            f"--init_from {path} could not be read as a torch file ({type(exc).__name__}); point at a run folder, a "
            "checkpoint.pt or a state dict saved with torch.save."
        ) from exc
    if isinstance(raw, dict) and "format" in raw:  # read_checkpoint checks its checksums
        return dataclasses.replace(_from_checkpoint(path, kind="checkpoint"), tokenizer=base_tokenizer(init_from))
    verify_zip(path)  # a damaged file is an error naming it; a legacy torch file carries no checksums to check
    state = raw.get("model_state_dict", raw) if isinstance(raw, dict) else None  # the course's checkpoint layout too
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"--init_from {path} holds no state dict of tensors.")
    shape, kv_dim = shape_of_state(state, path)
    state = dict(state)
    if shape["tie_embeddings"]:  # a tied model's keys name the shared weight twice
        state.setdefault("lm_head.weight", state["token_embeddings.weight"])
    return Base(path, state, shape, None, "state dict", kv_dim=kv_dim)


def _from_checkpoint(path: Path, kind: str) -> Base:
    ckpt = read_checkpoint(path, mmap=True)
    if is_sharded_checkpoint(ckpt):
        raise ConfigError(
            f"--init_from {path}: a sharded (FSDP2) checkpoint; write it as one file first: "
            f"python -m cs336_basics.programs.export {path.parent} --output base.pt, then --init_from base.pt."
        )
    saved = ckpt["config"]
    lora = saved.get("finetune", {}).get("lora_rank") is not None
    shape = {k: v for k, v in saved["model"].items() if k in SHAPE_FIELDS}
    return Base(path, ckpt["model"], shape, None, kind, lora)


def shape_of_state(state: dict[str, torch.Tensor], path: Path) -> tuple[dict[str, Any], int]:
    """The shape fields a course-layout state dict's tensors fix, and its key/value projection's output size."""
    try:
        vocab, dim = state["token_embeddings.weight"].shape
        layers = {int(k.split(".")[1]) for k in state if k.startswith("layers.")}
        d_ff = state["layers.0.ffn.w1.weight"].shape[0]
        kv_out = state["layers.0.attn.k_proj.weight"].shape[0]
    except (KeyError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"--init_from {path}: not a state dict of this model's layout (missing or odd {exc}); expected keys like "
            "token_embeddings.weight, layers.0.attn.q_proj.weight, lm_head.weight."
        ) from exc
    shape = {"vocab_size": vocab, "dim": dim, "n_layers": max(layers) + 1, "intermediate_size": d_ff}
    # Tied: no head of its own, or (a tied model's state_dict(), saved with torch.save) one tensor under both names.
    head = state.get("lm_head.weight")
    shape["tie_embeddings"] = head is None or _same_tensor(head, state["token_embeddings.weight"])
    return shape, kv_out  # heads are not in the tensors' sizes: the flags give them, checked against kv_out


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr(), a.storage_offset(), a.shape, a.stride()) == (
        b.untyped_storage().data_ptr(), b.storage_offset(), b.shape, b.stride()
    )  # fmt: skip


def model_settings_from_base(base: Base, model: dict[str, Any], explicit: dict[str, Any]) -> dict[str, Any]:
    """The model section with the base's shape: `model` the resolved settings, `explicit` those given on the command
    line (or a config file). ConfigError where an explicit setting disagrees with the base."""
    fix = "Drop those flags (or point at a base of that shape)."
    merged = with_fixed_shape(model, base.shape, explicit, f"--init_from {base.path}", "the base", fix)
    kv_dim = base.kv_dim
    if kv_dim is not None:
        heads = merged["n_heads"]
        kv_heads = merged.get("n_kv_heads") or heads
        if merged["dim"] % heads or kv_dim != kv_heads * (merged["dim"] // heads):
            raise ConfigError(
                f"--init_from {base.path}: its key/value projection has {kv_dim} outputs, which --n_heads {heads} "
                f"and --n_kv_heads {kv_heads} at dim {merged['dim']} do not give; pass the base's --n_heads and "
                "--n_kv_heads (a state dict does not record them)."
            )
    return merged


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over a state dict's names, dtypes, shapes and bytes: which base a LoRA run's adapters belong to (a base
    trained further, or another file at the same path, has another)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def load_base(model: torch.nn.Module, init_from: str, expected_sha256: str | None = None) -> tuple[Base, str]:
    """Load --init_from's weights into `model` (built with the base's shape), strictly: every key, every shape.
    Returns the base and its weights' SHA-256; ConfigError if `expected_sha256` is given and differs (the adapters
    were trained on other weights)."""
    from cs336_basics.training.checkpoint import load_model_state

    base = read_base(init_from).whole()
    sha256 = weights_sha256(base.state)
    if expected_sha256 is not None and sha256 != expected_sha256:
        raise ConfigError(
            f"--init_from {base.path}: these weights (SHA-256 {sha256[:12]}...) are not the base this LoRA run was "
            f"started on ({expected_sha256[:12]}...); the base was changed or replaced since. Point --init_from at "
            "the original base, or start a new fine-tune on this one."
        )
    load_model_state(model, base.state, str(base.path))
    return base, sha256
