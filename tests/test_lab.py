"""The lab's tools live outside the package (lab/, not in the wheel): each must still import, and must import the
package only through its public names, so that a change inside the package which breaks a tool fails here."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parent.parent / "lab"
TOOLS = sorted(path for path in LAB.rglob("*.py") if path.name != "__init__.py")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(LAB.parent).with_suffix("").parts)


@pytest.mark.parametrize("path", TOOLS, ids=lambda path: str(path.relative_to(LAB)))
def test_lab_tool_imports(path):
    importlib.import_module(_module(path))


@pytest.mark.parametrize("path", TOOLS, ids=lambda path: str(path.relative_to(LAB)))
def test_lab_tool_takes_only_public_names_of_the_package(path):
    private = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cs336_basics"):
            private += [f"{node.module}.{alias.name}" for alias in node.names if alias.name.startswith("_")]
            private += [node.module for part in node.module.split(".") if part.startswith("_")]
    assert not private, f"{path.name} imports private names of the package: {private}"


def test_no_package_module_imports_the_lab_or_the_programs():
    package = LAB.parent / "cs336_basics"
    wrong = []
    for path in package.rglob("*.py"):
        if path.parent.name == "programs":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            wrong += [f"{path.relative_to(package)}: {name}" for name in names if name.split(".")[0] == "lab"]
            wrong += [
                f"{path.relative_to(package)}: {name}" for name in names if name.startswith("cs336_basics.programs")
            ]
    assert not wrong, wrong


def test_a_probe_stopped_part_way_keeps_the_records_it_finished(tmp_path, monkeypatch):
    """A probe writes its JSON after each configuration: one stopped in its second (a time limit, a crash) keeps the
    first's record."""
    from lab import probe

    monkeypatch.setattr(probe, "require_cuda", lambda what, why: None)  # this test measures nothing on a GPU
    out = tmp_path / "probe.json"
    args = probe.probe_parser("lab.test", None).parse_args(["--presets", "a,b", "--json", str(out)])

    def measure_all(presets, precisions):
        yield {"preset": presets[0], "precision": precisions[0]}
        raise KeyboardInterrupt  # stopped during the next configuration

    with pytest.raises(KeyboardInterrupt):
        probe.run_probe(args, "a probe", "it measures", measure_all, describe=str)
    assert [(r["preset"], r["precision"]) for r in json.loads(out.read_text())["runs"]] == [("a", "bf16")]
