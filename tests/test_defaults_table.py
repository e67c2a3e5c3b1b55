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


def test_cuda_graphs_wherever_fp8_trains_in_one_process_under_ddp_or_under_fsdp2():
    by_name = {mode.name: choices(mode) for mode in MODES}
    one_process = [mode for mode in MODES if mode.world_size == 1 and mode.compile_mode == "auto"]
    assert all(by_name[mode.name][0] == "`reduce-overhead`" for mode in one_process)
    # A one-process step without CUDA graphs launches its kernels from C++.
    no_graphs = [mode for mode in MODES if mode.world_size == 1 and mode not in one_process]
    assert no_graphs and all(by_name[mode.name][0] == "`default`, C++ wrapper" for mode in no_graphs)
    # Across processes: the fused path under CUDA graphs, under DDP accumulating or not, and under FSDP2.
    ddp = [mode for mode in MODES if mode.parallel == "ddp"]
    assert {mode.accumulation for mode in ddp} == {1, 4}
    for mode in ddp:
        compile_mode, fp8 = by_name[mode.name]
        assert fp8.startswith("fused") and compile_mode == "`reduce-overhead`"
    fsdp = [mode for mode in MODES if mode.parallel == "fsdp"]
    assert fsdp and all(by_name[mode.name][0] == "`reduce-overhead`" for mode in fsdp)
    assert all(by_name[mode.name][1].startswith("fused") for mode in fsdp)
