"""Stages that chain (issue 13, first step): configs with stages, validated before any work; a
train -> universal_attack chain end to end through the real CLI (real Prefect server, Dask
LocalCluster, Zarr), its numbers equal nonrobust's for the same cells; stored nets read back."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import xarray as xr

from core.errors import ConfigError
from flows import config
from storage import schema

TRAIN = {"width": 16, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-6, "max_iters": 3000}  # converged: ~1,200 steps
GRID = {"d": [12, 24], "seed": [0, 1]}
ATTACKS = ["margin_direction", "random_direction"]
RUNNER = {"workers": 2, "bundle_size": 2}


def chain(**changes) -> dict:
    raw = {"name": "tiny", "runner": dict(RUNNER), "stages": [
        {"name": "nets", "experiment": "train", "grid": dict(GRID), "params": dict(TRAIN)},
        {"name": "robustness", "experiment": "universal_attack", "from": "nets", "grid": {"attack": list(ATTACKS)}},
    ]}
    for key, value in changes.items():  # "s1.from": stage 1's key; "top.x": a top-level key
        where, field = key.split(".", 1)
        target = raw if where == "top" else raw["stages"][int(where[1:])]
        if value is None:
            target.pop(field, None)
        else:
            target[field] = value
    return raw


def three(**changes) -> dict:
    raw = chain(**changes)
    raw["stages"].append({"name": "again", "experiment": "universal_attack", "from": "nets",
                          "grid": {"slack": [1.05]}})
    return raw


BAD = [
    ("from names no stage", chain(**{"s1.from": "nest"}), "stages[1].from", "names no stage"),
    ("from names a later stage", three(**{"s1.from": "again"}), "stages[1].from", "comes later"),
    ("from names itself (a cycle)", chain(**{"s1.from": "robustness"}), "stages[1].from", "cycle"),
    ("cycle of two", {"stages": [dict(chain()["stages"][1], **{"name": "a", "from": "b"}),
                                 dict(chain()["stages"][1], **{"name": "b", "from": "a"})]}, "stages[0].from", "cycle"),
    ("two stages with one name", chain(**{"s1.name": "nets"}), "stages[1].name", "two stages"),
    ("axis of the upstream", chain(**{"s1.grid": {"attack": ATTACKS, "seed": [0]}}), "stages[1].grid.seed",
     "also an axis"),
    ("reads what the upstream does not produce",
     {"stages": [dict(chain()["stages"][0], experiment="nonrobust"), chain()["stages"][1]]},
     "stages[1].from", "produces nothing"),
    ("reads from an attack stage", {"stages": [*chain()["stages"], dict(chain()["stages"][1], name="x",
                                                                        **{"from": "robustness"})]},
     "stages[2].from", "produces nothing"),
    ("a reader without from", chain(**{"s1.from": None}), "stages[1].from", "reads 'nets'"),
    ("from on a non-reader", {"stages": [chain()["stages"][0], dict(chain()["stages"][0], name="b",
                                                                    **{"from": "nets"})]}, "stages[1].from", "reads nothing"),
    ("upstream stores no nets", chain(**{"s0.params": dict(TRAIN, store_nets=False)}), "stages[1].from", "store_nets"),
    ("a stage's own field", chain(**{"s0.grid": {"d": [12], "depth": [2]}}), "stages[0].grid.depth", "allowed"),
    ("unknown stage key", chain(**{"s0.colour": "red"}), "stages[0].colour", "allowed"),
    ("experiment beside stages", chain(**{"top.experiment": "train"}), "experiment", "per stage"),
    ("stage without a name", chain(**{"s0.name": None}), "stages[0].name", "missing"),
    ("stages not a list", {"stages": {"nets": {}}}, "stages", "list"),
]


@pytest.mark.parametrize("label,raw,field,hint", BAD, ids=[b[0] for b in BAD])
def test_bad_chain_names_the_field(label, raw, field, hint):
    with pytest.raises(ConfigError) as err:
        config.parse(raw)
    assert err.value.field == field, str(err.value)
    assert hint in str(err.value) and "\n" not in str(err.value)


def test_bad_chain_stops_the_cli_before_any_work(cli, write_config, tmp_path):
    res = cli.run("run", write_config(chain(**{"s1.from": "nest"})), "--store", tmp_path / "s.zarr", timeout=120)
    assert res.returncode == 2
    assert "config field 'stages[1].from'" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "s.zarr").exists()


def test_chain_config_dims_and_a_config_without_stages_is_a_chain_of_one():
    c = config.parse(chain())
    assert [s.name for s in c.stages] == ["nets", "robustness"]
    assert c.stages[1].store_grid == {**GRID, "attack": ATTACKS} and c.stages[1].n_cells == 8
    assert c.stages[1].extra_sizes()["sample"] == 24  # per-sample variables use the upstream's dim
    again = config.parse(json.loads(json.dumps(c.to_dict())))  # what the flow receives
    assert [s.store_grid for s in again.stages] == [s.store_grid for s in c.stages]
    one = config.parse({"experiment": "nonrobust", "name": "fig", "grid": GRID})
    assert [s.name for s in one.stages] == ["fig"] and one.store_grid == GRID


# --- end to end -------------------------------------------------------------------------------

@pytest.fixture(scope="module")  # a real Prefect server and Dask LocalCluster: its tests are requires_services, slow
def chained(prefect_server, cli, tmp_path_factory):
    """The tiny chain, and nonrobust on the same cells, each run once through the CLI."""
    import yaml

    root = tmp_path_factory.mktemp("chain")
    (root / "chain.yaml").write_text(yaml.safe_dump(chain()))
    ref = {"experiment": "nonrobust", "name": "ref", "grid": {**GRID, "attack": ATTACKS}, "params": TRAIN,
           "runner": RUNNER}
    (root / "ref.yaml").write_text(yaml.safe_dump(ref))
    res = cli.run("run", root / "chain.yaml", "--store", root / "chain.zarr", "--json", root / "stats.json")
    assert res.returncode == 0, res.stderr[-3000:]
    ref_res = cli.run("run", root / "ref.yaml", "--store", root / "ref.zarr")
    assert ref_res.returncode == 0, ref_res.stderr[-3000:]
    return root, res


@pytest.mark.requires_services
@pytest.mark.slow
def test_chain_end_to_end_groups_dims_done(chained):
    from storage.query import open_results

    root, res = chained
    stats = json.loads((root / "stats.json").read_text())
    assert [s["group"] for s in stats] == ["nets", "robustness"]
    assert [s["written"] for s in stats] == [4, 8] and all(s["failed"] == 0 for s in stats)
    tree = open_results(root / "chain.zarr")
    assert isinstance(tree, xr.DataTree) and set(tree.children) == {"nets", "robustness"}
    plain = xr.open_datatree(root / "chain.zarr", engine="zarr", consolidated=False)
    assert set(plain.children) == {"nets", "robustness"}
    nets, rob = tree["nets"].to_dataset(), tree["robustness"].to_dataset()
    assert nets.done.dims == ("d", "seed") and rob.done.dims == ("d", "seed", "attack")
    assert list(rob.d.values) == GRID["d"] and list(rob.seed.values) == GRID["seed"]
    assert list(rob.attack.values) == ATTACKS
    assert dict(nets.W.sizes) == {"d": 2, "seed": 2, "hidden": 16, "feature": 24}
    assert dict(nets.X.sizes) == {"d": 2, "seed": 2, "sample": 24, "feature": 24}
    assert nets.W.dtype == np.float64 and rob.q_sample.dims == ("d", "seed", "attack", "sample")
    assert bool(nets.done.all()) and bool(rob.done.all()) and not bool(rob.failed.any())
    assert float(nets.X.sel(d=12).isel(feature=slice(12, None)).max()) == 0  # zero-padded past d
    assert isinstance(open_results(root / "chain.zarr", "nets"), xr.Dataset)
    assert "[kktlab] nets: cells 4/4" in res.stderr and "== universal_attack / robustness" in res.stdout


@pytest.mark.requires_services
@pytest.mark.slow
def test_load_nets_reproduces_the_stored_margins(chained):
    import torch

    from storage.query import load_nets, open_results

    root, _ = chained
    rob = open_results(root / "chain.zarr", "robustness")
    for d in GRID["d"]:
        n = load_nets(root / "chain.zarr", "nets", d=d)
        out = torch.bmm(torch.relu(torch.baddbmm(n.b.unsqueeze(1), n.X, n.W.transpose(1, 2))),
                        n.v.unsqueeze(-1)).squeeze(-1)
        q = (n.y * out).numpy()
        for e, cell in enumerate(n.cells):
            m = int(n.m[e])
            stored = rob.q_sample.sel(d=cell["d"], seed=cell["seed"], attack=ATTACKS[0]).values[:m]
            np.testing.assert_allclose(q[e, :m], stored, rtol=0, atol=1e-12)


@pytest.mark.requires_services
@pytest.mark.slow
def test_chained_numbers_equal_nonrobust(chained):
    from storage.query import open_results

    root, _ = chained
    rob = open_results(root / "chain.zarr", "robustness").load()
    ref = open_results(root / "ref.zarr", "ref").load().transpose("d", "seed", "attack", ...)
    nets = open_results(root / "chain.zarr", "nets").load()
    for name in ("status", "iters", "log10_loss", "train_acc", "m_used"):
        np.testing.assert_array_equal(nets[name].values, ref[name].isel(attack=0).values, err_msg=name)
    compared = [v for v in rob.data_vars if v in ref.data_vars and v not in ("done", "failed", "cell_hash", *schema.NOT_HASHED)]
    assert {"c_star", "q_sample", "kkt_eps", "robust_c_star", "theory_p"} <= set(compared)
    for name in compared:
        a, b = rob[name].values.astype(float), ref[name].values.astype(float)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=name)


@pytest.mark.requires_services
@pytest.mark.slow
def test_rerun_computes_nothing_and_verify_is_clean(chained, cli):
    root, _ = chained
    res = cli.run("run", root / "chain.yaml", "--store", root / "chain.zarr", "--json", root / "again.json")
    assert res.returncode == 0, res.stderr[-3000:]
    stats = json.loads((root / "again.json").read_text())
    assert [(s["done_before"], s["written"], s["bundles"]) for s in stats] == [(4, 0, 0), (8, 0, 0)]
    assert cli.run("verify", root / "chain.zarr").returncode == 0


@pytest.mark.requires_services
@pytest.mark.slow
def test_a_cell_whose_upstream_failed_is_failed_not_computed(chained, tmp_path):
    """The worker reads its upstream cells from the store; one that failed is named, not used."""
    from flows import experiments
    from flows.sweep import FAILED, compute_reading
    from storage.store import Store

    root, _ = chained
    store = tmp_path / "copy.zarr"
    shutil.copytree(root / "chain.zarr", store)
    Store(store, "nets").write_failed((1, 0), "LinAlgError: boom", force=True)
    exp = experiments.get("universal_attack")
    cells = [{"slack": 1.1, "attack": "margin_direction", "kkt_max_m": 4000}] * 2
    out = compute_reading(exp, cells, "cpu", {"store": str(store), "group": "nets", "indices": [[1, 0], [0, 1]]})
    assert out[0] == {FAILED: "upstream cell (d=24, seed=0) failed: LinAlgError: boom"}
    assert FAILED not in out[1] and np.isfinite(out[1]["c_star"])


@pytest.mark.requires_services
@pytest.mark.slow
def test_report_of_the_chained_store_draws_what_nonrobust_draws(chained, tmp_path):
    """Paper 002 on the chain: ``kktlab report`` draws the same figures and acceptance rows from the
    chained store (the attack group, with its train stage's numbers) as from nonrobust's store."""
    import math

    from kktlab.report import acceptance_rows, report
    from storage.query import stage_scalars

    root, _ = chained
    chained_paths = report(root / "chain.zarr", tmp_path / "chain")
    ref_paths = report(root / "ref.zarr", tmp_path / "ref")
    figs = lambda paths, prefix: sorted(p.name.removeprefix(prefix) for p in paths if p.suffix == ".png")  # noqa: E731
    assert figs(chained_paths, "robustness_") == figs(ref_paths, "ref_") != []
    rob = stage_scalars(root / "chain.zarr", "robustness")
    assert {"status", "iters", "log10_loss"} <= set(rob.data_vars) and rob.status.dims == ("d", "seed", "attack")
    rows, ref_rows = acceptance_rows(rob), acceptance_rows(stage_scalars(root / "ref.zarr", "ref"))
    assert [(r.spec_id, r.criterion) for r in rows] == [(r.spec_id, r.criterion) for r in ref_rows]
    for a, b in zip(rows, ref_rows):
        assert (a.passed, a.measured) == (b.passed, b.measured), a.criterion
        assert (math.isnan(a.value) and math.isnan(b.value)) or a.value == pytest.approx(b.value, rel=1e-9)
    assert "(its nets are drawn with the stages that read them)" in (tmp_path / "chain" / "index.md").read_text()


@pytest.mark.requires_services
@pytest.mark.slow
def test_load_nets_gives_each_net_its_cell_as_it_was_run(chained):
    """A reader sees the upstream cell's fixed parameters beside its coordinates (so it need not
    repeat them, and cannot contradict them)."""
    from storage.query import load_nets

    root, _ = chained
    nets = load_nets(root / "chain.zarr", "nets", d=12)
    assert [c["seed"] for c in nets.cells] == GRID["seed"]
    assert all(c["d"] == 12 and c["width"] == TRAIN["width"] and c["max_iters"] == TRAIN["max_iters"]
               for c in nets.cells)
