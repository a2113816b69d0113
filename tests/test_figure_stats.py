"""Figures and acceptance rows on the one statistics layer (issue 40, storage/stats.py): the forging,
nonrobust and reconstruct figures and the acceptance rows' means are per net first, then over the nets,
with Student's t intervals at the real n, finite values only, the rest counted, and captions that say
what was averaged, the interval and n. Fast: small datasets built in memory."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats as sps

from analysis import acceptance_000 as a0
from analysis import acceptance_001 as a1
from analysis import forging, nonrobust, reconstruct
from analysis.acceptance_004 import acceptance as acceptance_004

T975 = {n: float(sps.t.ppf(0.975, n - 1)) for n in (2, 3, 4)}


def _capture(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` (finish / save) by one that keeps the figure open and records it."""
    got = []

    def keep(fig, *args, **kw):
        got.append((fig, args, kw))
        return args[-1] if name == "save" else args[1]

    monkeypatch.setattr(module, name, keep)
    return got


def _bars(container) -> tuple[np.ndarray, np.ndarray]:
    """(y, half-widths up) of an errorbar container."""
    y = np.asarray(container.lines[0].get_ydata(), dtype=float)
    seg = np.asarray(container.lines[2][0].get_segments(), dtype=float)
    return y, seg[:, 1, 1] - y


# --- forging (F000-3): runs over seeds get Student's t, a single run its estimator's own SE --------------

EPS = [0.01, 0.03, 0.1]


def _forging(seeds: int, extra: dict | None = None) -> xr.Dataset:
    extra = extra or {}
    dims = ("d", *extra, "eps") + (("seed",) if seeds else ())
    coords = {"d": [2], **extra, "eps": EPS, **({"seed": list(range(seeds))} if seeds else {})}
    shape = tuple(len(coords[d]) for d in dims)
    exact = 2 * np.log(np.asarray(EPS)) + 0.5
    ones = np.ones(shape)
    lv = ones * exact.reshape([-1 if d == "eps" else 1 for d in dims])
    if seeds:
        lv = lv + 0.05 * np.arange(seeds).reshape([-1 if d == "seed" else 1 for d in dims])
    ds = xr.Dataset({"log_volume": (dims, lv), "log_volume_stderr": (dims, 0.1 * ones),
                     "log_volume_exact": (dims, np.full(shape, np.nan)), "status": (dims, np.zeros(shape, np.int8)),
                     "done": (dims, np.ones(shape, bool)), "predicted_exponent": (dims, 2 * ones),
                     "tube_exponent": (dims, 2 * ones), "thm2_exponent": (dims, ones)}, coords=coords)
    ds.status.attrs["ok_values"] = [0]
    return ds


def test_forging_points_over_runs_carry_the_t_interval_not_1_96_se(monkeypatch, tmp_path):
    """Two runs (seeds) per point: the bar is t_{0.975,1} s/√2 (12.7 s/√2), never 1.96 × the stored SE."""
    got = _capture(monkeypatch, forging, "finish")
    forging.figures(_forging(seeds=2), tmp_path)
    (fig, (ax, _, title), _), = got
    y, half = _bars(ax.containers[0])
    sd = np.std([0.0, 0.05], ddof=1)
    np.testing.assert_allclose(y, (2 * np.log(EPS) + 0.5 + 0.025) / np.log(10), rtol=1e-12)
    np.testing.assert_allclose(half, T975[2] * sd / np.sqrt(2) / np.log(10), rtol=1e-9)
    assert "mean ± Student's t 95 % interval over runs (seeds; n = 2 per point)" in title, title


def test_a_single_run_shows_the_estimators_own_se_and_says_so(monkeypatch, tmp_path):
    got = _capture(monkeypatch, forging, "finish")
    forging.figures(_forging(seeds=0), tmp_path)
    (fig, (ax, _, title), _), = got
    _, half = _bars(ax.containers[0])
    np.testing.assert_allclose(half, 1.959963984540054 * 0.1 / np.log(10), rtol=1e-12)
    assert "1 run per point" in title and "3 points of 1 run: ± 1.96 × the estimator's own SE" in title, title


