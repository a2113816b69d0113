"""A config's grid axes as written: a list, ``{range: [start, stop(, step)]}`` or ``{linspace: [first,
last, n]}``; counted without being expanded, so a grid of too many cells is refused before any value
is made or checked (issue 42), then expanded."""

from __future__ import annotations

import math
from typing import Any

from core.errors import ConfigError

CELLS_HARD_LIMIT = 10**7  # values one range / linspace axis may give (checked before it is expanded)


def _spaced(field: str, values: Any) -> tuple[str, list, int] | None:
    """``(kind, args, n)`` of a ``{range: ...}`` / ``{linspace: ...}`` axis, checked; None for anything else."""
    if not (isinstance(values, dict) and len(values) == 1 and set(values) <= {"range", "linspace"}):
        return None
    kind, args = next(iter(values.items()))
    ints = kind == "range"
    if not (isinstance(args, list) and len(args) in ((2, 3) if ints else (3,))
            and all(isinstance(a, int if ints else (int, float)) and not isinstance(a, bool) for a in args)):
        raise ConfigError(f"{field}.{kind}", "write range: [start, stop] or [start, stop, step] (integers)" if ints
                          else "write linspace: [first, last, n] (numbers, n an integer)")
    n = len(range(*args)) if ints and args[-1] != 0 else args[2] if not ints else 0
    if not ints and not isinstance(args[2], int):
        raise ConfigError(f"{field}.linspace", "n (the third value) must be an integer")
    if not 0 < n <= CELLS_HARD_LIMIT:
        raise ConfigError(f"{field}.{kind}", f"gives {n:,} values; allowed: 1 to {CELLS_HARD_LIMIT:,}")
    return kind, args, n


def axis_length(field: str, values: Any) -> int | None:
    """How many values a grid axis as written gives, counted without expanding a range or linspace;
    None for what is not an axis (:func:`parse_one` says why)."""
    spaced = _spaced(field, values)
    return spaced[2] if spaced else len(values) if isinstance(values, list) else None


def axis_values(field: str, values: Any) -> Any:
    """A grid axis as written: a list, or ``{range: [start, stop]}`` / ``{range: [start, stop, step]}``
    (integers, stop excluded, as Python's range) or ``{linspace: [first, last, n]}`` (n floats)."""
    spaced = _spaced(field, values)
    if spaced is None:
        return values
    kind, args, n = spaced
    if kind == "range":
        return list(range(*args))
    first, last, _ = args
    return [first + (last - first) * i / (n - 1) if n > 1 else float(first) for i in range(n)]


def refuse_more_cells(lengths: dict[str, int], runner: dict) -> None:
    """A grid of more than ``runner.max_cells`` cells refused in one line (``lengths``: values per axis)."""
    n_cells = math.prod(lengths.values())
    if n_cells > runner["max_cells"]:
        sizes = " x ".join(f"{n} {k}" for k, n in lengths.items())
        raise ConfigError("grid", f"{n_cells:,} cells ({sizes}) is more than the limit of {runner['max_cells']:,} "
                          f"(runner.max_cells); pass --max-cells {n_cells} if you mean it")


def as_range(values: list) -> dict | None:
    """``{range: [start, stop, step]}`` for 16 or more integers in steps of one nonzero stride."""
    if len(values) < 16 or not all(type(v) is int for v in values):
        return None
    step = values[1] - values[0]
    if step == 0 or any(b - a != step for a, b in zip(values, values[1:])):
        return None
    return {"range": [values[0], values[-1] + step, step]}
