"""The results-file header (how the command that wrote it is recorded) and the shared writer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import cs336_basics.diagnostics.amdahl.__main__ as amdahl_main
from cs336_basics.errors import WorkFailed
from cs336_basics.measure.results import append_runs, environment, write_results


def test_a_module_run_with_dash_m_is_recorded_as_such(monkeypatch):
    monkeypatch.setattr(sys, "argv", [amdahl_main.__file__, "--preset", "366m", "--json", "out file.json"])
    assert environment()["command"] == "python -m cs336_basics.diagnostics.amdahl --preset 366m --json 'out file.json'"


def test_a_lab_tool_run_with_dash_m_is_recorded_as_such(monkeypatch):
    tool = Path(__file__).resolve().parent.parent / "lab" / "host_time.py"
    monkeypatch.setattr(sys, "argv", [str(tool), "--presets", "366m"])
    assert environment()["command"] == "python -m lab.host_time --presets 366m"


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


def test_adding_to_a_file_that_stopped_being_a_results_file_during_the_work_is_one_error(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("{}")
    with pytest.raises(WorkFailed, match='could not add to .*: it has no "runs" list'):
        append_runs(path, [{"preset": "x"}])
    assert path.read_text() == "{}"


def test_the_results_index_lists_every_study_and_the_records_hold_no_script():
    root = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    index = (root / "INDEX.md").read_text()
    entries = [path for path in root.iterdir() if path.name != "INDEX.md"]
    unlisted = [p.name for p in entries if f"]({p.name}{'/' if p.is_dir() else ''})" not in index]
    assert not unlisted, f"INDEX.md has no row for {unlisted}"
    # Code that measures lives in the package or in lab/ (each imported by a test); a study keeps its records.
    scripts = [str(path.relative_to(root)) for path in root.rglob("*.py")]
    assert not scripts, scripts
