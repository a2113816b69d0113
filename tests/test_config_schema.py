"""The JSON Schema of configs (issue 42, flows/config_schema.py, ``kktlab schema``): every shipped config
validates against it, and it refuses what kktlab's parser refuses among the things a schema can say
(an unknown key, a value out of its declared bounds or choices, an unknown experiment, a bad runner)."""

from __future__ import annotations

import json
import pathlib

import jsonschema
import pytest
import yaml

from core.errors import ConfigError
from flows import config
from flows.config_schema import schema

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOOD = {"experiment": "nonrobust", "grid": {"d": [10, {"d": 20, "lr0": 0.1}], "seed": {"range": [0, 2]}},
        "params": {"width": 8}, "runner": {"workers": 1}}


@pytest.fixture(scope="module")
def validator():
    return jsonschema.Draft202012Validator(schema())


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(validator, path):
    raw = yaml.safe_load(path.read_text())
    errors = [f"{list(e.path)}: {e.message[:200]}" for e in validator.iter_errors(raw)]
    assert not errors, errors


def _with(change: dict) -> dict:
    raw = json.loads(json.dumps(GOOD))
    for key, value in change.items():
        *path, last = key.split(".")
        node = raw
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    return raw


BAD = {  # a key of the config -> a value both the schema and kktlab's parser refuse
    "params.widht": 8,
    "grid.d": [1],
    "params.loss": "hinge",
    "experiment": "nope",
    "runner.workers": 0,
    "runner.clusterr": "local",
    "grid.seed": [0.5],
    "params.lr0": -1.0,
    "name": "n" * 101,
}


def test_a_good_config_is_valid_for_both(validator):
    assert not list(validator.iter_errors(GOOD))
    config.parse(GOOD)


@pytest.mark.parametrize("key", list(BAD))
def test_what_the_schema_refuses_the_parser_refuses(validator, key):
    raw = _with({key: BAD[key]})
    assert list(validator.iter_errors(raw)), key
    with pytest.raises(ConfigError):
        config.parse(raw)


def test_a_chain_s_stages_are_checked_per_experiment(validator):
    chain = {"stages": [{"name": "nets", "experiment": "train", "grid": {"seed": [0]}},
                        {"name": "gone", "experiment": "unlearn", "from": "nets", "params": {"forget": 0}}]}
    assert not list(validator.iter_errors(chain))
    chain["stages"][1]["params"]["alpha"] = -1.0  # unlearn's step size is > 0
    assert list(validator.iter_errors(chain))


def test_the_cli_writes_the_schema(cli, tmp_path):
    out = tmp_path / "kktlab.schema.json"
    res = cli.run("schema", "--out", out, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(out.read_text()) == json.loads(json.dumps(schema()))


HEADER = "# yaml-language-server: $schema=kktlab.schema.json"


def test_shipped_configs_name_the_shipped_schema_and_it_is_current():
    """Issue 42: every config in ``configs/`` starts with the YAML language server's header naming
    ``configs/kktlab.schema.json``, so an editor completes and checks its keys; that file is what
    ``kktlab schema`` writes today (regenerate it with ``kktlab schema --out configs/kktlab.schema.json``)."""
    lines = {p.name: p.read_text().splitlines()[0] for p in (ROOT / "configs").glob("*.yaml")}
    assert {name: first for name, first in lines.items() if first != HEADER} == {}
    shipped = json.loads((ROOT / "configs" / "kktlab.schema.json").read_text())
    assert shipped == schema(), "configs/kktlab.schema.json is stale: kktlab schema --out configs/kktlab.schema.json"
