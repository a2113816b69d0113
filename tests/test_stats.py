"""One statistics layer (issue 40, storage/stats.py): the stated 95 % interval covers 95 % of the
time on problems with a known answer; per net first, then over nets; one inf/NaN policy, so
``show`` and ``table`` print the same number; damaged cells left out and counted everywhere."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import xarray as xr

import kktlab
from flows import config
from flows.sweep import open_store
from kktlab import tables
from storage.query import stage_scalars, summary_frame, usable
from storage.stats import aggregate, caption, yerr

REPS = 4000  # coverage's standard error sqrt(.95 .05 / 4000) = 0.0034: 93-97 % is ±6 of them


def _draws(n: int, seed: int, mean: float = 2.0) -> xr.DataArray:
    rng = np.random.default_rng(seed)
    return xr.DataArray(rng.normal(mean, 3.0, size=(REPS, n)), dims=("rep", "seed"))


@pytest.mark.parametrize("n", [3, 5, 10])
def test_student_t_interval_covers_95_percent(n):
    """n normal values with mean 2, REPS times: the stated 95 % interval holds 2 in 93-97 % of them
    (1.96 sem covers ~80 % at n = 3, 88 % at n = 5, 92 % at n = 10: red here)."""
    agg = aggregate(_draws(n, seed=n), ("seed",))
    assert agg.attrs["interval"] == "Student's t 95 %" and (agg.n == n).all()
    covered = float(((agg.lo <= 2.0) & (2.0 <= agg.hi)).mean())
    assert 0.93 <= covered <= 0.97, covered
    assert float(agg.estimate.mean()) == pytest.approx(2.0, abs=0.05)


@pytest.mark.parametrize("n", [3, 5, 10])
@pytest.mark.parametrize("p", [0.05, 0.3, 0.9])
def test_a_proportion_of_nets_has_the_exact_binomial_interval_covering_at_least_95_percent(n, p):
    """Each net's value 0 or 1 (a point recovered from it, or not), success probability p, REPS times:
    the interval is Clopper-Pearson's and holds p in >= 95 % of them (minus 3 standard errors), at
    every p; Student's t there covers 23 % at p = 0.05, n = 5 ("0 ± 0" whenever no net succeeds)."""
    rng = np.random.default_rng(int(100 * p) + n)
    draws = xr.DataArray((rng.random((REPS, n)) < p).astype(float), dims=("rep", "seed"))
    agg = aggregate(draws, ("seed",))
    assert agg.attrs["interval"] == "Clopper-Pearson 95 %" and (agg.n == n).all()
    covered = float(((agg.lo <= p) & (p <= agg.hi)).mean())
    assert covered >= 0.95 - 3 * 0.0034, covered
    none = agg.where(draws.sum("seed") == 0, drop=True)  # no net succeeded: [0, 1 - 0.025^(1/n)], never 0 ± 0
    if none.sizes["rep"]:
        assert (none.lo == 0).all() and np.allclose(none.hi, 1 - 0.025 ** (1 / n))


def test_a_proportion_beside_other_values_names_both_intervals():
    x = xr.DataArray([[0.0, 1.0, 0.0], [0.2, 0.5, 0.9]], dims=("row", "seed"))
    agg = aggregate(x, ("seed",))
    assert agg.attrs["interval"] == "Student's t 95 % (Clopper-Pearson 95 % where each net's value is 0 or 1)"
    assert float(agg.lo[0]) > 0.0 - 1e-12 and float(agg.hi[0]) == pytest.approx(0.9057, abs=1e-4)  # 1 of 3
    half = 4.303 * np.std([0.2, 0.5, 0.9], ddof=1) / np.sqrt(3)
    assert float(agg.hi[1] - agg.estimate[1]) == pytest.approx(half, rel=1e-3)


def test_median_order_statistic_interval_covers_at_least_95_percent():
    """n = 10: (x_(2), x_(9)) covers the median with probability 1 - 2·11/1024 = 0.9785; at n = 5
    no order-statistic interval reaches 95 %: none is stated."""
    agg = aggregate(_draws(10, seed=1), ("seed",), stat="median")
    covered = float(((agg.lo <= 2.0) & (2.0 <= agg.hi)).mean())
    assert agg.attrs["interval"] == "order-statistic 95 %"
    assert 0.97 <= covered <= 0.99, covered
    assert np.isnan(aggregate(_draws(5, seed=2), ("seed",), stat="median").lo).all()


