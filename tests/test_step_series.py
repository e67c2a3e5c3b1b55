"""lab/step_series.py: which rank's host a run's slow steps waited for."""

import json

from lab.step_series import main, split_by_speed


def _run(step_ms, host_ms, host_cpu_ms, gc_ms):
    return {"step_ms": step_ms, "host_ms": host_ms, "host_cpu_ms": host_cpu_ms, "gc_ms": gc_ms}


def test_the_rank_whose_host_rose_with_the_slow_steps_is_told_apart_with_its_cpu_time():
    # Steps 2 and 4 slow: rank 1's host took longer in them, working (CPU with it); rank 0 waited for it.
    run = _run(
        step_ms=[100, 100, 120, 100, 121, 100],
        host_ms=[[95, 95, 96, 95, 96, 95], [95, 95, 118, 95, 119, 95]],
        host_cpu_ms=[[94, 94, 94, 94, 94, 94], [94, 94, 117, 94, 118, 94]],
        gc_ms=[[0, 0, 0, 0, 0, 0], [0, 0, 0.5, 0, 0, 0]],
    )
    split = split_by_speed(run, slow=1.08)
    assert split["median_ms"] == 100 and split["slow_steps"] == [2, 4]
    rank0, rank1 = split["ranks"]
    assert (rank0["slow"]["host_ms"], rank0["fast"]["host_ms"]) == (96, 95)
    assert (rank1["slow"]["host_ms"], rank1["fast"]["host_ms"]) == (118.5, 95)
    assert (rank1["slow"]["host_cpu_ms"], rank1["fast"]["host_cpu_ms"]) == (117.5, 94)
    assert (rank1["slow"]["gc_ms"], rank1["fast"]["gc_ms"]) == (0.5, 0)


def test_every_repeated_run_and_an_older_flat_record_are_read(tmp_path, capsys):
    steady = _run([100] * 4, [[90] * 4], [[89] * 4], [[0] * 4])
    sweep = {"runs": [{"label": "1.3b/fp8", "step_series_runs": [steady, _run([], None, None, None)]}]}
    older = {"label": "366m/bf16", **_run([80, 80, 90], [70, 70, 85], [30, 30, 31], [0, 0, 0])}  # one flat list
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    (tmp_path / "result.json").write_text(json.dumps(older))
    assert main([str(tmp_path / "sweep.json"), str(tmp_path / "result.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [
        "1.3b/fp8:",
        "  run 1: median step 100.0 ms; 0 of 4 steps slower than 1.08x it",
        "    rank 0: host - ms in slow steps, 90.0 in the rest; CPU - / 89.0; collector 0.0 / 0.0 ms",
        "  run 2: no step series",
    ]
    assert "    rank 0: host 85.0 ms in slow steps, 70.0 in the rest; CPU 31.0 / 30.0; collector 0.0 / 0.0 ms" in out
