"""One table from a store: the usable cells of a group (the mask the figures and acceptance tables
use, :func:`storage.query.usable`: done, not failed, not damaged, an ok status), selected, grouped and
aggregated by the one statistics layer (:func:`storage.stats.aggregate`: per net first, then over
nets), every row kept.

    table(store, "sweep", vars=["eps", "eps_mean"], by=["alpha"], over=["seed"], stat="mean")

is a pandas DataFrame with one row per group of ``by`` (and every grid dim not aggregated over),
then ``cells`` (the usable cells the row aggregates) and ``excluded`` (done cells of the row left
out as not usable: failed, damaged, a status outside the declared ok values; pending cells are
neither), then for each variable, in
the order asked (default: sorted): ``<var>`` (``stat`` of it), ``<var>_lo`` / ``<var>_hi`` (the
interval, named in the frame's ``attrs["interval"]``; NaN where there is none), ``<var>_n`` (the nets
whose finite values entered), ``<var>_n_inf`` / ``<var>_n_nan`` (values left out as ±inf / NaN). The
columns are the same for every stat, so two runs of a command write the same columns in the same order.
A reading stage's table can group or select on the variables of the stage it read (its upstream's
``status`` or ``d_used``, as :func:`storage.query.stage_scalars` joins them). The frame's
``attrs["damaged"]`` counts the group's damaged cells (``kktlab table`` says so and exits 1).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
import xarray as xr

from core.errors import UserError
from storage import schema
from storage.query import groups, stage_scalars, usable
from storage.stats import STATS, aggregate, interval_name

COUNTS = ("n", "n_inf", "n_nan")


def table(path: str | pathlib.Path, group: str | None = None, vars=(), by=(), over=None, stat: str = "mean",
          where=None, interval: str = "t") -> pd.DataFrame:
    """``vars``: scalar variables (default: every numeric one); ``by``: grid dims or variables to
    group on; ``over``: grid dims aggregated over (default: ``seed`` where it is a dim); a grid
    dim in neither is kept as a grouping column. ``where``: ``{name: value or [values]}`` or
    strings ``"name=v1,v2"``, on grid dims or variables. ``stat``: one of :data:`STATS`;
    ``interval``: ``t`` (Student's t) or ``bca`` (bootstrap), see :mod:`storage.stats`."""
    ds, group = _scalars(path, group)
    vars, by, over = _names(vars), _names(by), _names(over)
    dims = list(ds[schema.DONE].dims)
    if stat not in STATS:
        raise UserError(f"--stat {stat!r} is not one of {', '.join(STATS)}")
    if interval not in ("t", "bca"):
        raise UserError(f"--interval {interval!r} is not one of t, bca")
    if over is None:
        over = ["seed"] if "seed" in dims else []
    numeric = [v for v in ds.data_vars if v not in (schema.DONE, schema.FAILED, schema.DAMAGED)
               and ds[v].dtype.kind in "fiub"]
    vars = vars or sorted(v for v in numeric if v not in (schema.CELL_HASH, schema.UPSTREAM_HASH))
    for field, names, allowed in (("--vars", vars, numeric), ("--by", by, dims + numeric), ("--over", over, dims)):
        bad = [n for n in names if n not in allowed]
        if bad:
            raise UserError(f"{field}: {', '.join(bad)} not in group '{group}' of {path} "
                            f"(it has {', '.join(sorted(allowed))})")
    where = _where(where)
    bad = [n for n in where if n not in dims + numeric]
    if bad:
        raise UserError(f"--where: {', '.join(bad)} neither a grid dim nor a variable of group '{group}'")
    member = xr.ones_like(ds[schema.DONE], dtype=bool)
    for name, values in where.items():
        member = member & ds[name].isin([_as(ds[name], v) for v in values])
    for name in by:  # a variable to group on: a new axis, one value per group, each cell a member of its own
        if name not in dims:
            split = ds[name].where(member)
            values = pd.unique(split.values[np.isfinite(split.values)]) if split.dtype.kind == "f" \
                else pd.unique(split.values.ravel())
            values = np.sort(values)
            member = xr.concat([member & (ds[name] == v) for v in values], dim=pd.Index(values, name=name))
    over = [d for d in over if d not in by]
    mask = usable(ds)
    keys = list(by) + [d for d in dims if d not in by and d not in over]
    done = ds[schema.DONE].astype(bool)
    cells = (member & mask).sum(over).astype(int)
    excluded = (member & done & ~mask).sum(over).astype(int)
    columns = {"cells": cells, "excluded": excluded}
    for v in vars:
        agg = aggregate(ds[v].broadcast_like(member), over, usable=mask, member=member, done=done, stat=stat, interval=interval)
        columns.update({v: agg.estimate, f"{v}_lo": agg.lo, f"{v}_hi": agg.hi,
                        **{f"{v}_{c}": agg[c] for c in COUNTS}})
    frame = _frame(xr.Dataset(columns), keys)
    frame = frame[(frame["cells"] > 0) | (frame["excluded"] > 0)].reset_index(drop=True)  # rows outside the selection
    frame.attrs.update(interval=interval_name(stat, interval) if "seed" in over and "seed" in dims else "none",
                       stat=stat, averaged=[d for d in over if d in dims],
                       damaged=int(ds[schema.DAMAGED].sum()) if schema.DAMAGED in ds else 0,
                       units=_units(ds, frame.columns, vars))
    return frame


def _units(ds: xr.Dataset, columns, vars) -> dict[str, dict[str, str]]:
    """Per column its ``units`` and ``long_name`` (written into a Parquet file's field metadata):
    a variable's interval as the variable, its counts and the cell counts dimensionless."""
    out = {}
    for col in columns:
        base = next((v for v in vars if col in (v, f"{v}_lo", f"{v}_hi")), None)
        src = ds[base] if base is not None else ds[col] if col in ds.variables else None
        if base is None and col not in ds.dims:  # cells, excluded, <var>_n...
            out[col] = {"units": "1", "long_name": col.replace("_", " ")}
        elif src is not None:
            out[col] = {"units": str(src.attrs.get("units", "1")), "long_name": str(src.attrs.get("long_name", col))}
    return out


def _frame(table: xr.Dataset, keys: list[str]) -> pd.DataFrame:
    """``table`` as rows: the ``keys`` columns first, the rows in their order (the first key slowest: a
    Dataset's ``to_dataframe`` otherwise orders rows by its dims' own order, not a transpose), then its
    variables in order."""
    if not keys:
        return table.expand_dims("_row").to_dataframe().reset_index(drop=True)
    return table.to_dataframe(dim_order=keys).reset_index()[keys + list(table.data_vars)]


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


def _as(column, value):
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
        import pyarrow as pa
        import pyarrow.parquet as pq

        tab = pa.Table.from_pandas(df, preserve_index=False)
        units = df.attrs.get("units", {})
        fields = [f.with_metadata({k.encode(): v.encode() for k, v in units.get(f.name, {}).items()}) if f.name in units
                  else f for f in tab.schema]
        pq.write_table(tab.cast(pa.schema(fields, metadata=tab.schema.metadata)), out)
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
