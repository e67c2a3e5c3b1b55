"""Which process of a torchrun launch this is, the process group's lifetime, and the few collectives the trainer
needs (every one a no-op in a single process, so the training loop has one code path).

torchrun starts one process per GPU and sets RANK, WORLD_SIZE and LOCAL_RANK (plus the rendezvous address) in each
one's environment: that is how a run knows it was launched by torchrun. Without them the run is a single process
and nothing here touches torch.distributed.

A rank that fails must not leave the others waiting: every collective has the process group's timeout
(--dist_timeout_s), and torchrun's elastic agent stops the remaining ranks as soon as one exits with an error, then
exits non-zero itself, naming the failed rank.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

from cs336_basics.devices import resolve_device
from cs336_basics.errors import ConfigError, RunFolderError, WorkFailed
from cs336_basics.training.signals import ignore_terminate

T = TypeVar("T")

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class World:
    """This process's place in the run. `launched`: started by torchrun, with a process group (possibly of one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launched: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0 alone prints, writes the run folder's files and holds its lock."""
        return self.rank == 0


SINGLE = World()


def torchrun_world() -> World | None:
    """The world torchrun's environment describes, or None when this process was not started by torchrun."""
    present = [name for name in TORCHRUN_VARIABLES if name in os.environ]
    if not present:
        return None
    if len(present) < len(TORCHRUN_VARIABLES):
        missing = sorted(set(TORCHRUN_VARIABLES) - set(present))
        raise ConfigError(
            f"the environment sets {', '.join(present)} but not {', '.join(missing)}: launch several processes with "
            "torchrun (e.g. torchrun --standalone --nproc_per_node 2 train_h100.py ...), or unset them for one process."
        )
    try:
        rank, world_size, local_rank = (int(os.environ[name]) for name in TORCHRUN_VARIABLES)
    except ValueError as exc:
        raise ConfigError(f"torchrun's {'/'.join(TORCHRUN_VARIABLES)} must be integers ({exc}).") from exc
    return World(rank=rank, world_size=world_size, local_rank=local_rank, launched=True)


def exit_process(code: int) -> None:
    """End the program with `code`. A process torchrun started ends without the interpreter's finalization, once its
    output is flushed (the process group is gone by then: process_group destroys it): gloo's C++ threads can abort the
    finalization of a process that finished its work (pytorch/pytorch#179291), which made a rank of a finished
    2-rank CPU test run die of SIGABRT ("terminate called without an active exception", its main thread with no
    Python frame left), failing the run after its work was done and saved."""
    if torchrun_world() is None:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def current_world() -> World:
    """This process's world: the initialised process group's, else a single process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return SINGLE
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return World(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, launched=True)


def process_device(device_name: str, world: World) -> torch.device:
    """The device this rank trains on: --device resolved as on one GPU, then, under torchrun on CUDA, the GPU of its
    LOCAL_RANK (one process per GPU)."""
    device = resolve_device(device_name)
    if not world.launched or device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if device.index is not None and device.index != world.local_rank and world.world_size > 1:
        raise ConfigError(
            f"--device {device_name}: under torchrun each process uses the GPU of its LOCAL_RANK "
            f"(this one: cuda:{world.local_rank}); pass --device cuda (or auto), and choose GPUs with "
            "CUDA_VISIBLE_DEVICES."
        )
    if world.local_rank >= count:
        raise ConfigError(
            f"torchrun started local rank {world.local_rank} but only {count} GPU(s) are visible: use "
            f"--nproc_per_node {count} or fewer (one process per GPU)."
        )
    return torch.device("cuda", world.local_rank)


@contextlib.contextmanager
def process_group(device_name: str, timeout_s: int) -> Iterator[World]:
    """Under torchrun: initialise the process group (NCCL on CUDA, gloo on CPU) with the collective timeout, bind
    this process to its GPU, yield the world, and destroy the group at the end however the run ends. Otherwise
    yield the single-process world and do nothing."""
    world = torchrun_world()
    if world is None:
        yield SINGLE
        return
    import torch.distributed as dist

    device = process_device(device_name, world)
    kwargs = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group exists, so NCCL's communicators land on this GPU
        kwargs["device_id"] = device
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=timeout_s), **kwargs
    )
    try:
        yield current_world()
        # Leave together: a rank that tears its connections down while another still talks to it can make gloo abort.
        dist.barrier()
    except BaseException as exc:
        # torchrun stops this rank (SIGTERM) as soon as another one dies, often of the failure this rank just met: that
        # stop must not replace this rank's report of why it stops ("stopped by SIGTERM" instead of "another rank
        # failed"), however long leaving takes.
        ignore_terminate()
        _leave_after_error()  # torchrun stops the other ranks when this one exits with the error
        lost = _lost_peer(exc)
        if lost is not None:  # the failed rank says why, if it could: not this rank's traceback of the collective
            raise WorkFailed(
                f"rank {world.rank} stopped: another rank failed, was killed or stopped answering ({lost}); its "
                "message above, or torchrun's report below, says which"
            ) from exc
        raise
    dist.destroy_process_group()


def _lost_peer(exc: BaseException | None) -> str | None:
    """What a collective said when it failed for want of another rank (gone, or silent past the timeout), anywhere in
    the error's chain: torch's distributed errors (NCCL's, the store's) or gloo's RuntimeError, which names its source
    file. None for any other error."""
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        text = str(exc).strip()
        line = text.splitlines()[-1] if text else type(exc).__name__
        if isinstance(exc, torch.distributed.DistError):
            return line
        if isinstance(exc, RuntimeError) and "gloo" in text:
            return "gloo: " + re.sub(r"^\[[^\]]*\]\s*", "", line)  # without its source file and line
        exc = exc.__cause__ or exc.__context__
    return None


def _leave_after_error() -> None:
    """Tear this rank's process group down without waiting for the others. NCCL's orderly shutdown (what
    destroy_process_group does) waits for this rank's pending collectives, which the other ranks, blocked elsewhere,
    never complete: the failed rank could sit there until the collective timeout before its error reached torchrun
    (the 2-GPU failure test saw its run end minutes after the failure:
    INDEX.md: 2026-11-23-sweep-1.3b-x2-h200x2, its gpu-tests-distributed.log). Aborting the communicators does
    not wait. gloo's shutdown does not wait either."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if dist.get_backend() == "nccl":
        distributed_c10d._abort_process_group()  # torch's abort of every group (private: no public one exists)
    else:
        dist.destroy_process_group()


