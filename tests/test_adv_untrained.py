"""Issue 28 item 9 (spec 003 §5.2, E4 / E5): an adv_train cell whose patience-1 stop returns the
untrained init (robust train accuracy 0 at W0 and after one epoch) is marked ``train_status`` 1, and
the E4 / E5 rows and Fig 4 of a pgd stage reading such nets leave them out and count them, instead
of reading their RTA ≈ 0 as a lazy-trained net's."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from analysis import acceptance_003 as a3
from analysis import lazy as figs
from flows.experiments import adv_train as adv

# One bundle (cells differ in V, R only): R = 50 on unit-norm rows flips every point of W0 and of
# the net after one epoch (RTA 0, 0: patience 1 stops, the best round is W0); R = 0, V = 10 is plain
# projected SGD, whose first epoch lifts the train accuracy from 0.55 (W0) to 0.92 (measured).
TINY = dict(data="digits", d=16, m=32, n_train=64, n_test=32, T1_max=3, T2=5, beta=0.5, batch_size=16, patience=1)
UNTRAINABLE, TRAINABLE = dict(V=1.0, R=50.0, seed=0), dict(V=10.0, R=0.0, seed=0)


def _cells() -> list[dict]:
    base = {k: p.default for k, p in adv.P.items()}
    return [dict(base, **TINY, **UNTRAINABLE), dict(base, **TINY, **TRAINABLE)]


@pytest.fixture(scope="module")
def bundle():
    return adv.EXPERIMENT.run_bundle(_cells(), "cpu")


def test_E4_untrainable_cell_is_marked_returned_init(bundle):
    stuck = bundle[0]
    assert stuck["rta_train_hist"][0] == 0.0 and stuck["rta_train_hist"][1] == 0.0  # the set-up holds
    assert stuck["best_epoch"] == 0 and stuck["C0_reached"] == 0.0  # the returned net is W0 ...
    assert stuck["train_status"] == 1  # ... and says so


def test_E4_trained_cell_is_marked_trained(bundle):
    ok = bundle[1]
    assert ok["best_epoch"] >= 1 and ok["C0_reached"] > 0.0 and ok["rta_train"] > ok["rta_train_hist"][0]
    assert ok["train_status"] == 0


def test_train_status_is_declared_and_stored_as_int(bundle):
    var = adv.V["train_status"]
    assert var.dtype == "int8" and var.ok == (0,) and var.finite
    assert "0 trained" in var.description and "1 returned the init" in var.description
    assert all(set(res) <= set(adv.V) | {"wall_s"} for res in bundle)  # every result is a declared variable


def test_a_group_made_before_train_status_still_opens_and_reads_best_epoch(tmp_path, bundle):
    """The rule for a new variable: an old group reopens, a rerun re-creates the array from the
    template (old done cells hold the fill -1 and are not damaged), and readers fall back on best_epoch."""
    import dataclasses

    from storage.query import open_results
    from storage.store import Store

    exp, grid, extra = adv.EXPERIMENT, {"R": [50.0, 0.0]}, adv.extra_dims(_cells())
    before = dataclasses.replace(exp, variables={k: v for k, v in exp.variables.items() if k != "train_status"})
    make = dict(config_text="{}", extra_sizes=extra, device="cpu")
    old = Store(tmp_path / "s.zarr", "adv").open_or_create(before, grid, {}, **make)
    for i, res in enumerate(bundle):
        assert old.write_cell((i,), {k: v for k, v in res.items() if k != "train_status"})
    now = Store(tmp_path / "s.zarr", "adv").open_or_create(exp, grid, {}, **make)
    assert now.restore_arrays(exp, grid, extra) == ["train_status"]  # what `kktlab run`'s plan does
    assert now.verify(exp).ok and int(now.done_mask().sum()) == 2
    ds = open_results(tmp_path / "s.zarr", "adv").load()
    assert ds["train_status"].values.tolist() == [-1, -1]
    assert figs.untrained(ds).values.tolist() == [True, False]
    assert figs.left_out(ds) == "1 of 2 nets left out: adversarial training returned the init"


def test_a_reading_stage_sees_the_status_of_the_net_it_read(tmp_path, bundle):
    """What the report hands E4 / E5: a pgd group's scalars with its adv_train stage's train_status."""
    from flows.experiments import pgd
    from storage.query import stage_scalars
    from storage.store import Store

    grid, make = {"R": [50.0, 0.0]}, dict(config_text="{}", device="cpu")
    up = Store(tmp_path / "s.zarr", "adv").open_or_create(adv.EXPERIMENT, grid, {}, extra_sizes=adv.extra_dims(_cells()),
                                                          **make)
    down = Store(tmp_path / "s.zarr", "robust").open_or_create(pgd.EXPERIMENT, dict(grid, restarts=[1, 2]), {},
                                                               extra_sizes={"point": 1}, source="adv", **make)
    for i, res in enumerate(bundle):
        assert up.write_cell((i,), res)
        for j in range(2):  # every declared variable: a done cell missing one is damaged (storage.query.damaged)
            full = {n: np.zeros((1,) * len(v.dims), v.dtype) if v.dims else np.asarray(0, v.dtype)
                    for n, v in pgd.EXPERIMENT.variables.items()}
            assert down.write_cell((i, j), {**full, "rta": 0.0, "upstream_hash": 100 + i})
    ds = stage_scalars(tmp_path / "s.zarr", "robust")
    assert "train_status" in ds.attrs["kktlab_upstream_variables"]
    assert ds["train_status"].values.tolist() == [[1, 1], [0, 0]]
    assert figs.left_out(ds) == "1 of 2 nets left out: adversarial training returned the init"


# --- the rows: a pgd stage's scalars with its upstream adv_train variables merged in ------------------
D, R, SEEDS, RESTARTS = np.array([64.0, 256.0, 784.0]), np.linspace(0.01, 2.0, 50), [0, 1, 2], [1, 2]
STUCK = [dict(d=64.0, R=R[0], seed=0), dict(d=256.0, R=R[0], seed=1)]  # two nets that never trained
NETS = len(D) * len(R) * len(SEEDS)


def _robust_group(hashes: bool = True, stuck=STUCK) -> xr.Dataset:
    """E4's (d, R, seed) nets, each attacked with two ``restarts`` (a pgd axis: one net, two cells).
    Trained nets follow R50 = 5/√d (E4 passes); the stuck ones have RTA 0 at the smallest R, which
    breaks the plateau "≈ 1 at the smallest R" where they are counted."""
    dims = ("d", "R", "seed", "restarts")
    shape = (len(D), len(R), len(SEEDS), len(RESTARTS))
    coords = {"d": D, "R": R, "seed": SEEDS, "restarts": RESTARTS}
    rta = np.clip(0.5 + (5 / np.sqrt(D)[:, None] - R[None]) * 20, 0, 1)[:, :, None, None] * np.ones(shape)
    status = xr.DataArray(np.zeros(shape, np.int8), dims=dims, coords=coords)
    for s in stuck:
        status.loc[s] = 1
    ds = xr.Dataset({"rta": (dims, rta), "done": (dims, np.ones(shape, bool)), "failed": (dims, np.zeros(shape, bool)),
                     "train_status": status, "best_epoch": xr.where(status == 1, 0, 2).astype(np.int64)},
                    coords=coords)
    ds["rta"] = ds["rta"].where(status == 0, 0.0)
    if hashes:  # a reading stage's cell_hash of the upstream net it read: one per (d, R, seed)
        net = np.arange(NETS).reshape(shape[:3])[..., None] * np.ones(shape, np.int64)
        ds["upstream_hash"] = (dims, net.astype(np.int64))
    ds.attrs["kktlab_upstream_variables"] = ["best_epoch", "train_status"]
    return ds


def _e4(ds: xr.Dataset) -> dict:
    return {r.criterion: r for r in a3.acceptance(ds) if r.spec_id == "E4"}


PLATEAU = "RTA plateaus: ≈ 1 at the smallest R, ≈ 0 at the largest, every d"


def test_E4_rows_leave_untrained_nets_out_and_count_them():
    rows = _e4(_robust_group())
    assert rows[PLATEAU].passed is True, rows[PLATEAU]  # counted, the 2 stuck nets would make it FAIL
    assert rows[PLATEAU].measured.startswith("min RTA 1.000"), rows[PLATEAU].measured
    want = f"2 of {NETS} nets left out: adversarial training returned the init"
    assert all(want in r.note for r in rows.values()), [r.note for r in rows.values()]
    assert all(f"judged: {2 * (NETS - 2)} cells" in r.note and "per (d, R)" in r.note for r in rows.values())


def test_E4_counted_in_cells_without_upstream_hashes():
    rows = _e4(_robust_group(hashes=False))
    assert rows[PLATEAU].passed is True
    assert f"4 of {2 * NETS} nets left out" in rows[PLATEAU].note  # no hash: each cell is its own net


def test_E4_stores_before_train_status_fall_back_on_best_epoch():
    old = _robust_group().drop_vars("train_status")
    assert _e4(old)[PLATEAU].passed is True and "2 of" in _e4(old)[PLATEAU].note
    resumed = _robust_group()
    resumed["train_status"] = xr.full_like(resumed["train_status"], -1)  # the fill of cells written before it
    assert _e4(resumed)[PLATEAU].passed is True and "2 of" in _e4(resumed)[PLATEAU].note


def test_E4_counting_untrained_nets_would_fail_the_plateau():
    """The reference side: the same group with the stuck nets marked trained (status never set)."""
    unmarked = _robust_group()
    unmarked["train_status"] = xr.zeros_like(unmarked["train_status"])
    unmarked["best_epoch"] = xr.full_like(unmarked["best_epoch"], 2)
    row = _e4(unmarked)[PLATEAU]
    assert row.passed is False and "0 of" in row.note


def test_E4_only_untrained_nets_is_not_judged():
    every = [dict(d=d, R=r, seed=s) for d in D for r in R for s in SEEDS]
    rows = a3.acceptance(_robust_group(stuck=every))
    assert [r.spec_id for r in rows] == ["E4", "E5"] and all(r.passed is None for r in rows)
    assert all(r.note.startswith("not judged: needs trained nets") and f"{NETS} of {NETS} nets left out" in r.note
               for r in rows)


def test_fig4_titles_count_the_nets_left_out(tmp_path, monkeypatch):
    titles = []
    monkeypatch.setattr(figs, "finish", lambda fig, ax, path, title: titles.append(title) or path)
    ds = _robust_group()
    figs.pgd_figures(ds, tmp_path, "")
    assert titles and all(f"2 of {NETS} nets left out: adversarial training returned the init" in t for t in titles)
    assert f"{2 * (NETS - 2)} usable cells" in figs.notes(ds)[0]
