"""Reading results: ``open_results(path)`` -> xarray.Dataset (or DataTree, one node per stage),
``load_nets`` (stored nets as tensors), status and summaries."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import xarray as xr
import zarr

from core.errors import StoreError
from storage import schema
from storage.store import open_dataset


def groups(path: str | pathlib.Path) -> list[str]:
    """The experiment groups of a store."""
    path = pathlib.Path(path)
    if not (path / "zarr.json").exists():
        raise StoreError(f"{path} is not a kktlab store (no zarr.json)")
    root = zarr.open_group(str(path), mode="r", zarr_format=3, use_consolidated=False)  # live, never the view
    return sorted(name for name, g in root.groups() if "kktlab_identity" in g.attrs)


def chain_order(path: str | pathlib.Path) -> list[str]:
    """The groups of a store in chain order: every stage after the stage it reads from, stages of one
    level in the order their config lists them (then by name), not alphabetically."""
    names = groups(path)
    info = {}
    for name in names:
        attrs = zarr.open_group(str(pathlib.Path(path) / name), mode="r", zarr_format=3).attrs
        ident = json.loads(attrs.get("kktlab_identity") or "{}")
        try:
            stages = [s.get("name") for s in json.loads(attrs.get("config") or "{}").get("stages") or []]
        except (ValueError, AttributeError):
            stages = []
        info[name] = (ident.get("from"), stages.index(name) if name in stages else len(stages))
    out: list[str] = []

    def visit(parent):
        for name in sorted((n for n in names if info[n][0] == parent), key=lambda n: (info[n][1], n)):
            out.append(name)
            visit(name)
    visit(None)
    return out + [n for n in names if n not in out]  # a group reading from one not in the store


def open_results(path: str | pathlib.Path, group: str | None = None, dask: bool = True) -> xr.Dataset | xr.DataTree:
    """The results of one experiment group as an xarray.Dataset (lazy, dask-backed; ``dask=False``:
    lazily indexed NumPy arrays, no Dask).

    ``group`` may be left out when the store holds a single group (a config without stages):
    its Dataset. A store of several groups (the stages of a chain, one node per stage named after
    it, or several configs sharing a store) without ``group``: an ``xarray.DataTree`` of them
    (``xr.open_datatree(path, engine="zarr")`` opens the same tree)."""
    names = groups(path)
    if group is None:
        if not names:
            raise StoreError(f"{path} holds no experiment group")
        if len(names) > 1:
            return xr.DataTree.from_dict({f"/{name}": open_dataset(path, name, dask) for name in names})
        group = names[0]
    if group not in names:
        raise StoreError(f"{path} has no experiment group {group!r}; it has {names}")
    return open_dataset(path, group, dask)


def status(path: str | pathlib.Path) -> list[dict]:
    """Cells done / total per experiment group (reads only the ``done`` arrays)."""
    out = []
    for name in groups(path):
        g = zarr.open_group(str(pathlib.Path(path) / name), mode="r", zarr_format=3)
        if schema.DONE not in g:  # the group is being created right now
            continue
        done = np.asarray(g[schema.DONE][...], dtype=bool)
        failed = np.asarray(g[schema.FAILED][...], dtype=bool) if schema.FAILED in g else np.zeros_like(done)
        out.append({"group": name, "experiment": g.attrs.get("kktlab_experiment", "?"),
                    "done": int(done.sum()), "total": int(done.size), "failed": int((failed & done).sum()),
                    "failures": schema.failures(g.attrs)})
    return out


def left_out_by_status(path: str | pathlib.Path, group: str) -> dict[int, int]:
    """Done, not failed cells of ``group`` whose ``status`` is not among its ``ok_values`` (e.g. a
    diverged reconstruction attack, stored as not-a-result), counted per status value; {} for a group
    without a status variable. Reads the done, failed and status arrays (``status`` reads done only)."""
    g = zarr.open_group(str(pathlib.Path(path) / group), mode="r", zarr_format=3)
    if schema.STATUS not in g or schema.DONE not in g or not g[schema.STATUS].attrs.get("ok_values"):
        return {}
    done = np.asarray(g[schema.DONE][...], dtype=bool)
    if schema.FAILED in g:
        done &= ~np.asarray(g[schema.FAILED][...], dtype=bool)
    st = np.asarray(g[schema.STATUS][...])[done]
    values, counts = np.unique(st[~np.isin(st, list(g[schema.STATUS].attrs["ok_values"]))], return_counts=True)
    return {int(v): int(n) for v, n in zip(values, counts)}


def damaged(path: str | pathlib.Path, group: str) -> xr.DataArray:
    """Done cells of ``group`` that `kktlab verify` names as damaged (a missing or corrupt chunk, which
    reads as the fill value; a value not finite where declared finite), as a boolean DataArray over
    the grid: the cheap checks of :func:`storage.verify.verify_group` (``hashes=False``: an edited
    value whose chunk is sound is left to `kktlab verify`). Damage of a whole group raises StoreError."""
    from storage.verify import verify_group

    report = verify_group(path, group, None, hashes=False)
    grid = report.names.grid
    mask = np.zeros(tuple(len(v) for v in grid.values()), dtype=bool)
    for idx in report.cells:
        mask[idx] = True
    if report.broken_arrays:  # a variable or coordinate lost as a whole: every done cell is damaged
        g = zarr.open_group(str(pathlib.Path(path) / group), mode="r", zarr_format=3)
        mask |= np.asarray(g[schema.DONE][...], dtype=bool)
    return xr.DataArray(mask, dims=list(grid), attrs={"description": "done cell named damaged by kktlab verify"})


def open_checked(path: str | pathlib.Path, group: str) -> xr.Dataset:
    """:func:`open_results` with the :func:`damaged` mask beside ``done`` (lazy otherwise): what a
    reader of the full group (per-sample variables) needs so that :func:`usable` leaves damaged
    cells out, as it does for :func:`stage_scalars`' tables and figures."""
    return _with_damaged(open_results(path, group), path, group)