def test_every_other_forging_axis_is_a_panel_never_its_first_value(monkeypatch, tmp_path):
    """A grid axis outside the usual panel list (R, model_seed) used to be cut to its first value."""
    got = _capture(monkeypatch, forging, "finish")
    paths = forging.figures(_forging(seeds=2, extra={"R": [1.0, 2.0]}), tmp_path)
    assert [p.name for p in paths] == ["forging_volume_R-1.0.png", "forging_volume_R-2.0.png"] and len(got) == 2


# --- nonrobust (Figs 1, 2): mean ± the sample std of spec A9, counted by the stats layer -----------------

def _nonrobust() -> xr.Dataset:
    c = np.array([[1.0, 1.2, 1.4, np.inf], [2.0, 2.2, 2.4, 2.6]])  # (d, seed); d=10 seed 3: c* = inf
    status = np.ones((2, 4), np.int8)
    status[1, 3] = 3  # dead: not usable
    ds = xr.Dataset({"c_star": (("d", "seed"), c), "status": (("d", "seed"), status),
                     "done": (("d", "seed"), np.ones((2, 4), bool))}, coords={"d": [10, 20], "seed": [0, 1, 2, 3]})
    ds.status.attrs["ok_values"] = [1]
    return ds


def test_nonrobust_caption_counts_nets_inf_and_unusable_cells():
    ds = _nonrobust()
    [line] = nonrobust.lines(ds, "c_star")
    np.testing.assert_allclose(line.mean, [1.2, 2.2])
    np.testing.assert_allclose(line.std, [0.2, 0.2])
    assert line.n.tolist() == [3, 3] and line.n_inf.tolist() == [1, 0]
    assert nonrobust.bars(ds, "c_star") == ("mean ± std over nets (seeds; n = 3 per point); left out: 1 ±inf, "
                                            "1 not usable; the sample std (ddof = 1, spec A9), not an interval")


def test_nonrobust_figure_caption_is_the_stats_layers(monkeypatch, tmp_path):
    got = _capture(monkeypatch, nonrobust, "finish")
    nonrobust.figures(_nonrobust().assign(margin_frac=lambda d: d.c_star * 0 + 1, n_off_margin=lambda d: d.c_star * 0),
                      tmp_path)
    title = got[0][1][2]
    assert "mean ± std over nets (seeds; n = 3 per point); left out: 1 ±inf, 1 not usable" in title, title


# --- reconstruct (F004-1): no pooling of settings; mean over nets of each net's restart mean ---------------

def _recon() -> xr.Dataset:
    dims = ("method", "seed", "radius", "restart")
    shape = (2, 3, 2, 2)
    base = np.array([0.5, 2.0]).reshape(2, 1, 1, 1)  # method a around 0.5, b around 2: never one box
    per_net = np.array([0.0, 0.1, 0.3]).reshape(1, 3, 1, 1)
    score = base + per_net + np.array([0.0, 0.02]).reshape(1, 1, 1, 2) + np.zeros(shape)
    status = np.ones(shape, np.int8)
    status[0, 2, 0, 1] = 2  # a diverged run: left out of its box and of its net's mean
    ds = xr.Dataset({"score5": (dims, score), "objective": (dims, np.full(shape, 330.0)),
                     "status": (dims, status), "done": (dims, np.ones(shape, bool))},
                    coords={"method": ["a", "b"], "seed": [0, 1, 2], "radius": [0.5, 1.0], "restart": [0, 1]})
    ds.status.attrs["ok_values"] = [1]
    return ds


def test_reconstruct_draws_one_figure_per_setting_with_the_mean_over_nets(monkeypatch, tmp_path):
    got = _capture(monkeypatch, reconstruct, "save")
    paths = reconstruct.figures(_recon(), tmp_path)
    assert [p.name for p in paths] == ["F004-1_score_vs_radius_method-a.png", "F004-1_score_vs_radius_method-b.png"]
    fig = got[0][0]
    ax = fig.axes[0]
    y, half = _bars(ax.containers[0])
    nets = np.array([[0.51, 0.61, 0.80], [0.51, 0.61, 0.81]])  # per radius: each net's restart mean (one diverged)
    np.testing.assert_allclose(y, nets.mean(1), rtol=1e-12)
    np.testing.assert_allclose(half, T975[3] * nets.std(1, ddof=1) / np.sqrt(3), rtol=1e-9)
    sup = fig._suptitle.get_text()
    assert "boxes: every usable run (5/6 per radius)" in sup and "n = 3 per point" in sup, sup
    assert "restart averaged within each net" in sup and "1 not usable" in sup, sup
    assert reconstruct.notes(_recon())[0].startswith("cells per radius box (method=a): r=0.5: 5, r=1: 6")


