"""Damaged stores (issue 12 item 2): chunk checksums, `kktlab verify` / `status` naming damaged
cells, one clear line for damaged metadata, and a rerun that recomputes damaged cells.

The unit tests corrupt a store filled with made-up values; the end-to-end test corrupts a store
that a real `kktlab run` wrote and reruns it."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

from conftest import mismatches, store_values
from flows import config
from flows.sweep import open_store, plan
from kktlab.cli import main as kktlab_main
from storage import schema
from storage.query import open_results
from storage.store import Store

GRID = {"d": [10, 20], "alpha": [0.5, 1.0], "seed": [0, 1]}


def make_store(path: pathlib.Path, chunk_cells: int = 1):
    """A nonrobust store with every cell done (made-up values; kkt_eps NaN, as when not fitted); a
    chunk per cell (``chunk_cells`` 1, the layout of stores made before blocks: damage names one
    cell) unless asked otherwise."""
    cfg = config.parse({"experiment": "nonrobust", "grid": GRID, "params": {"width": 8},
                        "runner": {"chunk_cells": chunk_cells}})
    store = open_store(cfg, path, "cpu")
    for idx in store.cell_indices():
        vals = {name: (np.arange(5, dtype=var.dtype) if var.dims else np.asarray(7, dtype=var.dtype))
                for name, var in cfg.exp.variables.items()}
        vals["kkt_eps"] = np.nan  # an all-NaN chunk: still written, so its deletion is seen
        store.write_cell(idx, vals)
    return cfg, store


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("pristine") / "s.zarr")


@pytest.fixture
def filled(pristine, tmp_path):
    """(config, Store) of a fresh copy of the module's filled store, at tmp_path / "s.zarr"."""
    cfg, store = pristine
    shutil.copytree(store.path, tmp_path / "s.zarr")
    return cfg, Store(tmp_path / "s.zarr", cfg.name)


def flip_byte(f: pathlib.Path) -> None:
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x10
    f.write_bytes(b)


# damage -> (what to do to group dir g, the cell named, the problem named)
CELL_DAMAGE = {
    "chunk_deleted": (lambda g: (g / "c_star/c/0/1/0").unlink(), "d=10, alpha=1.0, seed=0",
                      "variable c_star chunk missing"),
    "all_nan_chunk_deleted": (lambda g: (g / "kkt_eps/c/1/0/1").unlink(), "d=20, alpha=0.5, seed=1",
                              "variable kkt_eps chunk missing"),
    "byte_flipped": (lambda g: flip_byte(g / "q_sample/c/1/1/0/0"), "d=20, alpha=1.0, seed=0",
                     "variable q_sample checksum mismatch"),
    "garbage_chunk": (lambda g: (g / "iters/c/0/0/1").write_bytes(b"garbage garbage"), "d=10, alpha=0.5, seed=1",
                      "variable iters checksum mismatch"),
    "done_flag_garbage": (lambda g: (g / "done/c/1/1/1").write_bytes(b"xx"), "d=20, alpha=1.0, seed=1",
                          "done flag checksum mismatch"),
    "variable_deleted": (lambda g: shutil.rmtree(g / "gamma"), "d=20, alpha=1.0, seed=1", "variable gamma lost"),
    "variable_metadata_deleted": (lambda g: (g / "gamma/zarr.json").unlink(), "d=10, alpha=0.5, seed=0",
                                  "variable gamma lost"),
}


@pytest.mark.parametrize("damage", list(CELL_DAMAGE))
def test_verify_names_the_damaged_cell_and_plan_recomputes_it(damage, filled, tmp_path):
    cfg, store = filled
    assert store.verify().ok
    corrupt, cell, problem = CELL_DAMAGE[damage]
    corrupt(tmp_path / "s.zarr" / cfg.name)
    report = store.verify(cfg.exp)
    assert f"{cell}: {problem}" in report.lines(), report.lines()
    assert report.sound == 8 - report.damaged
    todo, done_before = plan(cfg, store, force=False)
    assert done_before == 8 - report.damaged and len(todo) == report.damaged
    named = {report.names[idx] for idx in report.cells}
    assert {report.names[idx] for idx, _ in todo} == named and cell in named
    after = store.verify(cfg.exp)  # marked not done, arrays re-created: nothing damaged left
    assert after.ok and after.sound == done_before