def _with_damaged(ds: xr.Dataset, path, group: str) -> xr.Dataset:
    """``ds`` with the :func:`damaged` mask of ``group`` beside ``done``."""
    mask = damaged(path, group).transpose(*ds[schema.DONE].dims)
    return ds.assign({schema.DAMAGED: (ds[schema.DONE].dims, mask.values, mask.attrs)})


def stage_scalars(path: str | pathlib.Path, group: str) -> xr.Dataset:
    """One number per cell of ``group`` (:func:`load_scalars`), and, for a reading stage, the scalar
    variables of the stage it read from that it does not hold itself (e.g. a universal_attack group
    gets its train stage's ``status``, ``iters``, ``log10_loss``), each downstream cell holding the
    value of the upstream cell it read (broadcast over its own axes), and the upstream's fixed
    parameters beside its own in the identity (in memory; the store is unchanged). What the report draws.
    Its ``damaged`` variable (:func:`damaged`) marks the cells :func:`usable` leaves out as damaged."""
    ds = _with_damaged(load_scalars(open_results(path, group)), path, group)
    ident = json.loads(ds.attrs.get("kktlab_identity") or "{}")
    source = ident.get("from")
    if not source:
        return ds
    up = load_scalars(open_results(path, source))
    skip = set(ds.data_vars) | {schema.DONE, schema.FAILED, schema.CELL_HASH, schema.UPSTREAM_HASH,
                                schema.FINISHED, schema.HOST}
    # an upstream variable named like one of this stage's own axes (forge's eps axis, the upstream unlearn's
    # eps) would be hidden by it: it comes in as "<source>.<name>", never silently dropped (issue 40)
    extra = {(f"{source}.{v}" if v in ds.coords else v): up[v].broadcast_like(ds[schema.DONE])
             .transpose(*ds[schema.DONE].dims).rename(f"{source}.{v}" if v in ds.coords else v)
             for v in up.data_vars if v not in skip}
    up_params = json.loads(up.attrs.get("kktlab_identity") or "{}").get("params", {})
    ident["params"] = {**up_params, **ident.get("params", {})}
    return ds.assign(extra).assign_attrs(kktlab_identity=json.dumps(ident), kktlab_upstream_variables=sorted(extra))


def load_scalars(ds: xr.Dataset) -> xr.Dataset:
    """The variables with exactly the grid dims (one number per cell), read into memory at once:
    figures and acceptance tables need only these, and many small lazy reads are slow."""
    names = [v for v in ds.data_vars if ds[v].dims == ds[schema.DONE].dims]
    return ds[names].load()


def usable(ds: xr.Dataset, ok: tuple | None = None) -> xr.DataArray:
    """Cells fit for figures, summaries and acceptance tables: done, and, where the group has a
    ``status`` variable, a status among ``ok`` (default: the variable's ``ok_values`` attribute,
    from its declaration; e.g. nonrobust: 1 converged). An unwritten int status holds the fill -1,
    which is never ok. Failed cells (their computation raised) are never usable, nor damaged ones
    where ``ds`` carries the ``damaged`` mask (:func:`stage_scalars` adds it; :func:`damaged`)."""
    mask = ds[schema.DONE].astype(bool)
    if schema.FAILED in ds:
        mask = mask & ~ds[schema.FAILED].astype(bool)
    if schema.DAMAGED in ds:
        mask = mask & ~ds[schema.DAMAGED].astype(bool)
    if schema.STATUS in ds:
        ok = tuple(ds[schema.STATUS].attrs.get("ok_values", ())) if ok is None else tuple(ok)
        if ok:
            mask = mask & ds[schema.STATUS].isin(list(ok))
    return mask