# --- acceptance rows: per net first, then over the nets ----------------------------------------------------

def test_p004_16_means_per_net_first():
    """Net 0's two restarts, net 1's one usable restart: (0.8 + 0.2)/2 over the nets, not 0.6 pooled."""
    dims = ("shift", "seed", "restart")
    ssim = np.array([[[0.8, 0.8], [0.2, 0.9]], [[0.3, 0.3], [0.3, 0.3]], [[0.1, 0.1], [0.1, 0.1]]])
    status = np.ones((3, 2, 2), np.int8)
    status[0, 1, 1] = 2
    ds = xr.Dataset({"ssim10": (dims, ssim), "ssim_max": (dims, np.full((3, 2, 2), 0.2)), "status": (dims, status),
                     "done": (dims, np.ones((3, 2, 2), bool)), "score5": (dims, np.ones((3, 2, 2))),
                     "objective": (dims, np.ones((3, 2, 2)))},
                    coords={"shift": [0.0, 0.5, 5.0], "seed": [0, 1], "restart": [0, 1]})
    ds.status.attrs["ok_values"] = [1]
    row = next(r for r in acceptance_004(ds) if r.spec_id == "P004-16")
    assert row.value == pytest.approx(0.5, abs=1e-12) and row.passed
    assert "n = 2 per shift" in row.note and "restart averaged within each net" in row.note, row.note


def _dmg(after: np.ndarray) -> xr.Dataset:
    dims = ("seed", "d", "alpha")
    shape = (2, 2, 1)
    full = lambda v, dt=float: (dims, np.full(shape, v, dtype=dt))  # noqa: E731
    feasible = np.ones(shape, np.int8)
    feasible[1, 1, 0] = 0  # net 1's d = 3000 cell is not feasible: left out
    ds = xr.Dataset({"done": full(True, bool), "feasible": (dims, feasible), "test_acc_before": full(0.9),
                     "test_acc_after": (dims, after.reshape(shape)), "sign_id_after": full(0.9)},
                    coords={"seed": [0, 1], "d": [2000, 3000], "alpha": [1.0]})
    ds.attrs["kktlab_identity"] = json.dumps({"params": {}, "from": "nets"})
    ds.attrs["config"] = json.dumps({"stages": [{"name": "nets", "params": {"mu_a": 0.1}}]})
    return ds


def test_p001_10_averages_each_net_first():
    """Net 0: 0.80 and 0.84 (mean 0.82); net 1: 0.90 (its other cell left out): 0.86 over the nets, where
    the pooled cells give 0.8467; the note says n and what was averaged."""
    row = a1.p001_10(_dmg(np.array([0.80, 0.84, 0.90, 0.0])))[0]
    assert row.value == pytest.approx(0.86 - 0.9, abs=1e-12), row
    assert "n = 2 per mean" in row.note and "d averaged within each net" in row.note, row.note


def test_p001_4_counts_only_nets_with_both_cells():
    """A net whose α = 0 cell is not feasible is left out of "ε(1) < ε(0) for >= 80 % of nets" (it used to
    count as failing: 3/4 = 75 %, FAIL); the row says n = 3/4 nets."""
    alpha = [0.0, 1.0, 1.5]
    eps = np.array([2.0, 1.0, 1.5]) * np.ones((4, 1))
    feasible = np.ones((4, 3), np.int8)
    feasible[3, 0] = 0
    ds = xr.Dataset({"eps_mean": (("seed", "alpha"), eps), "feasible": (("seed", "alpha"), feasible),
                     "done": (("seed", "alpha"), np.ones((4, 3), bool))},
                    coords={"seed": np.arange(4), "alpha": alpha},
                    attrs={"kktlab_identity": json.dumps({"params": {"unlearn_method": "ga", "k": 1}})})
    row = a1.p001_4(ds)[0]
    assert row.passed and "ε(1)<ε(0) 100%" in row.measured and row.measured.endswith("n=3/4 nets"), row