# damage of a store chunked by blocks (storage/blocks.py; here the two seeds of one (d, alpha)) ->
# (what to do to group dir g, the cells named, the problem named)
BLOCK_DAMAGE = {
    "chunk_deleted": (lambda g: (g / "c_star/c/1/0/0").unlink(), ("d=20, alpha=0.5, seed=0", "d=20, alpha=0.5, seed=1"),
                      "variable c_star chunk missing"),
    "byte_flipped": (lambda g: flip_byte(g / "q_sample/c/0/1/0/0"), ("d=10, alpha=1.0, seed=0", "d=10, alpha=1.0, seed=1"),
                     "variable q_sample checksum mismatch"),
    "done_flag_garbage": (lambda g: (g / "done/c/1/1/0").write_bytes(b"xx"), ("d=20, alpha=1.0, seed=0",
                                                                              "d=20, alpha=1.0, seed=1"),
                          "done flag checksum mismatch"),
}


@pytest.fixture(scope="module")
def pristine_blocks(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("pristine_blocks") / "s.zarr", chunk_cells=2)


@pytest.fixture
def blocks(pristine_blocks, tmp_path):
    """(config, Store) of a fresh copy of the module's filled store chunked by blocks of two cells."""
    cfg, store = pristine_blocks
    shutil.copytree(store.path, tmp_path / "s.zarr")
    return cfg, Store(tmp_path / "s.zarr", cfg.name)


@pytest.mark.parametrize("damage", list(BLOCK_DAMAGE))
def test_a_damaged_block_chunk_names_each_of_its_cells_and_only_those_are_recomputed(damage, blocks, tmp_path):
    cfg, store = blocks
    assert store.block() == (1, 1, 2) and store.verify().ok
    corrupt, cells, problem = BLOCK_DAMAGE[damage]
    corrupt(tmp_path / "s.zarr" / cfg.name)
    report = store.verify(cfg.exp)
    assert report.lines() == [f"{cell}: {problem}" for cell in cells]
    todo, done_before = plan(cfg, store, force=False)
    assert done_before == 6 and sorted(report.names[idx] for idx, _ in todo) == list(cells)
    assert store.verify(cfg.exp).ok


def test_a_bundle_writes_each_chunk_of_its_block_once_and_keeps_the_other_cells(blocks, tmp_path):
    """storage/blocks.py: a block chunk a bundle covers whole is written without reading; one that
    holds cells of another run (a resumed block) is read, updated and written back."""
    cfg, store = blocks
    c_star = np.asarray(open_results(tmp_path / "s.zarr").c_star)
    store.mark_not_done([(0, 0, 1)])
    vals = {name: (np.arange(5, dtype=var.dtype) if var.dims else np.asarray(9, dtype=var.dtype))
            for name, var in cfg.exp.variables.items()}
    hashes = store.write_many([(0, 0, 0), (0, 0, 1)], [vals, vals])
    assert hashes[0] is None and hashes[1] is not None  # (0, 0, 0) is done: refused, never overwritten
    assert store.mark_many([(0, 0, 1)], [hashes[1]]) == [True]
    got = np.asarray(open_results(tmp_path / "s.zarr").c_star)
    assert got[0, 0, 0] == c_star[0, 0, 0] == 7 and got[0, 0, 1] == 9
    assert (got[1:] == c_star[1:]).all() and store.verify(cfg.exp).ok
    files = sorted(p.name for p in (tmp_path / "s.zarr" / cfg.name / "c_star" / "c").rglob("*") if p.is_file())
    assert len(files) == 4  # a file per block of 2 cells, not per cell


@pytest.mark.parametrize("damage,todo", [("done_metadata_deleted", 8), ("coordinate_garbage", 0)])
def test_plan_recreates_a_lost_done_array_or_coordinate(damage, todo, filled, tmp_path):
    cfg, store = filled
    METADATA_DAMAGE[damage][0](tmp_path / "s.zarr" / cfg.name)
    assert len(plan(cfg, store, force=False)[0]) == todo  # a lost done array: every cell is pending
    assert store.verify(cfg.exp).ok
    assert list(open_results(tmp_path / "s.zarr").alpha.values) == [0.5, 1.0]


