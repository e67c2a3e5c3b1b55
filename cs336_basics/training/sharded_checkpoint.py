"""Sharded checkpoints of FSDP2 runs: written by every rank together with torch.distributed.checkpoint (DCP),
atomically, loadable at any world size (and in one process), and exportable to the single-file layout.

A sharded checkpoint is, in the run folder:
    checkpoint.shards/step-<step>-<id>/   the tensors: DCP's files (one per rank) and its .metadata
    checkpoint.pt                         the rest, format v1-sharded: step, config, sampler, RNG, the optimizer's
                                          non-tensor state, the model's keys, which shard folder holds the tensors
                                          and the CRC-32 of each of its files (checked when it is read)
Atomicity: the shard folder is new for every save and complete when DCP returns on every rank; only then does rank 0
write checkpoint.pt (atomically, training/checkpoint.py's rule) and remove the shard folders it no longer names. A
crash at any point leaves a checkpoint.pt that names a complete folder; a folder it does not name is removed when the
run folder is next used. All ranks write into the run folder: one machine, or a filesystem every node shares.

DCP keys are flat and unambiguous (parameter names contain dots): "model/<key>", and per parameter "master/<name>",
"exp_avg/<name>", "exp_avg_sq/<name>", "step/<name>". Sharded tensors are saved as DTensors, which is what lets DCP
re-cut them for another world size when they are loaded.
"""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cs336_basics.config import RunConfig
from cs336_basics.errors import ConfigError, RunFolderError
from cs336_basics.files.integrity import files_crc32, save_torch_file
from cs336_basics.parallel.shards import is_sharded, local_tensor, sharded_like
from cs336_basics.parallel.world import broadcast_text, current_world, main_writes
from cs336_basics.training.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    SHARDED_FORMAT,
    SHARDS_DIR,
    check_model_keys,
    checkpoint_file,
    checkpoint_payload,
    is_sharded_checkpoint,
    model_state,
    read_checkpoint,
    referenced_shards,
    remove_stale_shards,
)

_OPTIMIZER_META = ("format", "param_names", "param_groups")
_MOMENTS = ("exp_avg", "exp_avg_sq")


