"""Acceptance tables: each paper claim a store can judge, measured, threshold, pass/fail.

A paper's module (``analysis/acceptance_002.py``, ``analysis/acceptance_000.py``) has
``acceptance(ds) -> list[Row]``; criteria without data come back with ``passed=None`` and the
note saying why, so the table always lists every criterion."""

from __future__ import annotations

import dataclasses

NO_DATA = "not judged (no data)"


@dataclasses.dataclass(frozen=True)
class Row:
    criterion: str
    spec_id: str
    measured: str
    threshold: str
    passed: bool | None  # None: not judged
    note: str = ""
    value: float = float("nan")  # the measured number, for tests and machines

    @property
    def verdict(self) -> str:
        return NO_DATA if self.passed is None and not self.measured else \
            "not judged" if self.passed is None else "pass" if self.passed else "FAIL"


def skipped(spec_id: str, criterion: str, threshold: str, why: str = "") -> Row:
    return Row(criterion, spec_id, "", threshold, None, why)


def markdown(rows: list[Row]) -> str:
    lines = ["| spec | criterion | measured | threshold | result | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = (r.spec_id, r.criterion, r.measured or "-", r.threshold, r.verdict, r.note)
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def text(rows: list[Row]) -> str:
    """The table for a terminal: one line per row, fixed columns, the note after."""
    out = []
    for r in rows:
        line = f"  {r.verdict:<22} {r.spec_id:<8} {r.criterion:<44} {r.measured or '-':<34} [{r.threshold}]"
        out.append(line + (f"  ({r.note})" if r.note else ""))
    return "\n".join(out)


def against_paper(stem: str, claims: dict[str, tuple[str, ...]], rows: list[Row]) -> list[str]:
    """How a figure compares with the paper: one line per acceptance row of the claims it draws
    (``claims``: a figure stem's start -> spec IDs, the figures module's ``CLAIMS``), with the paper's
    threshold beside what this store measured and the verdict. None: [] (a figure no claim is about)."""
    ids = next((v for k, v in sorted(claims.items(), key=lambda kv: -len(kv[0])) if stem.startswith(k)), ())
    return [f"paper vs this store ({r.spec_id}, {r.criterion}): paper {r.threshold}; here {r.measured or '-'}: "
            f"{r.verdict}" for r in rows if r.spec_id in ids]