def test_non_finite_value_where_declared_finite_is_damage(filled):
    cfg, store = filled
    assert cfg.exp.variables["wall_s"].finite and not cfg.exp.variables["kkt_eps"].finite
    vals = {name: np.asarray(7, dtype=var.dtype) for name, var in cfg.exp.variables.items() if not var.dims}
    store.write_cell((0, 0, 0), dict(vals, wall_s=np.nan), force=True)
    store.write_cell((0, 0, 1), dict(vals, status=-1), force=True)
    assert store.verify().lines() == ["d=10, alpha=0.5, seed=0: variable wall_s not finite (nan)",
                                      "d=10, alpha=0.5, seed=1: variable status missing (reads the fill value)"]


@pytest.mark.parametrize("name, edit", [("c_star", lambda a: a + 1e-9), ("iters", lambda a: a - 1),
                                        ("q_sample", lambda a: a[::-1].copy())], ids=["scalar", "int", "vector"])
def test_a_hand_edited_value_is_named_by_its_cell_hash(filled, name, edit):
    """Kills i040-verify-ignores-edited-cells, i040-content-hashes-scalar-shape: a value rewritten through
    zarr (its chunk's checksum valid) no longer hashes to the cell_hash stored with it: verify names that
    cell and only it (every other cell's hash, computed in one batch, still matches); plan recomputes it."""
    import zarr

    cfg, store = filled
    assert store.verify().ok
    arr = zarr.open_array(str(store.path / cfg.name / name), mode="r+", zarr_format=3)
    arr[1, 0, 1] = edit(np.asarray(arr[1, 0, 1]))
    report = store.verify()
    assert report.lines() == ["d=20, alpha=0.5, seed=1: values differ from the cell_hash stored with them "
                              "(edited since)"], report.lines()
    assert [idx for idx, _ in plan(cfg, store, force=False)[0]] == [(1, 0, 1)]


def test_every_chunk_is_checksummed(filled, tmp_path):
    cfg, _ = filled
    for meta in (tmp_path / "s.zarr" / cfg.name).glob("*/zarr.json"):
        codecs = [c["name"] for c in json.loads(meta.read_text())["codecs"]]
        assert codecs[-1] == "crc32c", (meta.parent.name, codecs)


def test_store_without_checksums_still_opens(tmp_path, monkeypatch):
    """A store made before checksums: verify says so, still catches a lost value of a variable
    declared finite, and a rerun's re-created array gets checksums."""
    def old_encoding(ds):
        return {name: {"chunks": var.encoding["chunks"],
                       **({"fill_value": schema.fill_value(var.dtype)} if var.dtype.kind in "fiu" else {})}
                for name, var in ds.data_vars.items()}

    monkeypatch.setattr(schema, "encoding", old_encoding)
    cfg, store = make_store(tmp_path / "s.zarr")
    monkeypatch.undo()
    report = store.verify(cfg.exp)
    assert report.ok and any("no checksums" in n for n in report.notes), report.notes
    (tmp_path / "s.zarr" / cfg.name / "wall_s/c/0/0/0").unlink()
    assert store.verify(cfg.exp).lines() == ["d=10, alpha=0.5, seed=0: variable wall_s not finite (nan)"]
    assert float(open_results(tmp_path / "s.zarr").c_star[0, 0, 0]) == 7


def run_cli(capsys, *argv) -> tuple[int, str]:
    rc = kktlab_main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