def summary_frame(ds: xr.Dataset, over: str | tuple = "seed", variables: tuple = (), ok: tuple | None = None):
    """Scalar variables averaged over ``over`` (the dims of it that the group has) on the usable cells
    only (see :func:`usable`; ``ok`` overrides the status values kept), as a pandas DataFrame, each
    mean :func:`storage.stats.aggregate`'s (per net first, then over nets; finite values only: the
    numbers ``kktlab table`` prints for the same cells). ``n_used`` counts the usable cells each row
    averages; ±inf and NaN values of usable cells are left out of the means and counted in
    ``<var>_n_inf`` / ``<var>_n_nan`` (only for variables that have any)."""
    from storage.stats import aggregate

    scalars = [v for v in ds.data_vars if v not in (schema.DONE, schema.FAILED, schema.DAMAGED)
               and ds[v].dims == ds[schema.DONE].dims
               and np.dtype(ds[v].dtype).kind in "fiub" and (not variables or v in variables)]
    mask = usable(ds, ok).load()
    over = [d for d in ((over,) if isinstance(over, str) else over) if d in ds[schema.DONE].dims]
    out = {}
    for v in scalars:
        agg = aggregate(ds[v].load(), over, usable=mask, done=ds[schema.DONE])
        out[v] = agg.estimate
        for count in ("n_inf", "n_nan"):
            if bool(agg[count].any()):
                out[f"{v}_{count}"] = agg[count]
    sub = xr.Dataset(out)
    done = ds[schema.DONE].astype(float).load()  # eager: a seed-only grid averages to 0-d (to_pandas)
    sub["done_frac"] = done.mean(over) if over else done
    sub["n_used"] = mask.astype(int).sum(over) if over else mask.astype(int)
    return sub.to_dataframe() if sub.sizes else sub.to_pandas().to_frame("mean").T


def summary(ds: xr.Dataset, over: str = "seed", max_rows: int | None = 60, variables: tuple = (),
            ok: tuple | None = None) -> str:
    """:func:`summary_frame` as a text table: every row up to ``max_rows`` (None: all). A grid with
    more rows is averaged over its last axes too until it fits, one long axis included (issue 33
    item 5: a 10^5-cell sweep ends with a short table of counts and means, not 10^5 rows), and says
    so and how to list every cell (never cut silently, issue 31)."""
    dims = list(ds[schema.DONE].dims)
    over = [over] if isinstance(over, str) else list(over)
    note = ""
    if max_rows is not None:
        kept = [d for d in dims if d not in over]
        while kept and np.prod([ds.sizes[d] for d in kept]) > max_rows:
            over.append(kept.pop())
        if len(over) > 1 and any(d in dims for d in over[1:]):
            note = (f"\n(means over {', '.join(d for d in over if d in dims)}: n_used counts the cells of each row; "
                    "every cell: kktlab show STORE --all, or kktlab table STORE GROUP --over '')")
    df = summary_frame(ds, tuple(over), variables, ok)
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 14, "display.precision", 4,
                           "display.max_rows", None):
        return df.to_string() + note


def fixed_params(ds: xr.Dataset) -> dict:
    """The config's fixed parameters (not grid axes) that made this group, from its identity."""
    return json.loads(ds.attrs.get("kktlab_identity") or "{}").get("params", {})


def provenance(ds: xr.Dataset) -> dict:
    return {k: (json.loads(v) if k == "versions" else v) for k, v in ds.attrs.items()
            if k in ("kktlab_experiment", "git_commit", "device", "created", "versions", "host")}


def load_nets(path: str | pathlib.Path, group: str, *, rebuild=None, **sel):
    """The stored nets of ``group`` (a ``train`` stage) for the cells matching ``sel`` (dim=value
    or dim=[values]; left-out dims: all), as :class:`storage.nets.Nets`: stacked float64 tensors
    W, b, v, X, y, the sample mask and true sizes d, m, width, cut to the selection's largest
    sizes. Raises :class:`StoreError` naming a selected cell that is not done, failed or stored
    no nets. ``rebuild``: the producing experiment's (data kept as indices, W0 as its seed);
    :func:`kktlab.load_nets` passes it for you."""
    from storage.nets import load_nets_at, select_indices

    nets = load_nets_at(path, group, select_indices(path, group, sel), rebuild)
    bad = [p for p in nets.problems if p]
    if bad:
        raise StoreError(f"{len(bad)} selected cells have no usable nets, e.g. {bad[0]}")
    return nets