def test_forging_slope_curves_use_the_finite_runs():
    """A run with log mu = -inf at one eps: the curve's point is the other run's value (counted by the stats
    layer), not -inf (which dropped the point)."""
    df = pd.DataFrame({"eps": [0.01, 0.01, 0.1, 0.1], "seed": [0, 1, 0, 1],
                       "log_volume": [np.log(0.01) * 2, -np.inf, np.log(0.1) * 2, np.log(0.1) * 2 + 0.2]})
    df.attrs["dims"] = ["eps", "seed"]
    curve = a0._curve(df, "log_volume")
    np.testing.assert_allclose(curve.values, [2 * np.log(0.01), 2 * np.log(0.1) + 0.1])


def _inf_run_frame() -> pd.DataFrame:
    """Two runs of one linreg curve; run 1 has log mu = -inf at the middle eps."""
    eps = [1e-3, 3e-3, 1e-2]
    rows = [{"model": "linreg", "domain": "ball", "d": 2, "A": 1.0, "eps": e, "seed": s, "status": 0,
             "thm2_exponent": 1.0, "log_volume": -np.inf if (s, e) == (1, 3e-3) else 2 * np.log(e) + 0.2 * s}
            for e in eps for s in (0, 1)]
    df = pd.DataFrame(rows)
    df.attrs["dims"] = ["eps", "seed"]
    return df


def test_p000_slopes_fit_the_stats_layers_curve():
    """The -inf run leaves the middle point at the other run's value (it used to drop the point: slope 2)."""
    df = _inf_run_frame()
    eps = np.array([1e-3, 3e-3, 1e-2])
    want = np.polyfit(np.log(eps), [2 * np.log(1e-3) + 0.1, 2 * np.log(3e-3), 2 * np.log(1e-2) + 0.1], 1)[0]
    [(slope, d, _)] = a0._slopes(df, "log_volume", 1e-3, 1e-2)
    assert d == 2 and slope == pytest.approx(want, rel=1e-9) and abs(slope - 2) > 1e-3
    small = np.polyfit(np.log(eps[:2]), [2 * np.log(1e-3) + 0.1, 2 * np.log(3e-3)], 1)[0]  # P000-8: smallest 2 eps
    row = a0.p8_row(df)
    assert row.value == pytest.approx(small - 1.0, rel=1e-9), row


def _linear_unlearn() -> xr.Dataset:
    dims = ("seed", "d", "forget", "alpha")
    tau = np.array([[[0.4, 0.4], [0.1, 0.9]], [[0.4, 0.4], [0.3, 0.5]]]).reshape(2, 2, 2, 1)
    feasible = np.ones((2, 2, 2, 1), np.int8)
    feasible[0, 1, 1, 0] = 0
    ones = np.ones((2, 2, 2, 1))
    ds = xr.Dataset({"tau_svm": (dims, tau), "feasible": (dims, feasible), "done": (dims, ones.astype(bool)),
                     "eps_d": (dims, ones), "eps1": (dims, ones), "delta1": (dims, ones)},
                    coords={"seed": [0, 1], "d": [10, 20], "forget": [0, 1], "alpha": [1.0]})
    return ds


def test_p001_7_rate_by_d_averages_each_net_first():
    """1 − cos per d over the nets, each net's forgotten points averaged first: at d = 20 net 0 has one
    feasible cell (0.1), net 1 two (0.3, 0.5): (0.1 + 0.4)/2 = 0.25, where the pooled cells give 0.3."""
    row = a1.p001_7(_linear_unlearn())[0]
    assert row.measured.startswith("by d: 10: 0.4, 20: 0.25;") and row.passed, row


def test_f001_3_draws_the_same_means_with_their_t_interval(monkeypatch, tmp_path):
    from analysis import unlearn

    got = _capture(monkeypatch, unlearn, "finish")
    unlearn._rate_panel(_linear_unlearn(), tmp_path / "f.png")
    (fig, (ax, _, title), _), = got
    y, half = _bars(ax.containers[0])
    np.testing.assert_allclose(y, [0.4, 0.25], rtol=1e-12)
    np.testing.assert_allclose(half, [0.0, T975[2] * np.std([0.1, 0.4], ddof=1) / np.sqrt(2)], rtol=1e-9, atol=1e-15)
    assert "n = 2 per point), forget averaged within each net; left out: 1 not usable" in title, title
