"""``kktlab table`` / ``kktlab.table`` (issue 31 item 1): the usable cells only (the mask the figures
use: done, not failed, an ok status), grouped and aggregated with counts, every row, exported."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import kktlab
from core.errors import UserError
from flows import config
from flows.sweep import open_store

D, SEEDS = [10, 20, 30], [0, 1, 2]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A nonrobust group with known numbers: c_star = d + seed, iters = 100·seed. Cell (d=20, seed=2)
    did not converge (status 2: not usable), (d=30, seed=0) is not done; every other cell converged."""
    path = tmp_path_factory.mktemp("table") / "s.zarr"
    cfg = config.parse({"experiment": "nonrobust", "grid": {"d": D, "seed": SEEDS}, "params": {"width": 8}})
    st = open_store(cfg, path, "cpu")
    for i, d in enumerate(D):
        for j, s in enumerate(SEEDS):
            if (d, s) == (30, 0):
                continue
            vals = {n: (np.zeros(4, v.dtype) if v.dims else np.asarray(0, v.dtype)) for n, v in cfg.exp.variables.items()}
            vals.update(c_star=np.float64(d + s), iters=np.int64(100 * s), status=np.int64(2 if (d, s) == (20, 2) else 1))
            assert st.write_cell((i, j), vals)
    return path


def test_usable_cells_grouped_with_counts(store):
    df = kktlab.table(store, vars=["c_star", "iters"], by=["d"])
    per_var = ["", "_lo", "_hi", "_n", "_n_inf", "_n_nan"]
    assert list(df.columns) == ["d", "cells", "excluded"] + [f"{v}{s}" for v in ("c_star", "iters") for s in per_var]
    assert df.set_index("d")["cells"].to_dict() == {10: 3, 20: 2, 30: 2}  # the non-converged and the undone cell are left out
    assert df.set_index("d")["excluded"].to_dict() == {10: 0, 20: 1, 30: 0}  # (30, 0) is pending, not excluded
    assert df.set_index("d")["c_star"].to_dict() == pytest.approx({10: 11.0, 20: 20.5, 30: 31.5})


def test_stats_selection_and_kept_dims(store):
    sem = kktlab.table(store, vars="c_star", by="d", stat="sem").set_index("d")["c_star"]
    assert sem[10] == pytest.approx(np.std([10, 11, 12], ddof=1) / np.sqrt(3))
    every = kktlab.table(store, vars="c_star", over=[])  # nothing aggregated: one row per done cell
    assert every.cells.sum() == 7 and every.excluded.tolist().count(1) == 1 and len(every) == 8 and set(every.columns) == {"d", "seed", "cells", "excluded", "c_star", "c_star_lo",
                                                        "c_star_hi", "c_star_n", "c_star_n_inf", "c_star_n_nan"}
    one = kktlab.table(store, vars="c_star", where=["d=10,30", "seed=1"], over=[])
    assert sorted(one.c_star) == [11.0, 31.0] and one.c_star_n.tolist() == [1, 1]
    assert kktlab.table(store, vars="c_star", where={"iters": 0}, over=["d", "seed"]).cells.tolist() == [2]
    assert kktlab.table(store, vars="c_star", by="d", stat="count").c_star.tolist() == [3, 2, 2]



def test_rows_follow_the_order_of_by(store):
    """The first ``by`` name varies slowest, whatever the group's own dim order (issue 40: the same
    query's rows came in another order once a dim was renamed)."""
    df = kktlab.table(store, vars="c_star", by=["seed", "d"], over=[])
    assert list(df.columns[:2]) == ["seed", "d"]
    assert df[["seed", "d"]].values.tolist() == [[s, d] for s in SEEDS for d in D if (d, s) != (30, 0)]  # pending
    import xarray as xr

    from storage.table import _frame

    # a Dataset orders its rows by its dims' first appearance (here the coordinates': y, then x), which
    # Dataset.transpose does not change: the rows still follow the keys
    a = xr.DataArray(np.arange(6).reshape(3, 2), dims=("y", "x"), coords={"y": [10, 20, 30], "x": [0, 1]})
    rows = _frame(xr.Dataset({"cells": a}), ["x", "y"])
    assert rows[["x", "y"]].values.tolist() == [[x, y] for x in (0, 1) for y in (10, 20, 30)]

@pytest.mark.parametrize("kw, field", [({"vars": "nope"}, "--vars"), ({"by": "width"}, "--by"),
                                       ({"over": "alpha"}, "--over"), ({"stat": "mode"}, "--stat"),
                                       ({"where": "d"}, "--where"), ({"where": "zz=1"}, "--where")])
def test_bad_query_names_the_field(store, kw, field):
    with pytest.raises(UserError, match=field):
        kktlab.table(store, **kw)


def test_cli_formats(store, tmp_path, cli):
    calls: list = []

    def table(*args):  # the first as its own process (python -m kktlab.cli), the others in this one
        calls.append(args)
        return cli.run("table", store, *args, process=len(calls) == 1)

    text = table("--vars", "c_star", "--by", "d")
    assert text.returncode == 0 and text.stdout.split("\n")[0].split()[:4] == ["d", "cells", "excluded", "c_star"]
    assert "Student's t 95 %" in text.stderr
    csv = table("--vars", "c_star", "--by", "d", "--format", "csv").stdout
    assert pd.read_csv(pd.io.common.StringIO(csv)).cells.tolist() == [3, 2, 2]
    rows = json.loads(table("--vars", "c_star", "--by", "d", "--format", "json").stdout)
    assert [r["d"] for r in rows] == D
    assert table("--vars", "c_star", "--by", "d", "--format", "markdown").stdout.startswith("|")
    out = tmp_path / "t.parquet"
    assert table("--by", "d", "--format", "parquet", "--out", str(out)).returncode == 0
    assert pd.read_parquet(out).cells.tolist() == [3, 2, 2]
    bad = table("--vars", "nope")
    assert bad.returncode == 2 and bad.stderr.startswith("kktlab: error: --vars: nope") and "Traceback" not in bad.stderr
