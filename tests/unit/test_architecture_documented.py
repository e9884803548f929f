"""docs/architecture.md's module table names every module of src/weir (a module nobody
documented is a module nobody can find its owner in)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "weir"
DOC = ROOT / "docs" / "architecture.md"


def documented() -> set[str]:
    table = DOC.read_text().split("| module | what it holds |", 1)[1].split("\n\n", 1)[0]
    names: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([\w/]+(?:\.py)?)`", line.split("|")[1]))
    return names


def test_every_module_is_in_the_architecture_table() -> None:
    modules = {p.name for p in SRC.glob("*.py") if p.name != "__init__.py"} | {
        f"_engine/{p.name}" for p in (SRC / "_engine").glob("*.py") if p.name != "__init__.py"
    }
    packages = {f"{p.name}/" for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    names = documented()
    assert modules | packages <= names, sorted((modules | packages) - names)
    assert names <= modules | packages, f"documented but gone: {sorted(names - modules - packages)}"


def test_the_engine_module_stays_a_wiring() -> None:
    """engine.py wires the parts and runs the turn; each decision lives in the module that owns
    it. Past 800 lines it has started to hold decisions of its own: move them out."""
    lines = len((SRC / "_engine" / "engine.py").read_text().splitlines())
    assert lines < 800, f"src/weir/_engine/engine.py has {lines} lines"
