"""Which spec predictions the test suite checks, and which of those ``make test`` runs (issue 38).

Collects the suite (``pytest --collect-only``, nothing runs) and reads, for every test, the spec IDs
in its name, parameters and docstring (P000-1, T002-3, F004-1, R1..R5, E1.., X1.., K1.., A16..), then
splits them by marker: asserted by ``make test`` (``-m "not paper"``) or only by ``make test-paper``.
Writes ``benchmarks/results/spec_predictions.json``; run it before and after moving a test to ``paper``:
the ``make_test`` list must not shrink.

    python benchmarks/spec_predictions.py
"""

from __future__ import annotations

import inspect
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "spec_predictions.json"
ID = re.compile(r"\b([PTFK]00[0-4]-\d+|[RXEKA]\d{1,2})\b")
ID_IN_NAME = re.compile(r"(?:^|_)([PTFK]00[0-4])_(\d+)|(?:^|_)([RXEKA]\d{1,2})(?=_|$)")


def ids_of(item) -> set[str]:
    """Spec IDs named by a test: in its function name (``test_P004_13_...``, ``test_R3_...``),
    its parameter id and its docstring."""
    found = set(ID.findall(item.name))
    for m in ID_IN_NAME.finditer(getattr(item, "originalname", item.name)):
        found.add(f"{m.group(1)}-{m.group(2)}" if m.group(1) else m.group(3))
    doc = inspect.getdoc(getattr(item, "function", None)) or ""
    return found | set(ID.findall(doc))


class Collect:
    def __init__(self):
        self.rows = []

    def pytest_collection_finish(self, session):
        for item in session.items:
            marks = {m.name for m in item.iter_markers()}
            self.rows.append({"test": item.nodeid, "ids": sorted(ids_of(item)), "paper": "paper" in marks})


def main() -> int:
    plugin = Collect()
    rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")], plugins=[plugin])
    if rc not in (0, 5):
        return rc
    in_make_test = sorted({i for r in plugin.rows if not r["paper"] for i in r["ids"]})
    everywhere = sorted({i for r in plugin.rows for i in r["ids"]})
    out = {"make_test": in_make_test, "only_test_paper": sorted(set(everywhere) - set(in_make_test)),
           "tests_with_ids": sum(bool(r["ids"]) for r in plugin.rows), "tests": len(plugin.rows)}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(in_make_test)} spec IDs asserted by make test; only by make test-paper: {out['only_test_paper']}")
    print("wrote", OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
