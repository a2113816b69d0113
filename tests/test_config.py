"""Bad configs and bad stores stop before any work, exit code != 0, one message naming the field."""

import pytest
import yaml

from kktlab import cli
from flows import config
from core.errors import ConfigError

GOOD = {"experiment": "nonrobust", "grid": {"d": [10, 20], "seed": [0]}, "params": {"width": 8}}


def with_(**changes):
    raw = yaml.safe_load(yaml.safe_dump(GOOD))
    for dotted, value in changes.items():
        node, *path = dotted.split("__")
        target = raw
        keys = [node, *path]
        for k in keys[:-1]:
            target = target.setdefault(k, {})
        if value is DELETE:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    return raw


DELETE = object()

BAD = [
    ("unknown top-level key", with_(colour="red"), "colour", "allowed"),
    ("unknown experiment", with_(experiment="nonrobus"), "experiment", "nonrobust"),
    ("missing experiment", with_(experiment=DELETE), "experiment", "missing"),
    ("empty grid", with_(grid={}), "grid", "empty"),
    ("empty grid axis", with_(grid__d=[]), "grid.d", "empty"),
    ("grid scalar", with_(grid__d=10), "grid.d", "list"),
    ("unknown grid param", with_(grid__depth=[2]), "grid.depth", "allowed"),
    ("negative width", with_(params__width=-3), "params.width", ">= 1"),
    ("width wrong type", with_(params__width="wide"), "params.width", "expected int"),
    ("float for int", with_(grid__d=[10.5]), "grid.d", "expected int"),
    ("bool for int", with_(params__width=True), "params.width", "expected int"),
    ("unknown attack", with_(params__attack="pgd_linf"), "params.attack", "margin_direction"),
    ("unknown loss", with_(params__loss="hinge"), "params.loss", "exp"),
    ("param in grid and params", with_(params__d=5), "params.d", "grid"),
    ("duplicate grid values", with_(grid__seed=[0, 0]), "grid.seed", "duplicate"),
    ("unknown runner key", with_(runner={"gpus": 2}), "runner.gpus", "allowed"),
    ("runner workers zero", with_(runner={"workers": 0}), "runner.workers", ">= 1"),
    ("address without address", with_(runner={"cluster": "address"}), "runner.address", "tcp://"),
    ("impossible cross-field", with_(params__data="orthogonal", params__m=50), "data", "m <= d"),
    ("target loss above 1", with_(params__target_loss=2.0), "params.target_loss", "<= 1"),
    ("grid not a mapping", with_(grid=[1, 2]), "grid", "mapping"),
    ("bad group name", with_(name="a/b"), "name", "letters"),
    ("case without its coordinate", with_(grid__d=[10, {"width": 4}]), "grid.d[1]", "coordinate"),
    ("case sets a grid axis", with_(grid__d=[{"d": 10, "seed": 1}]), "grid.d[0].seed", "grid axis"),
    ("case sets an unknown param", with_(grid__d=[{"d": 10, "depth": 1}]), "grid.d[0].depth", "allowed"),
    ("case value out of range", with_(grid__d=[{"d": 10, "width": 0}]), "grid.d[0].width", ">= 1"),
    ("two axes' cases set one param", with_(grid__d=[{"d": 10, "width": 4}], grid__seed=[{"seed": 0, "width": 6}]),
     "grid.seed", "one axis"),
]


@pytest.mark.parametrize("label,raw,field,hint", BAD, ids=[b[0] for b in BAD])
def test_bad_config_names_the_field(label, raw, field, hint):
    with pytest.raises(ConfigError) as err:
        config.parse(raw)
    assert err.value.field == field
    assert hint in str(err.value)