def _as_saved(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    return sharded_like(local, param) if is_sharded(param) else local


def _tensors(model: nn.Module, optimizer: Any) -> dict[str, torch.Tensor]:
    """Everything a checkpoint holds as tensors, under DCP keys."""
    out = {f"model/{k}": _as_saved(local_tensor(t), t) for k, t in model_state(model).items()}
    state = optimizer.state_dict()
    params = dict(optimizer.named_parameters())
    for name, master in state["master"].items():
        out[f"master/{name}"] = _as_saved(master, params[name])
    for name, s in state["state"].items():
        out[f"step/{name}"] = s["step"]
        for key in _MOMENTS:
            out[f"{key}/{name}"] = _as_saved(s[key], params[name])
    return out


def save_sharded(
    run_dir: Path,
    *,
    model: nn.Module,
    optimizer: Any,
    step: int,
    config: dict,
    sampler_state: dict | None,
    extra: dict | None,
) -> Path:
    """Write a sharded checkpoint of this step (every rank calls this; see the module docstring). Returns the path of
    checkpoint.pt. A failure on any rank raises on every rank, and the previous checkpoint stays."""
    import torch.distributed.checkpoint as dcp

    world = current_world()
    run_dir = Path(run_dir)
    name = f"step-{step:09d}-{broadcast_text(uuid.uuid4().hex[:8])}"  # a new folder per save, named by rank 0
    tensors = _tensors(model, optimizer)
    try:
        dcp.save(tensors, checkpoint_id=run_dir / SHARDS_DIR / name)  # collective: fails on every rank or none
    except dcp.CheckpointException as exc:  # a BaseException: made the run-folder error every writer raises
        where = run_dir / SHARDS_DIR
        raise RunFolderError(f"the shards of step {step} could not be written to {where}: {exc}") from exc
    state = optimizer.state_dict()
    meta = {k: state[k] for k in _OPTIMIZER_META} | {"state_names": list(state["state"])}
    path = run_dir / CHECKPOINT_NAME
    payload = checkpoint_payload(
        model=None,
        optimizer=meta,
        step=step,
        config=config,
        sampler_state=sampler_state,
        extra=extra,
        format=SHARDED_FORMAT,
        shards=name,
        world_size=world.world_size,
        model_keys=[k.removeprefix("model/") for k in tensors if k.startswith("model/")],
    )

    def write() -> None:
        # DCP's files carry no checksum: checkpoint.pt records theirs, checked whenever it is read.
        payload["shard_crc32"] = files_crc32(run_dir / SHARDS_DIR / name)
        save_torch_file(path, payload)
        remove_stale_shards(run_dir)

    main_writes(world, write, str(path))
    return path


def _read_shards(shards_path: str, template: dict[str, torch.Tensor], no_dist: bool) -> None:
    import torch.distributed.checkpoint as dcp

    try:
        with warnings.catch_warnings():
            # DCP warns that it loads "in a single process" even when asked to (no_dist=True): that is the intent.
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(template, checkpoint_id=shards_path, no_dist=no_dist)
    # DCP gathers the ranks' errors into a CheckpointException, a BaseException; a single process raises them as is.
    except (Exception, dcp.CheckpointException) as exc:  # noqa: BLE001
        raise ConfigError(
            f"the sharded checkpoint in {shards_path} could not be read ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else 'no details'}); it may be incomplete "
            "or from another model. Point at another checkpoint."
        ) from exc


def assemble_sharded(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A sharded checkpoint (read by read_checkpoint) as the whole-tensor layout of a one-process checkpoint: every
    shard read by this process alone, into CPU tensors."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(ckpt["shards_path"]).read_metadata().state_dict_metadata
    template = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    _read_shards(ckpt["shards_path"], template, no_dist=True)
    meta = ckpt["optimizer"]
    model = {k: template[f"model/{k}"] for k in ckpt["model_keys"]}
    optimizer = {k: meta[k] for k in _OPTIMIZER_META}
    optimizer["master"] = {n: template[f"master/{n}"] for n in meta["param_names"]}
    optimizer["state"] = {
        n: {"step": template[f"step/{n}"], **{k: template[f"{k}/{n}"] for k in _MOMENTS}} for n in meta["state_names"]
    }
    whole = {k: v for k, v in ckpt.items() if k not in ("shards", "shards_path", "model_keys", "world_size")}
    return whole | {"format": CHECKPOINT_FORMAT, "model": model, "optimizer": optimizer}


def restore_sharded_model(ckpt: dict[str, Any], *, model: nn.Module, optimizer: Any) -> None:
    """Restore a checkpoint of either kind into an FSDP2-sharded model and its optimizer. Each rank takes its shard:
    of the whole tensors of a one-process (or DDP) checkpoint, or, from a sharded one, straight from the shard files
    (DCP re-cuts them when the world size changed). The parameters get their values from the fp32 masters, as
    MasterWeightAdamW.load_state_dict writes them."""
    path = ckpt.get("path", "the checkpoint")
    if optimizer is None:
        raise ConfigError("restoring a sharded model needs its optimizer: the weights come from its fp32 masters.")
    if not is_sharded_checkpoint(ckpt):
        check_model_keys(model, ckpt["model"], path)
        if ckpt.get("optimizer") is None:
            raise ConfigError(f"{path} holds no optimizer state; it cannot resume training, only initialise a model.")
        optimizer.load_state_dict(ckpt["optimizer"])
        return
    check_model_keys(model, ckpt["model_keys"], path)
    meta = ckpt["optimizer"]
    params = dict(optimizer.named_parameters())
    masters = optimizer.master_params()
    names = [n for n in meta["param_names"] if n in params]  # load_state_dict below names any mismatch
    template: dict[str, torch.Tensor] = {}
    state: dict[str, Any] = {k: meta[k] for k in _OPTIMIZER_META} | {"master": {}, "state": {}}
    for n in names:
        state["master"][n] = torch.empty_like(masters[n])
        template[f"master/{n}"] = _as_saved(state["master"][n], params[n])
    for n in (n for n in meta["state_names"] if n in params):
        s = state["state"][n] = {"step": torch.zeros((), device=masters[n].device)}
        template[f"step/{n}"] = s["step"]
        for key in _MOMENTS:
            s[key] = torch.empty_like(masters[n])
            template[f"{key}/{n}"] = _as_saved(s[key], params[n])
    _read_shards(ckpt["shards_path"], template, no_dist=False)
    optimizer.load_state_dict(state)


# A read of a run's sharded checkpoint made again where the run replaced it meanwhile (read_whole_checkpoint).
READ_ATTEMPTS = 3


def read_whole_checkpoint(path: Path) -> dict[str, Any]:
    """read_checkpoint, a sharded checkpoint assembled into the one-process layout (on the CPU). A run still training
    may replace its sharded checkpoint while it is read: its checkpoint.pt names the next shard folder, then the one
    being read is removed. Such a read is made again from the checkpoint named now, up to READ_ATTEMPTS times; a read
    that fails while the same folder is named is a failure of that checkpoint."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        named = referenced_shards(path.parent) if path.name == CHECKPOINT_NAME else None
        try:
            ckpt = read_checkpoint(path)
            return assemble_sharded(ckpt) if is_sharded_checkpoint(ckpt) else ckpt
        except Exception:
            if attempt == READ_ATTEMPTS or not named or referenced_shards(path.parent) == named:
                raise
    raise AssertionError("unreachable")


def export_payload(source: str | Path) -> dict[str, Any]:
    """The checkpoint of a run folder (or a checkpoint file), sharded or not, in the one-process layout: what
    `--resume` in one process, cs336_basics.programs.generate and the course's load_checkpoint read, on a GPU or the
    CPU (cs336_basics.programs.export writes it)."""
    source = Path(source)
    ckpt = read_whole_checkpoint(checkpoint_file(source))
    if RunConfig.from_dict(ckpt["config"]).finetune.lora:
        # Its model is the adapters alone (their base is another file) and its optimizer trains them alone: no
        # one-process checkpoint of a whole model can be made of it; the merged weights are a plain state dict.
        raise ConfigError(
            f"{source} is a LoRA run's checkpoint: it holds the adapters alone, which neither the course's "
            "load_checkpoint nor a plain model can load. Fold them into their base with: python -m "
            f"cs336_basics.programs.merge_lora {source} --output FILE (a course-layout state dict)."
        )
    return checkpoint_payload(
        model=ckpt["model"],
        optimizer=ckpt["optimizer"],
        step=ckpt["step"],
        config=ckpt["config"],
        sampler_state=ckpt["sampler_state"],
        extra=ckpt["extra"],
        rng=ckpt["rng"],
    )


__all__ = [
    "assemble_sharded", "export_payload", "read_whole_checkpoint", "restore_sharded_model",
    "save_sharded",
]  # fmt: skip
