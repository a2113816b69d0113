"""One table from a store: the usable cells of a group (the mask the figures and acceptance tables
use, :func:`storage.query.usable`), selected, grouped and aggregated, every row kept.

    table(store, "sweep", vars=["eps", "eps_mean"], by=["alpha"], over=["seed"], stat="mean")

is a pandas DataFrame with one row per group of ``by`` (and every grid dim not aggregated over),
the number of usable cells ``n`` each row aggregates, and ``stat`` of each variable over them.
A reading stage's table can group or select on the variables of the stage it read (its
upstream's ``status`` or ``d_used``, as :func:`storage.query.stage_scalars` joins them).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

from core.errors import UserError
from storage import schema
from storage.query import groups, stage_scalars, usable

STATS = ("mean", "median", "std", "sem", "min", "max", "count")


def table(path: str | pathlib.Path, group: str | None = None, vars=(), by=(), over=None, stat: str = "mean",
          where=None) -> pd.DataFrame:
    """``vars``: scalar variables (default: every numeric one); ``by``: grid dims or variables to
    group on; ``over``: grid dims aggregated over (default: ``seed`` where it is a dim); a grid
    dim in neither is kept as a grouping column. ``where``: ``{name: value or [values]}`` or
    strings ``"name=v1,v2"``, on grid dims or variables. ``stat``: one of :data:`STATS`."""
    ds, group = _scalars(path, group)
    vars, by, over = _names(vars), _names(by), _names(over)
    dims = list(ds[schema.DONE].dims)
    if stat not in STATS:
        raise UserError(f"--stat {stat!r} is not one of {', '.join(STATS)}")
    if over is None:
        over = ["seed"] if "seed" in dims else []
    numeric = [v for v in ds.data_vars if v not in (schema.DONE, schema.FAILED) and ds[v].dtype.kind in "fiub"]
    vars = vars or [v for v in numeric if v not in (schema.CELL_HASH, schema.UPSTREAM_HASH)]
    for field, names, allowed in (("--vars", vars, numeric), ("--by", by, dims + numeric), ("--over", over, dims)):
        bad = [n for n in names if n not in allowed]
        if bad:
            raise UserError(f"{field}: {', '.join(bad)} not in group '{group}' of {path} "
                            f"(it has {', '.join(sorted(allowed))})")
    where = _where(where)
    bad = [n for n in where if n not in dims + numeric]
    if bad:
        raise UserError(f"--where: {', '.join(bad)} neither a grid dim nor a variable of group '{group}'")
    cols = ds[sorted(set(vars) | {v for v in [*by, *where] if v not in dims})].assign(_usable=usable(ds))
    frame = cols.to_dataframe().reset_index()
    frame = frame[frame.pop("_usable").astype(bool)]
    for name, values in where.items():
        frame = frame[frame[name].isin([_as(frame[name], v) for v in values])]
    keys = list(by) + [d for d in dims if d not in by and d not in over]
    if not keys:
        return _aggregate(frame.assign(_all=0), ["_all"], vars, stat).drop(columns="_all")
    return _aggregate(frame, keys, vars, stat)


def _aggregate(frame: pd.DataFrame, keys: list[str], vars: list[str], stat: str) -> pd.DataFrame:
    """One row per value of ``keys``: ``n`` usable cells, then ``stat`` of each variable (NaN-skipping;
    ``sem``: std / √count of the finite values)."""
    grouped = frame.groupby(keys, sort=True, dropna=False)
    out = grouped.size().rename("n").to_frame()
    for v in vars:
        col = grouped[v]
        if stat == "sem":
            out[v] = col.std() / np.sqrt(col.count())
        else:
            out[v] = getattr(col, stat)()
    return out.reset_index()


def _scalars(path, group):
    names = groups(path)
    if group is None:
        if len(names) != 1:
            raise UserError(f"{path} holds groups {', '.join(names)}: name one (kktlab table STORE GROUP)")
        group = names[0]
    if group not in names:
        raise UserError(f"{path} has no group {group!r}; it has {', '.join(names)}")
    return stage_scalars(path, group), group


def _names(x) -> list[str] | None:
    if x is None:
        return None
    if isinstance(x, str):
        x = x.split(",")
    return [s.strip() for s in x if s.strip()]


def _where(where) -> dict[str, list]:
    """``{name: [values]}`` from a dict or from strings ``name=v1,v2``."""
    if not where:
        return {}
    if isinstance(where, dict):
        return {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in where.items()}
    out = {}
    for item in [where] if isinstance(where, str) else where:
        name, sep, values = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--where {item!r}: write name=value (or name=v1,v2)")
        out[name.strip()] = [v.strip() for v in values.split(",")]
    return out


def _as(column: pd.Series, value):
    """``value`` (a string from the command line, or a number) in the column's type."""
    if not isinstance(value, str):
        return value
    kind = column.dtype.kind
    try:
        return float(value) if kind == "f" else int(value) if kind in "iu" else \
            value.lower() in ("1", "true") if kind == "b" else value
    except ValueError:
        raise UserError(f"--where: {value!r} is not a value of {column.name} ({column.dtype})") from None


def write(df: pd.DataFrame, fmt: str, out: str | None) -> str | None:
    """``df`` as text (every row), csv, markdown, json (records) or parquet (``out`` required):
    written to ``out`` if given, else returned."""
    if fmt == "parquet":
        if not out:
            raise UserError("--format parquet needs --out FILE")
        df.to_parquet(out, index=False)
        return None
    if fmt == "text":
        with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_rows", None):
            text = df.to_string(index=False) + "\n"
    elif fmt == "csv":
        text = df.to_csv(index=False)
    elif fmt == "markdown":
        text = df.to_markdown(index=False) + "\n"
    elif fmt == "json":
        text = df.to_json(orient="records", indent=1) + "\n"
    else:
        raise UserError(f"--format {fmt!r} is not one of text, csv, markdown, json, parquet")
    if out:
        pathlib.Path(out).write_text(text)
        return None
    return text