@pytest.mark.parametrize("label,raw,field,hint", BAD[:12], ids=[b[0] for b in BAD[:12]])
def test_cli_exits_nonzero_without_traceback(label, raw, field, hint, write_config, capsys, tmp_path):
    path = write_config(raw)
    rc = cli.main(["run", str(path), "--store", str(tmp_path / "s.zarr")])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"'{field}'" in err and "Traceback" not in err
    assert not (tmp_path / "s.zarr").exists()  # no work, not even an empty store


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_device_cuda_without_a_gpu_is_refused_before_anything_runs(write_config, capsys, tmp_path):
    """Issue 42: ``device: cuda`` on a local cluster without a GPU was admitted and its bundles waited for a
    GPU worker forever; now one line names runner.device, before any store or service (exit 2). A
    scheduler address may have GPU workers: admitted."""
    raw = dict(GOOD, runner={"workers": 1, "device": "cuda"})
    rc = cli.main(["run", str(write_config(raw)), "--store", str(tmp_path / "s.zarr"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "'runner.device': cuda, but no CUDA GPU is visible here" in err and "Traceback" not in err
    assert not (tmp_path / "s.zarr").exists()
    config.check_stages(config.parse(dict(raw, runner={"device": "cuda", "cluster": "address",
                                                        "address": "tcp://127.0.0.1:8786"})))
    config.check_stages(config.parse(dict(raw, runner={"device": "auto"})))


def test_yaml_error_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment: [unclosed\n")
    assert cli.main(["run", str(bad)]) == 2
    assert cli.main(["run", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "no config file" in err


def test_good_config_fills_defaults_and_expands_grid():
    cfg = config.parse(GOOD)
    assert cfg.params["width"] == 8 and cfg.params["loss"] == "exp"
    assert [(c["d"], c["seed"]) for c in cfg.cells()] == [(10, 0), (20, 0)]
    assert cfg.name == "nonrobust" and cfg.runner["workers"] == 2


def test_cases_set_parameters_per_coordinate_and_round_trip():
    """A grid value given as a mapping (a case) sets other parameters for that coordinate only."""
    raw = with_(grid__d=[10, {"d": 20, "width": 16, "lr0": 0.5}])
    cfg = config.parse(raw)
    assert cfg.grid["d"] == [10, 20] and cfg.cases == {"d": {20: {"width": 16, "lr0": 0.5}}}
    cells = {c["d"]: c for c in cfg.cells()}
    assert cells[10]["width"] == 8 and cells[20]["width"] == 16 and cells[20]["lr0"] == 0.5
    assert cells[10]["lr0"] == cfg.params["lr0"]
    again = config.parse(cfg.to_dict())  # what the sweep flow receives
    assert again.cells() == cfg.cells() and again.cases == cfg.cases


def test_store_refuses_changed_cases(tmp_path):
    from flows.sweep import open_store
    from core.errors import StoreError

    store = tmp_path / "s.zarr"
    open_store(config.parse(with_(grid__d=[10, {"d": 20, "width": 16}])), store, "cpu")
    open_store(config.parse(with_(grid__d=[10, {"d": 20, "width": 16}])), store, "cpu")  # same: reopens
    with pytest.raises(StoreError, match="cases.d"):
        open_store(config.parse(with_(grid__d=[10, {"d": 20, "width": 32}])), store, "cpu")
    with pytest.raises(StoreError, match="cases.d"):
        open_store(config.parse(with_(grid__d=[10, 20])), store, "cpu")


def test_every_shipped_config_is_valid():
    import pathlib

    for path in sorted(pathlib.Path(__file__).resolve().parents[1].glob("configs/*.yaml")):
        config.load(path)


def test_prefect_yaml_is_written_from_the_registry():
    """deploy/prefect.yaml (the `prefect deploy` route) is what `kktlab deploy --write-yaml`
    writes from the experiment registry: one deployment per experiment, as `kktlab deploy` makes
    them (issue 17; issue 27 item 3: a new experiment is its declaration, never a hand edit here)."""
    import pathlib

    import yaml

    from deploy.prefect_deploy import prefect_yaml
    from flows import experiments

    root = pathlib.Path(__file__).resolve().parents[1]
    text = (root / "deploy" / "prefect.yaml").read_text()
    assert text == prefect_yaml({n: experiments.get(n).description for n in experiments.names()}), \
        "deploy/prefect.yaml is stale: kktlab deploy --write-yaml deploy/prefect.yaml"
    deployments = yaml.safe_load(text)["deployments"]
    assert sorted(d["name"] for d in deployments) == experiments.names()
    assert {d["entrypoint"] for d in deployments} == {"kktlab/served_flow.py:submit"}
    assert all(d["description"] == experiments.get(d["name"]).description for d in deployments)


# --- issue 29 items 7 and 12: refused before any group is made; status of a finished store -------

def test_a_chain_names_its_shared_runner_and_its_stages_fields(monkeypatch):
    """A chain's runner is the chain's (``runner.workers``, not ``stages[0].runner.workers``); a
    stage's memory check names the stage (``stages[0].params.width``)."""
    chain = {"stages": [{"name": "nets", "experiment": "nonrobust", "grid": {"d": [10], "seed": [0]}}]}
    with pytest.raises(ConfigError) as err:
        config.parse(dict(chain, runner={"workers": 0}))
    assert err.value.field == "runner.workers"
    big = {"stages": [{"name": "nets", "experiment": "nonrobust", "grid": {"d": [10, 1_000_000], "seed": [0]},
                       "params": {"width": 100_000, "m": 100_000}}]}
    with pytest.raises(ConfigError) as err:
        config.check_stages(config.parse(big))
    assert err.value.field.split(", ")[:2] == ["stages[0].grid.d", "stages[0].params.m"], str(err.value)


def test_duplicate_grid_values_are_named():
    with pytest.raises(ConfigError, match=r"duplicate values in \[10, 10, 20, 20, 20\]: 10, 20 given more than once"):
        config.parse(with_(grid__d=[10, 10, 20, 20, 20]))


def test_a_foreign_zarr_store_gets_no_group(tmp_path):
    import zarr

    from core.errors import StoreError
    from flows.sweep import open_store

    zarr.open_group(str(tmp_path / "f.zarr"), mode="w", zarr_format=3).create_group("theirs").attrs["owner"] = "me"
    with pytest.raises(StoreError, match="is a Zarr store that kktlab did not write"):
        open_store(config.parse(GOOD), tmp_path / "f.zarr", "cpu")
    assert sorted(p.name for p in (tmp_path / "f.zarr").iterdir()) == ["theirs", "zarr.json"]


def _two_configs(write_config, tmp_path, first: dict, second: dict):
    store = str(tmp_path / "s.zarr")
    return [str(write_config(dict(first, store=store), "a.yaml")), str(write_config(dict(second, store=store), "b.yaml"))]


def test_no_group_is_made_when_a_later_config_is_refused(write_config, tmp_path, capsys):
    """Two configs that would write one group with other grids: refused before either is made."""
    paths = _two_configs(write_config, tmp_path, with_(name="g"), with_(name="g", grid__d=[30]))
    assert cli.main(["run", *paths]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two of the configs write group 'g'" in err[0], err
    assert not (tmp_path / "s.zarr").exists()


def test_no_group_is_made_when_a_later_group_does_not_match(write_config, tmp_path, capsys):
    """The store holds group 'b' of another grid: a run of 'a' then 'b' makes neither."""
    from flows.sweep import open_store

    open_store(config.parse(with_(name="b", grid__d=[30])), tmp_path / "s.zarr", "cpu")
    paths = _two_configs(write_config, tmp_path, with_(name="a"), with_(name="b"))
    assert cli.main(["run", *paths]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config field 'grid.d' is [10, 20]" in err[0], err
    assert sorted(p.name for p in (tmp_path / "s.zarr").iterdir()) == ["b", "zarr.json"]


def test_status_of_a_finished_store_with_damage_shows_no_pace(tmp_path, capsys):
    """Issue 29 item 12: every cell stored (one since damaged), the run over: `status` names the
    damage and prints no pace or ETA, as nothing runs. A run stopped long ago gets no ETA either."""
    import os
    import time

    import numpy as np

    from flows.sweep import open_store
    from storage import pace, schema

    c = config.parse(with_(grid__d=[10, 20, 30]))
    path = tmp_path / "s.zarr"
    store = open_store(c, path, "cpu")
    values = {k: np.arange(20, dtype=v.dtype) if v.dims else np.asarray(7, dtype=v.dtype)
              for k, v in c.exp.variables.items()}
    now = time.time()
    for i in range(3):  # a run of an hour that ended two hours ago
        assert store.write_cell((i, 0), values)
        t = now - 3 * 3600 + i * 1800
        os.utime(path / c.name / schema.DONE / "c" / str(i) / "0", (t, t))
    (path / c.name / "c_star" / "c" / "1" / "0").unlink()
    assert cli.main(["status", str(path)]) == 1
    out = capsys.readouterr().out
    assert "damaged" in out and "pace" not in out and "ETA" not in out, out
    assert pace.pace(path, c.name, 2, now=now) is None
    store.mark_not_done([(2, 0)])  # a cell left to compute, by a run that stopped two hours ago
    p = pace.pace(path, c.name, 2, now=now)
    assert p.rate is None and p.eta_s is None and "ETA" not in p.line() and "no run is storing" in p.line()


def test_a_stage_whose_group_does_not_match_is_named_with_its_stage(write_config, tmp_path, capsys):
    """The store's second group was made with another grid: the refusal names ``stages[1].…``."""
    from flows.sweep import open_store

    def chain(attacks):
        return {"name": "c", "stages": [
            {"name": "nets", "experiment": "train", "grid": {"seed": [0]}, "params": {"d": 10, "width": 4}},
            {"name": "attack", "experiment": "universal_attack", "from": "nets", "grid": {"attack": attacks}}]}
    for stage in config.parse(chain(["margin_direction"])).stages:
        open_store(stage, tmp_path / "s.zarr", "cpu")
    path = write_config(chain(["margin_direction", "random_direction"]))
    assert cli.main(["run", str(path), "--store", str(tmp_path / "s.zarr")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config field 'stages[1].grid.attack' is ['margin_direction', 'random_direction']" \
        in err[0], err