def test_per_net_first_then_over_nets():
    """3 nets x 2 radii: n = 3 nets (not 6 values); the interval is the t interval of the 3 per-net means."""
    x = np.array([[1.0, 3.0], [2.0, 8.0], [6.0, 4.0]])  # (seed, R): per-net means 2, 5, 5
    agg = aggregate(xr.DataArray(x, dims=("seed", "R")), ("seed", "R"))
    per_net = x.mean(1)
    half = 4.302652729911275 * per_net.std(ddof=1) / np.sqrt(3)  # t_{0.975, 2}
    assert int(agg.n) == 3 and float(agg.estimate) == pytest.approx(4.0)
    assert (float(agg.lo), float(agg.hi)) == pytest.approx((4.0 - half, 4.0 + half))
    assert "R averaged within each net" in caption(agg) and "n = 3" in caption(agg)


def test_non_finite_values_counted_and_left_out_and_bands_clipped_to_the_domain():
    x = xr.DataArray([[0.1, np.inf], [0.05, 0.2], [np.nan, 0.02]], dims=("seed", "R"), attrs={"valid_min": 0.0})
    agg = aggregate(x, ("seed", "R"))
    assert (int(agg.n), int(agg.n_inf), int(agg.n_nan)) == (3, 1, 1)
    assert float(agg.estimate) == pytest.approx(np.mean([0.1, 0.125, 0.02]))
    assert float(agg.lo) == 0.0 < float(agg.hi)  # the t interval reaches below 0; eps >= 0 is declared
    assert yerr(agg.expand_dims("x")).shape == (2, 1)
    free = aggregate(x.drop_attrs(), ("seed", "R"))
    assert float(free.lo) < 0  # not clipped where no domain is declared


def test_a_stored_nonnegative_quantity_s_interval_stops_at_zero():
    """Issue 40: reconstruct's objective_rel, residuals and distances declare their domain (core.declare
    NONNEG), stored as valid_min, so the t band over 3 nets stops at 0 instead of reaching below it."""
    from flows.experiments import reconstruct
    from storage import schema

    for name in ("objective_rel", "residual_exact_rel", "dist_forgotten", "score5"):
        x = xr.DataArray([1e-3, 2e-4, 0.3], dims=("seed",), attrs=schema.acted_on(reconstruct.V[name]))
        agg = aggregate(x, ("seed",))
        assert float(agg.lo) == 0.0 < 0.3 < float(agg.hi), name
        assert float(aggregate(x.drop_attrs(), ("seed",)).lo) < 0, name  # the t band reaches below 0


def test_every_distance_norm_time_and_eps_of_the_chain_declares_it_cannot_be_negative():
    """Every variable of the chain's experiments in units of a norm or of time, or named as a KKT distance
    (ε, ε_rel), declares it is never negative, and every accuracy or recovered fraction that it lies
    in [0, 1], so no interval of them leaves that range (a new one without a domain fails here)."""
    from flows.experiments import get

    fractions = ("recovered_forgotten", "recovered_retained", "rta", "rta_forgotten", "rta_retained", "train_acc",
                 "test_acc", "clean_acc")
    missing = []
    for exp in map(get, CHAIN):
        for name, var in exp.variables.items():
            if (var.units in ("l2 norm", "s") or name in ("eps", "eps_rel", "eps1_rel")) and not (
                    var.domain and var.domain[0] == 0.0):
                missing.append(f"{exp.name}.{name}")
            if name in fractions and var.domain != (0.0, 1.0):
                missing.append(f"{exp.name}.{name}")
    assert not missing, missing


CHAIN = ("train_kkt", "unlearn", "reconstruct", "reconstruct_diff", "single_step", "pgd", "forge_net")


D, SEEDS = [10, 20], [0, 1, 2]


