"""Paper 003's figures draw error bars over seeds (issue 31 item 4): Figs 2/3/5/6 (single_step) and
RTA vs R (pgd) show the mean over seeds with its Student's t 95 % interval (of the per-seed values)
and say how many seeds each point averages; with one seed they draw no bar and say so. Synthetic
groups (no training), the axes inspected before they are saved."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats
import xarray as xr
from matplotlib.container import ErrorbarContainer

from analysis import lazy as figs

T975_2 = scipy.stats.t.ppf(0.975, 2)  # Student's t quantile at n = 3 (4.30; 1.96 is the normal one)
D, M, C0, R, V = [25, 49, 100], [100, 1000], [3.0, 10.0], [0.1, 0.5, 1.0], [0.1, 2.0]


def _group(dims: dict, variables: tuple[str, ...], seed: int = 0) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    shape = tuple(len(v) for v in dims.values())
    data = {v: (tuple(dims), rng.uniform(0.2, 0.8, shape)) for v in variables}
    return xr.Dataset({**data, "done": (tuple(dims), np.ones(shape, dtype=bool))}, coords=dims)


def _single_step(seeds: list[int]) -> xr.Dataset:
    return _group({"d": D, "m": M, "C0": C0, "seed": seeds}, ("med_delta_rel", "med_gnorm", "med_eta_star"))


def _pgd(seeds: list[int]) -> xr.Dataset:
    return _group({"V": V, "R": R, "seed": seeds, "restarts": [0, 1]}, ("rta",))


@pytest.fixture
def drawn(monkeypatch):
    """(axes, title) of every figure :mod:`analysis.lazy` finishes, left open for inspection."""
    got = []
    monkeypatch.setattr(figs, "finish", lambda fig, ax, path, title: got.append((ax, title)) or path)
    yield got
    figs.plt.close("all")


def _bars(ax) -> list[np.ndarray]:
    """Per error-bar container of ``ax``: the (lower, upper) ends of its bars."""
    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer) and c.lines[2]:
            out.append(np.array([[seg[0][1], seg[1][1]] for seg in c.lines[2][0].get_segments()]))
    return out


CASES = [("single_step", _single_step, figs.single_step_figures, 6), ("pgd", _pgd, figs.pgd_figures, 1)]


@pytest.mark.parametrize("kind,make,draw,n_figs", CASES, ids=[c[0] for c in CASES])
def test_three_seeds_draw_a_95_percent_interval_on_every_line(kind, make, draw, n_figs, drawn, tmp_path):
    draw(make([0, 1, 2]), tmp_path, "")
    assert len(drawn) == n_figs
    for ax, title in drawn:
        bars = _bars(ax)
        assert len(bars) == 2, title  # one line per m, C0 or V, each with its bars
        assert all(len(b) == len(R if kind == "pgd" else D) and (b[:, 1] - b[:, 0] > 0).all() for b in bars), title
        assert "Student's t 95 % interval over nets (seeds; n = 3 per point)" in title


def test_the_interval_is_student_t_over_seeds_of_the_per_net_means(drawn, tmp_path):
    ds = _pgd([0, 1, 2])
    figs.pgd_figures(ds, tmp_path, "")
    (ax, title), = drawn
    per_seed = ds.rta.sel(V=2.0, R=0.5).mean("restarts").values
    half = T975_2 * per_seed.std(ddof=1) / np.sqrt(3)
    mean = float(ds.rta.sel(V=2.0, R=0.5).mean())
    bar = _bars(ax)[1][1]  # V = 2.0, R = 0.5
    np.testing.assert_allclose(bar, [mean - half, mean + half], rtol=1e-12)
    assert "restarts averaged within each net" in title


@pytest.mark.parametrize("kind,make,draw,n_figs", CASES, ids=[c[0] for c in CASES])
def test_one_seed_draws_no_bar_and_says_so(kind, make, draw, n_figs, drawn, tmp_path):
    draw(make([0]), tmp_path, "")
    assert len(drawn) == n_figs
    for ax, title in drawn:
        assert all((b[:, 1] - b[:, 0] == 0).all() for b in _bars(ax)), title
        assert "1 net per point: no interval" in title


def test_a_seed_left_out_is_not_counted(drawn, tmp_path):
    ds = _single_step([0, 1, 2])
    ds["done"] = ds.done.where(~((ds.seed == 2) & (ds.d == 25)), False)
    figs.single_step_figures(ds, tmp_path, "")
    assert drawn and all("; n = 2/3 per point)" in title for _, title in drawn)


def test_pgd_lines_never_pool_a_chain_axis(drawn, tmp_path):
    """Issue 40: a pgd group read from an unlearn stage has unlearn_method and alpha axes: one line each,
    never their mean under a caption that says 'over seeds'."""
    ds = _group({"unlearn_method": ["identity", "ga"], "alpha": [0.5, 1.0], "R": R, "seed": [0, 1, 2]}, ("rta",))
    figs.pgd_figures(ds, tmp_path, "")
    (ax, title), = drawn
    assert len(_bars(ax)) == 4 and "n = 3 per point" in title
    bar = _bars(ax)[3][0]  # method ga, alpha 1.0, R = 0.1
    one = ds.rta.sel(unlearn_method="ga", alpha=1.0, R=0.1).values
    half = T975_2 * one.std(ddof=1) / np.sqrt(3)
    np.testing.assert_allclose(bar, [one.mean() - half, one.mean() + half], rtol=1e-12)


def test_fig4_draws_one_heatmap_per_setting_of_another_axis_and_says_what_it_averaged(drawn, tmp_path):
    """Issue 40: Fig 4 left over (d, R) of a group with a C0 axis and restarts: one heatmap per C0
    (never their mean), each cell the mean over the nets of each net's restarts, the title saying so."""
    ds = _group({"d": D, "R": R, "C0": C0, "seed": [0, 1, 2], "restarts": [0, 1]}, ("rta",))
    figs.pgd_figures(ds, tmp_path, "")
    assert len(drawn) == len(C0)
    for (ax, title), c0 in zip(drawn, C0):
        assert f"(C0 = {c0:g})" in title and "n = 3 per point" in title and "restarts averaged within each net" in title
        want = ds.rta.sel(C0=c0).mean("restarts").mean("seed").transpose("R", "d").values
        np.testing.assert_allclose(np.asarray(ax.collections[0].get_array()).reshape(want.shape), want, rtol=1e-12)


@pytest.mark.parametrize("word", ["test", "training"])
def test_pgd_and_single_step_figures_name_the_points_attacked(word, drawn, tmp_path):
    """Issue 40: a stage that attacked training points (``points: train``) is not labelled "test"."""
    ds = _group({"R": R, "seed": [0, 1, 2]}, ("rta",))
    ds["rta"].attrs["long_name"] = f"robust {word} accuracy: y f(x_adv) > 0 at the final PGD iterate"
    figs.pgd_figures(ds, tmp_path, "")
    steps = _single_step([0, 1, 2])
    steps.attrs["kktlab_identity"] = json.dumps({"params": {"points": {"test": "test", "training": "train"}[word]}})
    figs.single_step_figures(steps, tmp_path, "")
    (pgd_ax, title), step_ax = drawn[0], drawn[1][0]
    assert pgd_ax.get_ylabel() == f"robust {word} accuracy" and title.startswith(f"robust {word} accuracy vs budget")
    assert step_ax.get_ylabel().endswith(f"(median over {word} points)")
