"""The README's table of what auto gives in each way of training is the one the deciding code gives
(cs336_basics/defaults_table.py), and every study it cites exists."""

from __future__ import annotations

from pathlib import Path

from cs336_basics.defaults_table import MODES, RESULTS, choices, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_holds_the_table_the_code_gives():
    assert markdown() in (ROOT / "README.md").read_text()


def test_every_mode_cites_a_study_that_exists_and_is_indexed():
    index = (ROOT / RESULTS / "INDEX.md").read_text()
    for mode in MODES:
        assert (ROOT / RESULTS / mode.record).is_dir(), mode.record
        assert f"({mode.record}/)" in index, mode.record


def test_cuda_graphs_wherever_one_process_trains_fp8_and_torchao_across_processes():
    by_name = {mode.name: choices(mode) for mode in MODES}
    one_process = [mode for mode in MODES if mode.world_size == 1 and mode.compile_mode == "auto"]
    assert all(by_name[mode.name][0] == "`reduce-overhead`" for mode in one_process)
    # A one-process step without CUDA graphs launches its kernels from C++ (across processes: not yet measured).
    no_graphs = [mode for mode in MODES if mode.world_size == 1 and mode not in one_process]
    assert no_graphs and all(by_name[mode.name][0] == "`default`, C++ wrapper" for mode in no_graphs)
    assert all(by_name[mode.name][1].startswith("torchao") for mode in MODES if mode.world_size > 1)