@pytest.fixture
def store(tmp_path):
    """nonrobust, c_star = d + seed, converged; (d=20, seed=1) has c_star = inf."""
    path = tmp_path / "s.zarr"
    cfg = config.parse({"experiment": "nonrobust", "grid": {"d": D, "seed": SEEDS}, "params": {"width": 8},
                        "runner": {"chunk_cells": 1}})  # one chunk per cell: a deleted chunk is one cell's
    st = open_store(cfg, path, "cpu")
    for i, d in enumerate(D):
        for j, s in enumerate(SEEDS):
            vals = {n: (np.zeros(4, v.dtype) if v.dims else np.asarray(0, v.dtype)) for n, v in cfg.exp.variables.items()}
            vals.update(c_star=np.float64(np.inf if (d, s) == (20, 1) else d + s), status=np.int64(1))
            assert st.write_cell((i, j), vals)
    return path


def test_table_counts_nets_not_cells(store):
    """d as a second axis averaged within each net: n = 3 nets, not 6 cells."""
    row = kktlab.table(store, vars="c_star", over=["seed", "d"]).iloc[0]
    assert row["cells"] == 6 and row["c_star_n"] == 3 and row["c_star_n_inf"] == 1
    per_net = [np.mean([10 + s, 20 + s]) if s != 1 else 11.0 for s in SEEDS]
    assert row["c_star"] == pytest.approx(np.mean(per_net))


@pytest.mark.parametrize("stat", ["mean", "median"])
def test_show_and_table_agree_with_an_inf(store, stat):
    """The issue's c_star case: table's mean (and median) leave the inf out and count it, as show does."""
    tab = kktlab.table(store, vars="c_star", by="d", stat=stat).set_index("d")
    assert tab.loc[20, "c_star"] == pytest.approx({"mean": 21.0, "median": 21.0}[stat])
    assert (tab.loc[20, "c_star_n"], tab.loc[20, "c_star_n_inf"]) == (2, 1)
    if stat == "mean":
        shown = summary_frame(stage_scalars(store, "nonrobust"), variables=("c_star",))
        assert shown.loc[20, "c_star"] == pytest.approx(tab.loc[20, "c_star"])
        assert shown.loc[10, "c_star"] == pytest.approx(tab.loc[10, "c_star"]) == 11.0
        assert shown.loc[20, "c_star_n_inf"] == 1


def test_a_damaged_chunk_is_left_out_and_counted(store, capsys):
    """One c_star chunk deleted: the cell reads as the fill value (NaN); usable() leaves it out, the
    table counts it in ``excluded`` and n, and ``kktlab table`` says so and exits 1."""
    (store / "nonrobust" / "c_star" / "c" / "0" / "2").unlink()  # (d=10, seed=2)
    ds = stage_scalars(store, "nonrobust")
    assert bool(ds.damaged.sel(d=10, seed=2)) and int(ds.damaged.sum()) == 1
    assert not bool(usable(ds).sel(d=10, seed=2))
    tab = kktlab.table(store, vars="c_star", by="d").set_index("d")
    assert (tab.loc[10, "cells"], tab.loc[10, "excluded"], tab.loc[10, "c_star_n"]) == (2, 1, 2)
    assert tab.loc[10, "c_star"] == pytest.approx(10.5) and tab.attrs["damaged"] == 1
    args = argparse.Namespace(store=str(store), group=None, vars="c_star", by="d", over=None, stat="mean",
                              where=None, format="csv", out=None, interval="t")
    assert tables.cmd_table(args) == 1
    assert "1 damaged cells left out" in capsys.readouterr().err


def test_the_full_group_a_per_sample_figure_reads_leaves_a_damaged_cell_out(store):
    """Issue 40: Fig 7 and X3 read the full group (per-sample variables), not stage_scalars: they get
    the damaged mask too (storage.query.open_checked), so usable() leaves the cell out there as well."""
    from storage.query import open_checked

    (store / "nonrobust" / "c_star" / "c" / "0" / "2").unlink()  # (d=10, seed=2)
    ds = open_checked(store, "nonrobust")
    assert int(ds.damaged.sum()) == 1 and not bool(usable(ds).sel(d=10, seed=2))
    assert int(usable(ds).sum()) == int(usable(stage_scalars(store, "nonrobust")).sum())


