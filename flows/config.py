"""Experiment configs: YAML -> validated :class:`Config`, before any work starts.

```yaml
experiment: nonrobust        # a registered experiment (`kktlab experiments`)
name: fig1a                  # optional: the store group (default: the experiment name)
store: results/fig1a.zarr    # optional: --store overrides
grid: {d: [100, 200], seed: [0, 1]}   # each list becomes a dim (cartesian product)
params: {width: 1000}        # fixed values; defaults fill the rest
runner: {workers: 2}         # see RUNNER
```
A grid value may be a mapping, a *case*: it holds the axis's own value (the coordinate) and
parameters that hold for that coordinate only, replacing ``params`` there::

    grid:
      estimator:
        - exact
        - {estimator: naive_mc, n_samples: 1000000}
        - {estimator: nested_sampling, n_samples: 1000}

Every error names its field (``grid.width``) and what is allowed.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from typing import Any

import yaml

from core.declare import REQUIRED, Experiment, Param
from core.errors import ConfigError
from flows import experiments

DEFAULT_STORE = "results/{name}.zarr"
TOP_KEYS = ("experiment", "name", "description", "store", "grid", "params", "runner")
RUNNER = {
    "cluster": Param(str, "local", "local: LocalCluster; address: an existing scheduler; cuda: LocalCUDACluster; "
                     "inline: no Dask (run bundles in the flow process)", choices=("local", "address", "cuda", "inline")),
    "address": Param(str, "", "scheduler address tcp://host:port (cluster: address)"),
    "workers": Param(int, 2, "worker processes of a local cluster", min=1),
    "threads_per_worker": Param(int, 1, "threads per worker (torch uses 1 thread per task)", min=1),
    "device": Param(str, "auto", "where kernels run", choices=("auto", "cpu", "cuda")),
    "bundle_size": Param(int, 64, "most cells per bundle (one Prefect task)", min=1),
    "retries": Param(int, 2, "retries of a bundle lost with its worker", min=0),
}


@dataclasses.dataclass
class Config:
    experiment: str
    name: str
    store: str | None
    grid: dict[str, list]
    params: dict[str, Any]
    runner: dict[str, Any]
    description: str = ""
    text: str = ""
    cases: dict[str, dict] = dataclasses.field(default_factory=dict)  # axis -> {coordinate: overrides}

    def store_path(self, override: str | None = None) -> str:
        """Where results go: ``override`` (``--store``), else the config's ``store``, else
        ``results/<name>.zarr``."""
        return override or self.store or DEFAULT_STORE.format(name=self.name)

    @property
    def exp(self) -> Experiment:
        return experiments.get(self.experiment)

    def cells(self) -> list[dict]:
        """Every grid cell as a full parameter dict, in C order of the grid dims."""
        keys = list(self.grid)
        cells = []
        for vals in itertools.product(*self.grid.values()):
            cell = dict(self.params, **dict(zip(keys, vals)))
            for axis, by_value in self.cases.items():
                cell.update(by_value.get(cell[axis], {}))
            cells.append(cell)
        return cells

    def to_dict(self) -> dict:
        grid = {axis: [{axis: v, **self.cases[axis][v]} if v in self.cases.get(axis, {}) else v for v in vals]
                for axis, vals in self.grid.items()}
        return {"experiment": self.experiment, "name": self.name, "store": self.store, "grid": grid,
                "params": self.params, "runner": self.runner, "description": self.description}


def coerce(field: str, p: Param, value: Any) -> Any:
    """Check one value against its Param; return it in the Param's type."""
    if p.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if p.type is float and isinstance(value, str):
        try:  # YAML reads 1e-30 as a string
            value = float(value)
        except ValueError:
            pass
    if not isinstance(value, p.type) or (p.type is not bool and isinstance(value, bool)):
        raise ConfigError(field, f"expected {p.type.__name__}, got {type(value).__name__} {value!r}; allowed: {p.allowed()}")
    if p.choices is not None and value not in p.choices:
        raise ConfigError(field, f"{value!r} is not allowed; allowed: {p.allowed()}")
    if p.min is not None and value < p.min or p.gt is not None and value <= p.gt or p.max is not None and value > p.max:
        raise ConfigError(field, f"{value!r} is out of range; allowed: {p.allowed()}")
    return value


