"""Consolidated metadata (issue 31 item 3, storage/consolidate.py): each run writes it when it ends,
so plain ``xr.open_zarr(store, group=...)`` opens without a warning; a later run that adds a group
or whose group attributes changed leaves an updated view, never a stale one; a run killed after it
made a group leaves a store plain xarray still opens; a node zarr cannot read drops the view."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import xarray as xr
import yaml

from storage import consolidate
from storage.query import open_results

TRAIN = {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-12, "max_iters": 3000}
NETS = {"name": "nets", "experiment": "train", "grid": {"d": [12], "seed": [0, 1]}, "params": TRAIN}
ROB = {"name": "robustness", "experiment": "universal_attack", "from": "nets", "grid": {"attack": ["margin_direction"]}}
MORE = dict(ROB, name="more", grid={"attack": ["random_direction"]})
RUNNER = {"workers": 2, "bundle_size": 2}


def _config(folder, name: str, stages: list[dict]):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "runner": RUNNER, "stages": stages}))
    return path


def _plain(store, group: str) -> xr.Dataset:
    """``xr.open_zarr(store, group=group)`` as a user writes it, any warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return xr.open_zarr(store, group=group)


def _view(store) -> dict:
    return json.loads((store / "zarr.json").read_text())["consolidated_metadata"]["metadata"]


@pytest.fixture(scope="module")
def runs(prefect_server, cli, tmp_path_factory):
    """Run 1: the nets stage alone. Then a group attribute changes by hand (as a run's failures
    list does) and run 2, the chain nets -> robustness, adds a group. Returns (store, views)."""
    root = tmp_path_factory.mktemp("consolidated")
    store = root / "c.zarr"
    res = cli.run("run", _config(root, "one", [NETS]), "--store", store, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    first = {"view": _view(store), "nets": _plain(store, "nets").attrs}
    import zarr

    zarr.open_group(str(store / "nets"), mode="r+", zarr_format=3, use_consolidated=False).attrs["hand_note"] = "x"
    assert "hand_note" not in _plain(store, "nets").attrs  # the view is stale now: the next run's end rewrites it
    res = cli.run("run", _config(root, "two", [NETS, ROB]), "--store", store, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return root, store, first


@pytest.mark.requires_services
def test_a_run_ends_with_a_view_that_plain_xarray_opens_without_a_warning(runs):
    _, store, first = runs
    assert sorted(k for k in first["view"] if "/" not in k) == ["nets"]
    assert first["nets"]["kktlab_experiment"] == "train"
    for group in ("nets", "robustness"):
        ds = _plain(store, group)
        assert ds.attrs["kktlab_identity"] and int(ds.done.sum()) == ds.done.size, group
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = xr.open_datatree(store, engine="zarr")
    assert sorted(tree.children) == ["nets", "robustness"]


@pytest.mark.requires_services
def test_the_second_run_updates_the_view(runs):
    _, store, first = runs
    view = _view(store)
    assert {"nets", "robustness", "robustness/c_star"} <= set(view)  # the group run 2 made
    assert view["nets"]["attributes"]["hand_note"] == "x"  # the attribute changed after run 1
    assert _plain(store, "nets").attrs["hand_note"] == "x"
    assert "hand_note" not in first["nets"]


@pytest.mark.requires_services
def test_a_run_killed_after_it_made_a_group_leaves_a_store_that_opens(runs, cli):
    root, store, _ = runs
    killed = root / "killed.zarr"
    shutil.copytree(store, killed)
    cli.run_killed(_config(root, "three", [NETS, ROB, MORE]), killed,
                   until=lambda s: (s / "more" / "zarr.json").exists())
    assert (killed / "more" / "zarr.json").exists()
    assert not consolidate.has_view(killed)  # dropped before the group was made: no KeyError for 'more'
    with pytest.warns(RuntimeWarning, match="consolidated metadata"):
        ds = xr.open_zarr(killed, group="more")
    assert "done" in ds
    assert sorted(xr.open_datatree(killed, engine="zarr", consolidated=False).children) == ["more", "nets", "robustness"]
    assert int(open_results(killed, "nets").done.sum()) == 2  # kktlab reads the live metadata


@pytest.mark.requires_services
def test_an_unreadable_node_drops_the_view_and_kktlab_still_reads(runs, tmp_path, capsys):
    _, store, _ = runs
    copy = tmp_path / "damaged.zarr"
    shutil.copytree(store, copy)
    assert consolidate.consolidate(copy) and consolidate.has_view(copy)
    (copy / "robustness" / "c_star" / "zarr.json").write_text("{garbage")
    assert not consolidate.consolidate(copy)
    assert "no consolidated metadata written" in capsys.readouterr().err
    assert not consolidate.has_view(copy)
    assert int(open_results(copy, "nets").done.sum()) == 2
    assert consolidate.invalidate(copy) is False  # nothing left to drop