def _chain_group(var: str, dims: dict, values: np.ndarray) -> xr.Dataset:
    shape = tuple(len(v) for v in dims.values())
    return xr.Dataset({var: (tuple(dims), values), "done": (tuple(dims), np.ones(shape, bool)),
                       "failed": (tuple(dims), np.zeros(shape, bool))}, coords=dims)


def test_chain_findings_count_nets_not_radii():
    """The chain's table (analysis/pipeline.py): 3 nets x 2 radii is one row per radius (a setting,
    never averaged), each n = 3 nets with the t interval over them."""
    from analysis import pipeline

    dims = {"seed": [0, 1, 2], "unlearn_method": ["ga"], "alpha": [1.0], "R": [0.05, 0.2]}
    x = np.array([[1.0, 3.0], [2.0, 8.0], [6.0, 4.0]])[:, None, None, :]
    ds = _chain_group("rta_forgotten", dims, x).assign(rta_retained=lambda d: d.rta_forgotten * 0 + 1.0)
    rows = pipeline.findings("pgd", "pgd", ds)
    assert len(rows) == 2, rows
    for row, radius, per_net in zip(rows, ("0.05", "0.2"), ([1.0, 2.0, 6.0], [3.0, 8.0, 4.0])):
        half = sps_t975(3) * np.std(per_net, ddof=1) / np.sqrt(3)
        assert f"| R={radius} | {np.mean(per_net):.4g} ± {half:.2g} (n=3) |" in row, row
    assert "averaged within each net" not in caption(pipeline.summary(ds, "rta_forgotten"))


def test_unlearn_band_is_the_t_interval_clipped_at_zero():
    """F001-1's ε band: Student's t over the nets, never below 0 (ε >= 0), not ±1 s.d."""
    from analysis import unlearn

    eps = np.array([[0.01, 0.2], [0.02, 0.25], [0.5, 0.3]])  # (seed, alpha)
    ds = _chain_group("eps_mean", {"seed": [0, 1, 2], "alpha": [0.5, 1.0]}, eps)
    ((_, _, agg),) = unlearn.curves(ds, "eps_mean")
    mean, sd = eps.mean(0), eps.std(0, ddof=1)
    np.testing.assert_allclose(agg.hi.values, mean + sps_t975(3) * sd / np.sqrt(3))
    assert agg.lo.values[0] == 0.0 and agg.lo.values[1] > 0  # clipped only where the interval reaches below 0


def sps_t975(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def test_unlearn_figure_draws_that_band(monkeypatch, tmp_path):
    from analysis import unlearn

    got = []
    monkeypatch.setattr(unlearn, "finish", lambda fig, ax, path, title: got.append((ax, title)) or path)
    eps = np.array([[0.01, 0.2], [0.02, 0.25], [0.5, 0.3]])
    ds = _chain_group("eps_mean", {"seed": [0, 1, 2], "alpha": [0.5, 1.0]}, eps)
    unlearn._panel(ds, "eps_mean", "ε", tmp_path / "x.png", "F001-1: ε vs α")
    ((ax, title),) = got
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    ((_, _, agg),) = unlearn.curves(ds, "eps_mean")
    np.testing.assert_allclose([band.min(), band.max()], [0.0, float(agg.hi.max())])
    assert "Student's t 95 % interval over nets (seeds; n = 3 per point)" in title
    unlearn.plt.close("all")


def test_error_bars_of_a_mean_rounded_past_its_declared_maximum_are_not_negative():
    """Cosines of 1 average to 1 + 2e-16, past the declared maximum 1 the interval is clipped at: the
    interval still holds its estimate, so no error bar is negative (matplotlib refuses one: the
    tutorial's chain figure did) and no printed [lo, hi] leaves its estimate out."""
    x = xr.DataArray([1.0 + 2.2e-16, 1.0 + 2.2e-16, 1.0], dims=("seed",), attrs={"valid_min": -1.0, "valid_max": 1.0})
    agg = aggregate(x, ("seed",))
    assert float(agg.estimate) > 1.0 and float(agg.lo) <= float(agg.estimate) <= float(agg.hi)
    assert (yerr(agg.expand_dims("x")) >= 0).all()
