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


def test_prefect_yaml_lists_every_deployment():
    """deploy/prefect.yaml (the `prefect deploy` route) names the same deployments as `kktlab deploy`:
    one per experiment (issue 17)."""
    import pathlib

    import yaml

    from flows import experiments

    root = pathlib.Path(__file__).resolve().parents[1]
    deployments = yaml.safe_load((root / "deploy" / "prefect.yaml").read_text())["deployments"]
    assert sorted(d["name"] for d in deployments) == experiments.names()
    assert {d["entrypoint"] for d in deployments} == {"flows/served.py:submit"}
