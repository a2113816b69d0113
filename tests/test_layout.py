"""The rooms of ARCHITECTURE.md / docs/layout.md: who may import whom, no cycles, no file or
environment access in tasks/, short modules, and a cache key that sees nested modules."""

from __future__ import annotations

import ast
import pathlib
import shutil

import pytest

from flows.sweep import tree_fingerprint

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROOMS = ("core", "tasks", "storage", "deploy", "analysis", "flows", "kktlab", "benchmarks")
# room -> the project rooms it may import (besides itself); arrows point down only
ALLOWED = {
    "core": set(),
    "tasks": set(),
    "storage": {"core"},
    "deploy": {"core"},
    "analysis": {"core", "storage", "tasks"},
    "flows": {"core", "tasks", "storage", "deploy"},
    "kktlab": {"core", "tasks", "storage", "deploy", "analysis", "flows"},
    "benchmarks": {"core", "tasks", "storage", "deploy", "analysis", "flows", "kktlab"},
}
MAX_LINES = 400


def modules(room: str) -> list[pathlib.Path]:
    return sorted((ROOT / room).rglob("*.py"))


def imported(path: pathlib.Path) -> set[str]:
    """Top-level names of every module ``path`` imports (function-level imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("room", ROOMS)
def test_room_imports_only_rooms_below_it(room):
    bad = []
    for path in modules(room):
        for name in imported(path):
            top = name.split(".")[0]
            if top in ROOMS and top != room and top not in ALLOWED[room]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


def test_rooms_form_no_cycle():
    """The allowed graph itself is acyclic, so no two rooms can import each other."""
    order = []
    remaining = dict(ALLOWED)
    while remaining:
        ready = [r for r, deps in remaining.items() if deps <= set(order)]
        assert ready, f"cycle among {sorted(remaining)}"
        order += ready
        for r in ready:
            remaining.pop(r)


@pytest.mark.parametrize("path", modules("tasks"), ids=lambda p: str(p.relative_to(ROOT)))
def test_tasks_read_no_files_or_environment(path):
    names = imported(path)
    assert not names & {"os", "pathlib", "gzip", "io", "prefect", "dask", "distributed", "zarr", "xarray"}, names
    assert "open(" not in path.read_text().replace("torch.load(", "")


@pytest.mark.parametrize("path", [p for r in ROOMS for p in modules(r)], ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_short(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_code_fingerprint_sees_nested_modules(tmp_path):
    """A change in a nested module (tasks/forging/estimators/...) changes the cache key of every
    bundle, so a stale cached bundle or checkpoint is never reused."""
    shutil.copytree(ROOT / "tasks", tmp_path / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    before = tree_fingerprint(tmp_path, ("tasks",))
    nested = tmp_path / "tasks" / "forging" / "estimators" / "naive_mc.py"
    nested.write_text(nested.read_text() + "\n# changed\n")
    assert tree_fingerprint(tmp_path, ("tasks",)) != before
    nested.rename(nested.with_name("renamed.py"))  # a move alone changes it too
    assert len({before, tree_fingerprint(tmp_path, ("tasks",))}) == 2
