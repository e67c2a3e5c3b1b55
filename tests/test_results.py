"""The results-file header (how the command that wrote it is recorded) and the shared writer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cs336_basics.benchmark.amdahl.__main__ as amdahl_main
from cs336_basics.results import environment, write_results


def test_a_module_run_with_dash_m_is_recorded_as_such(monkeypatch):
    monkeypatch.setattr(sys, "argv", [amdahl_main.__file__, "--preset", "366m", "--json", "out file.json"])
    assert environment()["command"] == "python -m cs336_basics.benchmark.amdahl --preset 366m --json 'out file.json'"


def test_a_script_is_recorded_by_its_name(monkeypatch):
    script = Path(__file__).resolve().parent.parent / "optimize_performance.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--quick"])
    assert environment()["command"] == "optimize_performance.py --quick"


def test_write_results_has_the_shared_header_extra_fields_and_runs(tmp_path):
    path = write_results(tmp_path / "sub" / "r.json", [{"preset": "x", "status": "ok"}], passed=True)
    data = json.loads(path.read_text())
    assert {"gpu", "torch", "torchao", "command"} <= data.keys()
    assert data["passed"] is True and data["runs"] == [{"preset": "x", "status": "ok"}]
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left behind