def _mapping(field: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(field, f"expected a mapping, got {type(value).__name__}")
    return value


def _case(exp: Experiment, name: str, axis: str, field: str, case: dict, grid_raw: dict, cases: dict) -> Any:
    """A case of a grid axis: returns its coordinate; records its parameter overrides in ``cases``."""
    if axis not in case:
        raise ConfigError(field, f"a case needs its coordinate '{axis}: <value>' beside the parameters it sets")
    value = coerce(f"{field}.{axis}", exp.params[axis], case[axis])
    overrides = {}
    for k, v in case.items():
        if k == axis:
            continue
        if k not in exp.params:
            raise ConfigError(f"{field}.{k}", f"unknown parameter of '{name}'; allowed: " + ", ".join(exp.params))
        if k in grid_raw:
            raise ConfigError(f"{field}.{k}", "is a grid axis; a case may only set fixed parameters")
        overrides[k] = coerce(f"{field}.{k}", exp.params[k], v)
    if overrides:
        cases.setdefault(axis, {})[value] = overrides
    return value


def parse(raw: Any, text: str = "") -> Config:
    if not isinstance(raw, dict):
        raise ConfigError("<top>", "a config is a YAML mapping with keys " + ", ".join(TOP_KEYS))
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(str(key), f"unknown key; allowed: {', '.join(TOP_KEYS)}")
    name = raw.get("experiment")
    if name is None:
        raise ConfigError("experiment", "missing; allowed: " + ", ".join(experiments.names()))
    if name not in experiments.names():
        raise ConfigError("experiment", f"unknown experiment {name!r}; allowed: " + ", ".join(experiments.names()))
    exp = experiments.get(name)

    grid_raw = _mapping("grid", raw.get("grid"))
    if not grid_raw:
        raise ConfigError("grid", "empty: name at least one parameter with a list of values; parameters: "
                          + ", ".join(exp.params))
    grid: dict[str, list] = {}
    cases: dict[str, dict] = {}
    for key, values in grid_raw.items():
        f = f"grid.{key}"
        if key not in exp.params:
            raise ConfigError(f, f"unknown parameter of '{name}'; allowed: " + ", ".join(exp.params))
        if not isinstance(values, list):
            raise ConfigError(f, f"grid values must be a list, got {type(values).__name__} (fixed values go in params)")
        if not values:
            raise ConfigError(f, "empty list: a grid axis needs at least one value")
        vals = []
        for i, v in enumerate(values):
            vals.append(_case(exp, name, key, f"{f}[{i}]", v, grid_raw, cases) if isinstance(v, dict)
                        else coerce(f, exp.params[key], v))
        if len(set(vals)) != len(vals):
            raise ConfigError(f, f"duplicate values in {vals}")
        grid[key] = vals

    params_raw = _mapping("params", raw.get("params"))
    params = {}
    for key, value in params_raw.items():
        f = f"params.{key}"
        if key not in exp.params:
            raise ConfigError(f, f"unknown parameter of '{name}'; allowed: " + ", ".join(exp.params))
        if key in grid:
            raise ConfigError(f, "is also a grid axis; give it in one place only")
        params[key] = coerce(f, exp.params[key], value)
    for key, p in exp.params.items():
        if key not in grid and key not in params:
            if p.default is REQUIRED:
                raise ConfigError(f"params.{key}", f"required ({p.doc}); allowed: {p.allowed()}")
            params[key] = p.default

    runner_raw = _mapping("runner", raw.get("runner"))
    runner = {}
    for key, value in runner_raw.items():
        if key not in RUNNER:
            raise ConfigError(f"runner.{key}", "unknown key; allowed: " + ", ".join(RUNNER))
        runner[key] = coerce(f"runner.{key}", RUNNER[key], value)
    for key, p in RUNNER.items():
        runner.setdefault(key, p.default)
    if runner["cluster"] == "address" and not runner["address"]:
        raise ConfigError("runner.address", "required when runner.cluster is 'address' (tcp://host:port)")

    for field in ("name", "store", "description"):
        if raw.get(field) is not None and not isinstance(raw[field], str):
            raise ConfigError(field, f"expected a string, got {type(raw[field]).__name__}")
    group = raw.get("name") or name
    if not group.replace("-", "").replace("_", "").isalnum():
        raise ConfigError("name", f"{group!r}: use letters, digits, '-' and '_' only")
    overridden: dict[str, str] = {}
    for axis, by_value in cases.items():
        for k in {k for o in by_value.values() for k in o}:
            if k in overridden:
                raise ConfigError(f"grid.{axis}", f"'{k}' is also set by the cases of grid.{overridden[k]}; "
                                  "set a parameter from the cases of one axis only")
            overridden[k] = axis
    cfg = Config(experiment=name, name=group, store=raw.get("store"), grid=grid, params=params,
                 runner=runner, description=raw.get("description") or "", text=text, cases=cases)
    for cell in cfg.cells():
        exp.check(cell)
    return cfg


def load(path: str | pathlib.Path, overrides: dict | None = None) -> Config:
    """Read and validate a YAML config; ``overrides`` replace top-level keys (e.g. store)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError("<file>", f"no config file at {path}")
    text = path.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError("<file>", f"{path} is not valid YAML: {err}") from None
    if overrides and isinstance(raw, dict):
        for key, value in overrides.items():
            if isinstance(value, dict):
                raw[key] = {**(raw.get(key) or {}), **value}
            else:
                raw[key] = value
    return parse(raw, text)