# ---- collectives (no-ops in a single process) ----


def _initialised() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _comm_device() -> torch.device:
    """Where the backend wants tensors: the current GPU for NCCL, the CPU for gloo."""
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce `tensor` over all ranks in place ("sum", "avg", "max" or "min"); returned for chaining."""
    if not _initialised():
        return tensor
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.SUM}
    work = tensor.to(_comm_device())  # `tensor` itself where it already lives there
    dist.all_reduce(work, op=ops[op])
    if op == "avg":  # gloo has no AVG, so sum and divide everywhere; in place: no second copy of a gradient bucket
        work.div_(dist.get_world_size())
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def _reduce_number(value: float, op: str, dtype: torch.dtype = torch.float64) -> float:
    return all_reduce_(torch.tensor(value, dtype=dtype), op).item()


def reduce_max(value: float) -> float:
    return _reduce_number(value, "max")


def agree_all(flag: bool) -> bool:
    """True only if `flag` is true on every rank (so every rank takes the same branch)."""
    return bool(_reduce_number(float(flag), "min"))


def agree_any(flag: bool) -> bool:
    """True if `flag` is true on any rank."""
    return bool(_reduce_number(float(flag), "max"))


def refuse_together(refusal: ConfigError | None, world: World, elsewhere: str) -> None:
    """Stop every rank if any rank refused (`refusal`: this rank's reason, or None). A refusal every rank makes is
    raised as it is (rank 0 reports it, see errors.alike_on_every_rank). One that only some ranks make (a file one node
    has and another lacks) is each one's own message, and the other ranks stop with `elsewhere`: neither waits for the
    other in a collective until the process group's timeout."""
    if not world.launched:
        if refusal is not None:
            raise refusal
        return
    if not agree_any(refusal is not None):
        return
    if agree_all(refusal is not None):
        refusal.every_rank = True
        raise refusal
    if refusal is not None:
        refusal.every_rank = False  # the ranks that did not refuse cannot report it: this rank says it itself
        raise refusal
    stop = ConfigError(f"rank {world.rank} stopped: {elsewhere}")
    stop.every_rank = True  # alike on every rank that did not refuse: rank 0 says it
    raise stop


def broadcast_text(text: str) -> str:
    """Rank 0's `text` on every rank."""
    if not _initialised():
        return text
    import torch.distributed as dist

    box = [text]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(value: T) -> list[T]:
    """Every rank's `value` (picklable), in rank order, on every rank; [value] in one process."""
    if not _initialised():
        return [value]
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def barrier() -> None:
    if _initialised():
        torch.distributed.barrier()


def main_writes(world: World, write: Callable[[], T], what: str) -> T | None:
    """Rank 0 runs `write` (a file of the run folder); then every rank learns whether it succeeded, so no rank goes
    on alone. Rank 0 re-raises its error; the others raise a RunFolderError pointing at it."""
    result, error = None, None
    if world.is_main:
        try:
            result = write()
        except (OSError, RuntimeError) as exc:
            error = exc
    if world.launched and not agree_all(error is None) and error is None:
        raise RunFolderError(f"rank 0 could not write {what} (its error says why); the previous one is intact.")
    if error is not None:
        raise error
    return result


# How long the other ranks wait for rank 0's work in main_first: tokenizing a large corpus takes far longer than a
# collective should (--dist_timeout_s is for a rank that stopped answering mid-step). A rank 0 that fails or is killed
# there ends the run through torchrun, which stops the waiting ranks; this bounds only a rank 0 that hangs.
MAIN_FIRST_WAIT_S = 24 * 3600


@contextlib.contextmanager
def main_first(world: World) -> Iterator[None]:
    """Rank 0 runs the body first (e.g. builds and caches the tokenized data), the other ranks after it (reading
    its cache instead of racing to write the same files). They wait in a barrier of their own, held to
    MAIN_FIRST_WAIT_S rather than the collective timeout."""
    if not world.launched:
        yield
        return
    import torch.distributed as dist

    waiting = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=MAIN_FIRST_WAIT_S))
    if not world.is_main:
        dist.barrier(group=waiting)
    yield
    if world.is_main:
        dist.barrier(group=waiting)
    dist.destroy_process_group(waiting)
