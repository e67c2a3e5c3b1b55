"""The host-time profile's wiring: what it refuses before any work (its measurements need a GPU: the benchmark's
results are committed under benchmarks/results/)."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import on_two_gloo_ranks

from cs336_basics.errors import ConfigError
from cs336_basics.parallel.world import World
from cs336_basics.precision.converter import NO_CONVERSION
from lab import host_time


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_without_a_gpu(capsys):
    assert host_time.main(["--presets", "gpt2-small"]) != 0
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--precisions", "bf16,fp7"),
        ("--compile", "fastest"),
        ("--compile_wrappers", "python,rust"),
        ("--ddp_bucket_mb", "25,big"),
        ("--fp8_scaling", "dynamic,fastest"),
        ("--grad_sync", "on,sometimes"),
        ("--fsdp_reshard_after_forward", "on,later"),
        ("--skip_guard_eval", "off,maybe"),
    ],
)
def test_refuses_unknown_precisions_and_compile_modes(monkeypatch, capsys, flag, value):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the check comes before any CUDA work
    assert host_time.main([flag, value]) != 0
    assert value.split(",")[-1] in capsys.readouterr().err


@pytest.mark.parametrize(("world_size", "parallel", "mode"), [(None, "auto", "'none'"), ("2", "fsdp", "'fsdp'")])
def test_grad_sync_off_is_refused_before_any_build_where_no_row_runs_ddp(
    monkeypatch, capsys, world_size, parallel, mode
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(host_time, "warmed_up_preset", lambda *args: pytest.fail("built a model"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    if world_size:  # torchrun's variables, without its process group: the refusal comes first
        monkeypatch.setattr(host_time, "torchrun_world", lambda: World(0, int(world_size), 0, launched=True))
    assert host_time.main(["--grad_sync", "on,off", "--parallel", parallel]) != 0
    assert f"this run is {mode}, not DDP" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_profile_of_real_steps_accounts_for_the_host_time():
    dynamic = {"fp8": {"fp8_scaling": "dynamic"}}  # one process's default is delayed
    record = host_time.measure(
        "cpu-small", fp8=True, compile_mode="default", warmup=3, steps=4, top_ops=5, settings=dynamic, top_python=3
    )
    assert record["fp8_scaling"] == "dynamic" and record["grad_sync"]
    assert len(record["top_host_ops"]) == 5 and all(op["calls"] > 0 for op in record["top_host_ops"])
    assert len(record["top_python"]) == 3 and record["python_areas_ms"]["cs336_basics"] > 0  # the Trainer's own code
    assert "Python's own time, ms/step" in host_time.describe(record)
    assert record["status"] == "ok" and record["precision"].startswith("fp8") and record["timed_steps"] == 4
    assert record["compile_wrapper"] == "cpp"  # auto's choice without CUDA graphs on a GPU
    phases = [record[f"{phase}_ms"] for phase in ("batch", "forward", "optimizer", "scaling_update")]
    assert all(ms > 0 for ms in phases[:3]) and record["wall_ms"] > 0 and record["tokens_per_sec"] > 0
    assert record["backward_and_rest_ms"] >= 0 and sum(phases) <= record["host_ms"]
    assert record["gpu_busy_ms"] > 0 and record["gpu_idle_ms"] == max(record["wall_ms"] - record["gpu_busy_ms"], 0)
    assert record["world_size"] == 1 and record["comm_ms"] == record["exposed_comm_ms"] == 0  # one process: none
    # BF16's converter is one shared object: the timing wrapper put on it is removed afterwards.
    python = host_time.measure(
        "cpu-small", fp8=False, compile_mode="default", warmup=3, steps=4, compile_wrapper="python"
    )
    assert python["compile_wrapper"] == "python"
    assert "after_optimizer_step" not in vars(NO_CONVERSION)
    # Skipping the gradients' all-reduce means something under DDP only.
    with pytest.raises(ConfigError, match="not DDP"):
        host_time.measure("cpu-small", fp8=False, compile_mode="default", warmup=1, steps=1, grad_sync=False)


def test_the_ops_with_the_most_host_time_are_ranked_per_step():
    a, b = torch.ones(256, 256), torch.ones(8, 8)
    synchronized = []

    def step():
        for _ in range(3):
            a @ a  # three large matmuls a step: the most host time of their own
        b.add(1)

    ops = host_time.top_host_ops(step, steps=4, n=2, synchronize=lambda: synchronized.append(1))
    assert len(synchronized) == 4  # before each step
    assert [op["op"] for op in ops][0] == "aten::mm" and ops[0]["calls"] == 3.0
    assert ops[0]["self_cpu_ms"] >= ops[1]["self_cpu_ms"] > 0 and len(ops) == 2


def _busy_python(n: int) -> int:
    return sum(i * i for i in range(n))


def test_python_time_is_summed_by_library_and_its_functions_ranked_per_step():
    synchronized = []
    profile = host_time.python_profile(
        lambda: _busy_python(100_000), steps=3, n=20, synchronize=lambda: synchronized.append(1)
    )
    assert len(synchronized) == 3  # before each step, outside the profile
    top = {f["function"].rsplit("/", 1)[-1]: f for f in profile["top_python"]}
    ranked = [f["self_ms"] for f in profile["top_python"]]
    assert ranked == sorted(ranked, reverse=True) and ranked[0] > 0
    assert any(f["function"].endswith("(<genexpr>)") for f in profile["top_python"][:2])  # the loop and sum()
    assert top[f"test_host_time.py:{_busy_python.__code__.co_firstlineno}(_busy_python)"]["calls"] == 1.0  # per step
    assert top["<built-in method builtins.sum>"]["calls"] == 1.0
    areas = profile["python_areas_ms"]
    assert set(areas) == {"other", "C functions"}  # tests/ is no named library; sum() is a C function
    assert list(areas.values()) == sorted(areas.values(), reverse=True)
    assert sum(areas.values()) == pytest.approx(sum(ranked))  # every function listed (n above their count)


def test_the_line_lists_pythons_time_by_library_under_the_step():
    record = dict(
        preset="1.3b", precision="fp8-fused-delayed", compile="default", compile_wrapper="cpp", tokens_per_sec=1e5,
        parallel="fsdp", world_size=2, fsdp_reshard_after_forward=True, grad_sync=True, skip_guard_eval=False,
        wall_ms=100.0, gpu_idle_ms=5.0, comm_ms=10.0, exposed_comm_ms=2.0, host_ms=99.0, forward_ms=40.0,
        optimizer_ms=3.0, scaling_update_ms=1.0, cudagraph_skips=0,
        python_areas_ms={"FSDP2": 12.5, "C functions": 8.25},
        top_python=[{"function": "torch/distributed/fsdp/_fully_shard/_fsdp_param.py:629(f)", "self_ms": 1.5,
                     "calls": 762.0}],
    )  # fmt: skip
    lines = host_time.describe(record).splitlines()
    assert "FSDP2 x2" in lines[0]
    assert lines[1] == "    Python's own time, ms/step (under cProfile): FSDP2 12.50, C functions 8.25"
    assert lines[2].split() == ["1.500", "ms/step", "762.0", "calls/step", record["top_python"][0]["function"]]


@pytest.mark.parametrize(
    ("filename", "area"),
    [
        ("/v/lib/python3.12/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param.py", "FSDP2"),
        ("/v/lib/python3.12/site-packages/torch/distributed/tensor/_api.py", "DTensor"),
        ("/v/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", "torch.distributed"),
        ("/v/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py", "dynamo"),
        ("/v/lib/python3.12/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py", "AOTAutograd"),
        ("/v/lib/python3.12/site-packages/torch/autograd/function.py", "autograd"),
        ("/v/lib/python3.12/site-packages/torch/nn/modules/module.py", "torch.nn"),
        ("/v/lib/python3.12/site-packages/torch/_tensor.py", "torch, other"),
        ("/work/main/cs336_basics/training/trainer.py", "cs336_basics"),
        ("~", "C functions"),
        ("/usr/lib/python3.12/threading.py", "other"),
        ("/tmp/ind/ab/cabcdef.py", host_time.GENERATED),  # a compiled graph's Python wrapper, in inductor's cache
        ("/tmp/ind2/ab/cabcdef.py", "other"),
        ("/v/lib/python3.12/site-packages/triton/runtime/jit.py", "triton"),
    ],
)
def test_python_functions_are_placed_by_the_library_their_file_is_in(filename, area):
    assert host_time.python_area(filename, generated_root="/tmp/ind/") == area


def test_collectives_split_into_the_time_they_ran_and_the_time_no_compute_hid():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def kernel(name, start_ms, end_ms):
        span = SimpleNamespace(start=start_ms * 1e3, end=end_ms * 1e3)  # the profiler's times are in us
        return SimpleNamespace(name=name, time_range=span, device_type=DeviceType.CUDA, is_user_annotation=False)

    host_op = SimpleNamespace(name="nccl:all_reduce", device_type=DeviceType.CPU, is_user_annotation=False)
    events = [
        kernel("gemm", 0, 10), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 5, 15),  # half of it hidden
        kernel("gemm", 20, 30), kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 40, 45), host_op,  # not hidden
    ]  # fmt: skip
    assert host_time.collective_time(events, steps=1) == {
        "collective_calls": 1,
        "comm_ms": 15.0,
        "exposed_comm_ms": 10.0,
    }
    assert host_time.collective_time(events, steps=5) == {
        "collective_calls": 0.2,
        "comm_ms": 3.0,
        "exposed_comm_ms": 2.0,
    }
    no_collective = events[:1] + events[2:3]
    assert host_time.collective_time(no_collective, steps=1) == {
        "collective_calls": 0,
        "comm_ms": 0.0,
        "exposed_comm_ms": 0.0,
    }


def test_collectives_called_without_their_kernels_in_the_profile_are_unknown_not_zero():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    span = SimpleNamespace(start=0.0, end=1e4)
    gemm = SimpleNamespace(name="gemm", time_range=span, device_type=DeviceType.CUDA, is_user_annotation=False)
    call = SimpleNamespace(
        name="nccl:all_reduce", time_range=span, device_type=DeviceType.CPU, is_user_annotation=False
    )
    times = host_time.collective_time([gemm, call, call], steps=2)
    assert times == {"collective_calls": 1.0, "comm_ms": None, "exposed_comm_ms": None}
    record = {"comm_ms": None, "collective_calls": 1.0}
    assert "none of their kernels in the profile" in host_time._collectives(record)


def _a_ranks_record(rank: int) -> dict:
    record = {field: 10.0 * (rank + 1) for field in host_time.PER_RANK}
    record["exposed_comm_ms"] = None if rank else 4.5  # a rank whose profile held no collective kernel
    return {**record, **host_time.every_rank(record)}


def test_every_rank_reports_each_ranks_host_and_collective_times_and_the_line_names_the_slowest(tmp_path):
    ranks = on_two_gloo_ranks(_a_ranks_record, tmp_path)
    assert ranks[0]["host_ms_ranks"] == ranks[1]["host_ms_ranks"] == [10.0, 20.0]
    assert ranks[0]["exposed_comm_ms_ranks"] == [4.5, None]
    line = host_time._over_ranks(ranks[0])
    assert "host 10.00-20.00 ms (slowest rank 1)" in line and "exposed collectives 4.50-4.50 ms" in line
    assert host_time.every_rank({}) == {} and host_time._over_ranks({}) == ""  # one process