METADATA_DAMAGE = {
    "group_metadata_deleted": (lambda g: (g / "zarr.json").unlink(), "group 'nonrobust' has arrays but no zarr.json"),
    "group_metadata_garbage": (lambda g: (g / "zarr.json").write_text("{nope"), "zarr.json is unreadable"),
    "variable_metadata_deleted": (lambda g: (g / "c_star/zarr.json").unlink(),
                                  "variable c_star metadata missing (no zarr.json)"),
    "garbage_chunk": (lambda g: (g / "c_star/c/0/0/0").write_bytes(b"garbage garbage"),
                      "d=10, alpha=0.5, seed=0: variable c_star checksum mismatch"),
    "done_metadata_deleted": (lambda g: (g / "done/zarr.json").unlink(), "array 'done' metadata missing"),
    "coordinate_garbage": (lambda g: (g / "alpha/c/0").write_bytes(b"garbage garbage"),
                           "coordinate 'alpha': checksum mismatch"),
    "root_metadata_deleted": (lambda g: (g.parent / "zarr.json").unlink(), "is not a kktlab store"),
}


@pytest.mark.parametrize("command", ["status", "verify", "show"])
@pytest.mark.parametrize("damage", list(METADATA_DAMAGE))
def test_damaged_metadata_is_one_clear_line_and_nonzero_exit(damage, command, filled, tmp_path, capsys):
    cfg, _ = filled
    corrupt, message = METADATA_DAMAGE[damage]
    corrupt(tmp_path / "s.zarr" / cfg.name)
    rc, out = run_cli(capsys, command, tmp_path / "s.zarr")
    assert rc != 0 and message in out, out
    assert "Traceback" not in out


# --- end to end: a real `kktlab run`, corrupted, verified, rerun --------------------------------

TINY = {
    "experiment": "nonrobust",
    "name": "tiny",
    "grid": {"d": [12], "alpha": [0.5, 1.0], "seed": [0, 1]},
    "params": {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-6},
    "runner": {"cluster": "inline", "workers": 1, "bundle_size": 2},
}


@pytest.mark.requires_services
def test_corrupted_run_is_named_then_repaired_by_a_rerun(cli, prefect_server, write_config, tmp_path):
    path, store, g = write_config(TINY), tmp_path / "s.zarr", tmp_path / "s.zarr" / "tiny"

    def run(n):
        res = cli.run("run", path, "--store", store, "--json", tmp_path / f"stats{n}.json")
        assert res.returncode == 0, res.stderr[-3000:]
        return res, json.loads((tmp_path / f"stats{n}.json").read_text())

    run(0)
    clean = store_values(store)
    assert json.loads((g / "zarr.json").read_text())["attributes"]["kktlab_block"] == [1, 1, 2]  # bundle_size 2
    flip_byte(g / "q_sample/c/0/1/0/0")  # the block of d=12, alpha=1.0: seeds 0 and 1
    verify = cli.run("verify", store)
    assert verify.returncode == 1
    assert verify.stdout.splitlines()[1:] == [
        "  damaged: d=12, alpha=1.0, seed=0: variable q_sample checksum mismatch",
        "  damaged: d=12, alpha=1.0, seed=1: variable q_sample checksum mismatch"], verify.stdout
    status = cli.run("status", store)
    assert status.returncode == 1 and "2/4" in status.stdout and "2 cells damaged" in status.stdout, status.stdout
    assert "d=12, alpha=1.0, seed=1: variable q_sample checksum mismatch" in status.stdout
    show = cli.run("show", store)
    assert show.returncode != 0 and "damaged" in show.stderr and "Traceback" not in show.stderr

    res, stats = run(1)  # recomputes exactly the two damaged cells
    assert (stats["damaged_recomputed"], stats["done_before"], stats["written"]) == (2, 2, 2)
    assert "2 damaged cells recomputed" in res.stdout

    shutil.rmtree(g / "gamma")  # a whole variable: every done cell lost it
    verify = cli.run("verify", store)
    assert verify.returncode == 1 and verify.stdout.count("variable gamma lost") == 4, verify.stdout
    res, stats = run(2)
    assert (stats["damaged_recomputed"], stats["done_before"], stats["written"]) == (4, 0, 4)
    assert "re-created damaged arrays from the template: gamma" in res.stderr

    verify = cli.run("verify", store)
    assert verify.returncode == 0 and "4 of 4 cells done and sound, ok" in verify.stdout, verify.stdout
    assert mismatches(store_values(store), clean, skip=()) == {}  # (timings, when and where: not compared)
