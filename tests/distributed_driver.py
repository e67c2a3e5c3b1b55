"""train_h100.py as torchrun runs it, with two test hooks read from the environment (nothing else changes):

FAIL_RANK, FAIL_STEP   that rank raises at the start of that optimizer step (0-based), as a crash would (the message
                       ends with the wall-clock time of the failure, "(t=<seconds since the epoch>)"); with
                       FAIL_HOW=kill it is killed there instead (SIGKILL: no message, as the OOM killer does it);
SLOW_LEAVE_S=<s>       a rank that stops on an error waits that long before it leaves the process group, as a loaded
                       machine can: long enough for torchrun to stop it (SIGTERM) because another rank failed;
SLOW_DATA_S=<s>        rank 0's data preparation (tokenizing and caching, which the other ranks wait for) takes that
                       much longer, as a large corpus's does;
REPORT_GRAPH_BREAKS=1  rank 0 prints "graph_breaks=<n>" (torch.compile's count) when training ends;
REPORT_CUDA_GRAPHS=1   rank 0 prints "cuda_graph_recordings=[<n>, ...]" (the CUDA graphs recorded in each optimizer
                       step) and "cudagraph_skips=<n>" (compiled graphs inductor would not capture) when training ends.
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_h100  # noqa: E402
from cs336_basics import run  # noqa: E402
from cs336_basics.parallel import world  # noqa: E402
from cs336_basics.parallel.world import exit_process  # noqa: E402
from cs336_basics.training.trainer import Trainer  # noqa: E402

_real_step = Trainer.train_step


def failing_step(self):
    if self.world.rank == int(os.environ["FAIL_RANK"]) and self.step == int(os.environ["FAIL_STEP"]):
        if os.environ.get("FAIL_HOW") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure on rank {self.world.rank} at step {self.step + 1} (t={time.time():.3f})")
    return _real_step(self)


def count_cuda_graph_recordings() -> list[int]:
    """From now on, count the CUDA graphs recorded in each optimizer step; the list fills as training goes."""
    from torch._inductor.cudagraph_trees import CUDAGraphNode

    per_step: list[int] = []
    record, step = CUDAGraphNode._record, Trainer.train_step

    def counted_record(self, *args, **kwargs):
        per_step[-1] += 1
        return record(self, *args, **kwargs)

    def counted_step(self):
        per_step.append(0)
        return step(self)

    CUDAGraphNode._record, Trainer.train_step = counted_record, counted_step
    return per_step


def slow_leave(seconds: float):
    leave = world._leave_after_error

    def slowly():
        time.sleep(seconds)
        leave()

    return slowly


def slow_data(seconds: float):
    prepare = run.prepare_data

    def slowly(*args, **kwargs):
        if os.environ.get("RANK") == "0":
            time.sleep(seconds)
        return prepare(*args, **kwargs)

    return slowly


if __name__ == "__main__":
    if "SLOW_DATA_S" in os.environ:
        run.prepare_data = slow_data(float(os.environ["SLOW_DATA_S"]))
    if "FAIL_RANK" in os.environ:
        Trainer.train_step = failing_step
    if "SLOW_LEAVE_S" in os.environ:
        world._leave_after_error = slow_leave(float(os.environ["SLOW_LEAVE_S"]))
    recordings = count_cuda_graph_recordings() if os.environ.get("REPORT_CUDA_GRAPHS") else None
    code = train_h100.main(sys.argv[1:])
    # Imported only when asked for: a rank that refused to start exits at once, as its agent expects.
    if (os.environ.get("REPORT_GRAPH_BREAKS") or recordings is not None) and os.environ.get("RANK", "0") == "0":
        from torch._dynamo.utils import counters

        if os.environ.get("REPORT_GRAPH_BREAKS"):
            print(f"graph_breaks={sum(counters['graph_break'].values())}", flush=True)
        if recordings is not None:
            print(f"cuda_graph_recordings={recordings}", flush=True)
            print(f"cudagraph_skips={counters['inductor']['cudagraph_skips']}", flush=True)
    exit_process(code)
