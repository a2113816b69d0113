"""Stale detection (issue 13 item 6): a reading stage's cell records the content hash of the
upstream cell it read; changed upstream values make exactly its readers stale, `kktlab status`
names them and a rerun recomputes exactly them; a deterministic recomputation of the upstream
(`--force`) leaves them fresh; stores made before hashes still open and are not judged.

The chain runs through the real sweep flow (a real Prefect server) on the inline runner (threads
of the flow process: these tests are about the store, not Dask)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

from flows import config
from flows.sweep import run as run_sweep
from kktlab.cli import main as kktlab_main
from storage import schema
from storage.query import open_results
from storage.stale import stale_cells
from storage.store import Store

TRAIN = {"width": 8, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-8, "max_iters": 400}
GRID = {"d": [12, 24], "seed": [0, 1]}
ATTACKS = ["margin_direction", "random_direction"]
RUNNER = {"cluster": "inline", "workers": 1, "bundle_size": 2}
CHANGED = (1, 0)  # the upstream cell (d=24, seed=0) whose values a test changes
pytestmark = [pytest.mark.requires_services, pytest.mark.slow]  # every test reads the chain run on a real Prefect server


def chain(stages: int = 2, reader: str = "robustness", attacks: list = ATTACKS) -> config.Chain:
    raw = {"name": "tiny", "runner": dict(RUNNER), "stages": [
        {"name": "nets", "experiment": "train", "grid": dict(GRID), "params": dict(TRAIN)},
        {"name": reader, "experiment": "universal_attack", "from": "nets", "grid": {"attack": list(attacks)}},
    ][:stages]}
    return config.parse(raw)


def hashes(path, group: str, name: str) -> np.ndarray:
    return np.asarray(zarr.open_group(str(path / group), mode="r", zarr_format=3)[name][...])


@pytest.fixture(scope="module")
def ran(prefect_server, tmp_path_factory):
    """The tiny chain, run once into a store; tests work on copies of it."""
    path = tmp_path_factory.mktemp("stale") / "chain.zarr"
    stats = run_sweep(chain(), str(path))
    assert [s["written"] for s in stats] == [4, 8] and [s["stale_recomputed"] for s in stats] == [0, 0]
    return path


@pytest.fixture
def store(ran, tmp_path):
    shutil.copytree(ran, tmp_path / "chain.zarr")
    return tmp_path / "chain.zarr"


def test_every_cell_records_the_hash_of_what_it_read(ran):
    up, read = hashes(ran, "nets", schema.CELL_HASH), hashes(ran, "robustness", schema.UPSTREAM_HASH)
    assert (up >= 0).all() and len(set(up.ravel().tolist())) == 4  # one hash per distinct net
    np.testing.assert_array_equal(read, np.repeat(up[:, :, None], len(ATTACKS), axis=2))
    assert stale_cells(ran, "robustness").cells == [] and stale_cells(ran, "robustness").notes == []
    assert open_results(ran, "nets").cell_hash.attrs["units"] == "1"


def test_deterministic_force_recompute_is_not_stale(store):
    """--force on the upstream alone (a config of its stage) stores the same values, so the same
    hashes: nothing downstream is stale and a rerun of the chain computes nothing."""
    before = hashes(store, "nets", schema.CELL_HASH)
    [stats] = run_sweep(chain(stages=1), str(store), force=True)
    assert stats["written"] == 4
    np.testing.assert_array_equal(hashes(store, "nets", schema.CELL_HASH), before)
    assert stale_cells(store, "robustness").cells == []
    again = run_sweep(chain(), str(store))
    assert [(s["written"], s["stale_recomputed"]) for s in again] == [(0, 0), (0, 0)]


def changed_upstream(store) -> dict:
    """Rewrite upstream cell CHANGED with other nets (its W scaled by 1.5), as a --force run whose
    numbers changed would; returns the new values."""
    nets = open_results(store, "nets").isel(d=CHANGED[0], seed=CHANGED[1]).load()
    values = {name: nets[name].values for name in nets.data_vars
              if name not in (schema.DONE, schema.FAILED, schema.CELL_HASH)}
    values["W"] = values["W"] * 1.5
    Store(store, "nets").write_cell(CHANGED, values, force=True)
    return values


def test_changed_upstream_makes_exactly_its_readers_stale(store, capsys):
    changed_upstream(store)
    found = stale_cells(store, "robustness")
    assert found.cells == [(*CHANGED, 0), (*CHANGED, 1)]
    assert found.names == [f"d=24, seed=0, attack={a}" for a in ATTACKS]
    assert kktlab_main(["status", str(store)]) == 0
    out = capsys.readouterr().out
    assert "stale: 2 done cells read an upstream 'nets' cell that has changed since" in out
    assert "stale: d=24, seed=0, attack=margin_direction" in out and "stale: d=24, seed=0, attack=random" in out


def test_rerun_recomputes_exactly_the_stale_cells_from_the_new_upstream(store, tmp_path):
    from flows import experiments
    from flows.sweep import compute_reading

    old = open_results(store, "robustness").load()
    changed_upstream(store)
    stats = run_sweep(chain(), str(store))
    assert [(s["group"], s["written"], s["stale_recomputed"]) for s in stats] == [("nets", 0, 0),
                                                                                  ("robustness", 2, 2)]
    assert stale_cells(store, "robustness").cells == []
    new = open_results(store, "robustness").load()
    read = hashes(store, "robustness", schema.UPSTREAM_HASH)
    assert (read[CHANGED] == hashes(store, "nets", schema.CELL_HASH)[CHANGED]).all()
    # a clean computation from the new upstream (one cell per bundle: one attack each) equals what was stored
    cfg = chain().stages[1]
    cells = [cell for idx, cell in zip(Store(store, "robustness").cell_indices(), cfg.store_cells())
             if idx[:2] == CHANGED]
    inputs = {"store": str(store), "group": "nets", "indices": [list(CHANGED)]}
    clean = [compute_reading(experiments.get("universal_attack"), [cell], "cpu", inputs)[0] for cell in cells]
    for a, res in enumerate(clean):
        for name in ("c_star", "gamma", "q_sample", "kkt_eps", schema.UPSTREAM_HASH):
            stored = new[name].isel(d=CHANGED[0], seed=CHANGED[1], attack=a).values
            np.testing.assert_allclose(np.ravel(stored)[:np.size(res[name])], np.ravel(res[name]),
                                       rtol=0, atol=0, equal_nan=True, err_msg=name)
    assert not np.allclose(new.c_star.values[CHANGED], old.c_star.values[CHANGED])  # the new nets' numbers
    other = np.ones(new.c_star.shape, dtype=bool)
    other[CHANGED] = False
    for name in ("c_star", "q_sample", schema.UPSTREAM_HASH):  # the other cells were not touched
        np.testing.assert_array_equal(new[name].values[other], old[name].values[other], err_msg=name)


def test_store_without_hashes_opens_and_is_not_judged(store, capsys):
    """A store made before hashes: no cell_hash / upstream_hash arrays. Status notes it, nothing is
    stale, the data opens, and a rerun re-creates the arrays and judges nothing it cannot."""
    for group, name in (("nets", schema.CELL_HASH), ("robustness", schema.UPSTREAM_HASH)):
        shutil.rmtree(store / group / name)
        meta = json.loads((store / group / "zarr.json").read_text())
        meta["attributes"][schema.VARIABLES].remove(name)
        (store / group / "zarr.json").write_text(json.dumps(meta))
    changed_upstream(store)  # changed, but nothing records what was read
    found = stale_cells(store, "robustness")
    assert found.cells == [] and "made before cell hashes" in found.notes[0]
    assert kktlab_main(["status", str(store)]) == 0
    assert "note: group 'robustness' or its upstream 'nets' was made before cell hashes" in capsys.readouterr().out
    assert schema.CELL_HASH not in open_results(store, "nets")
    stats = run_sweep(chain(), str(store))
    assert [(s["written"], s["stale_recomputed"]) for s in stats] == [(0, 0), (0, 0)]
    assert (hashes(store, "robustness", schema.UPSTREAM_HASH) == schema.NO_HASH).all()
    assert "recorded no upstream hash" in stale_cells(store, "robustness").notes[0]


def test_another_downstream_grid_never_recomputes_the_upstream(store):
    """A reading stage with another grid (a new group) reads the stored nets; the upstream's cells
    and hashes stay as they were."""
    before = hashes(store, "nets", schema.CELL_HASH)
    stats = run_sweep(chain(reader="one_attack", attacks=ATTACKS[:1]), str(store))
    assert [(s["group"], s["done_before"], s["written"]) for s in stats] == [("nets", 4, 0), ("one_attack", 0, 4)]
    np.testing.assert_array_equal(hashes(store, "nets", schema.CELL_HASH), before)
    np.testing.assert_array_equal(hashes(store, "one_attack", schema.UPSTREAM_HASH)[..., 0], before)
    assert stale_cells(store, "one_attack").cells == []


def test_an_upstream_cell_recomputed_in_the_same_run_is_read_after_it(store):
    """A damaged upstream cell is marked not done when its stage is planned, so its done readers
    are stale at once: they wait for the recomputed cell and read it (same values: same hash). The
    chunk holds a block of two nets (the seeds of one d, storage/blocks.py): both are recomputed, and
    the 2 x 2 reading cells of the two are stale."""
    before = open_results(store, "robustness").load()
    chunk = next((store / "nets" / "W" / "c" / str(CHANGED[0]) / str(CHANGED[1])).rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    chunk.unlink()
    stats = run_sweep(chain(), str(store))
    assert [(s["written"], s["stale_recomputed"]) for s in stats] == [(2, 0), (4, 4)]
    after = open_results(store, "robustness").load()
    np.testing.assert_array_equal(after.upstream_hash.values, before.upstream_hash.values)
    np.testing.assert_allclose(after.c_star.values, before.c_star.values, rtol=0, atol=0)
    assert stale_cells(store, "robustness").cells == []


def test_a_cached_bundle_that_read_an_older_upstream_is_not_used(store, monkeypatch):
    """A run killed after the reading bundle was computed (its results in the result cache) but
    before they were stored; the upstream cell then changed again: the rerun computes the bundle
    anew from the current upstream instead of storing what read the older one."""
    from flows import chain as chain_mod

    class Killed(Exception):
        pass

    changed_upstream(store)
    keep = chain_mod.Scheduler._store

    def killed_before_storing(self, st, *args):
        if st.cfg.name == "robustness":
            raise Killed
        return keep(self, st, *args)

    monkeypatch.setattr(chain_mod.Scheduler, "_store", killed_before_storing)
    with pytest.raises(Killed):
        run_sweep(chain(), str(store))
    monkeypatch.setattr(chain_mod.Scheduler, "_store", keep)
    assert list((store.parent / "chain.zarr.cache" / "robustness").glob("*.npz"))
    changed_upstream(store)  # changed again: the cached results read the version before
    stats = run_sweep(chain(), str(store))
    # the killed run had marked the stale cells not done (so 0 stale now); none came from the cache
    assert [(s["written"], s["from_cache"], s["stale_recomputed"]) for s in stats] == [(0, 0, 0), (2, 0, 0)]
    assert list((store.parent / "chain.zarr.cache" / "robustness").glob("*.bad-*"))
    assert stale_cells(store, "robustness").cells == []


def test_readers_failed_by_an_unusable_upstream_are_read_again_once_it_is_repaired(store):
    """Issue 40: a reading cell that failed because its upstream cell was failed stays failed while
    that cell is; once the upstream cell is to be computed again (a damaged chunk marks it not done;
    here by hand), a plain rerun (no --retry-failed) computes it and then its readers, which equal
    the clean run's. The reader's own failures stay for --retry-failed."""
    clean = open_results(store, "robustness").load()
    Store(store, "nets").write_failed(CHANGED, "LinAlgError: boom", force=True)
    Store(store, "robustness").mark_not_done([(*CHANGED, a) for a in range(len(ATTACKS))])
    stats = run_sweep(chain(), str(store))
    assert [(s["group"], s["written"], s["failed"]) for s in stats] == [("nets", 0, 0), ("robustness", 0, 2)]
    texts = schema.failures(zarr.open_group(str(store / "robustness"), mode="r", zarr_format=3).attrs)
    assert texts["d=24, seed=0, attack=margin_direction"].startswith("upstream cell (d=24, seed=0) failed: LinAlgError")
    assert stale_cells(store, "robustness").cells == []  # its upstream is still failed: nothing to read again
    Store(store, "nets").mark_not_done([CHANGED])
    assert stale_cells(store, "robustness").cells == [(*CHANGED, a) for a in range(len(ATTACKS))]
    stats = run_sweep(chain(), str(store))
    assert [(s["group"], s["written"], s["failed"], s["stale_recomputed"]) for s in stats] == [
        ("nets", 1, 0, 0), ("robustness", 2, 0, 2)]
    again = open_results(store, "robustness").load()
    assert not again.failed.values.any() and again.done.values.all()
    for name in ("c_star", "gamma", schema.UPSTREAM_HASH):
        np.testing.assert_array_equal(again[name].values, clean[name].values, err_msg=name)
