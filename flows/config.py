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

Every error names its field (``grid.width``) and what is allowed; numbers must be finite and
within their limits, the grid at most ``runner.max_cells`` cells (``--max-cells``), the file at
most ``MAX_CONFIG_BYTES`` whose YAML aliases expand it to at most ``MAX_YAML_NODES`` nodes
nested at most ``MAX_YAML_DEPTH`` deep, names at most ``MAX_NAME`` bytes, no key given twice, and
the files of a real data set (``data: mnist``, ``cifar_vehicles``) present and matching their
checksums.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import pathlib
import re
import reprlib
from typing import Any

import yaml

from core.declare import REQUIRED, Experiment, Param
from core.errors import ConfigError
from flows import experiments
from flows.config_axes import as_range, axis_length, axis_values, refuse_more_cells
from flows.config_yaml import MAX_YAML_DEPTH, MAX_YAML_NODES, read_yaml  # noqa: F401 (config.read_yaml)

DEFAULT_STORE = "results/{name}.zarr"
MAX_CONFIG_BYTES = 256 * 1024  # the config travels as Prefect flow parameters (text and parsed: twice)
PREFECT_PARAMETER_LIMIT = 524_288  # Prefect's default server.api.max_parameter_size
# YAML aliases (*a) repeat a node without repeating its text: 700 bytes can stand for 10^9 nodes
# ("billion laughs"). No alias-free config of MAX_CONFIG_BYTES holds this many (a node takes a byte
# or more), so the bound refuses only aliases that multiply the file; it is checked in time linear
# in the file (each node once), before anything walks the expanded document.
MAX_NAME = 100  # bytes of a config or stage name: it names store folders (<store>/<name>, caches, checkpoints)
_SHOW = reprlib.Repr()  # values in messages: one short line whatever the value (a long string, a deep list)
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong, _SHOW.maxlevel = 80, 80, 60, 2


def _show(value: Any) -> str:
    text = _SHOW.repr(value)
    return text if len(text) <= 200 else text[:197] + "..."

# a Dask scheduler address: protocol://host:port (host a name, IPv4 or [IPv6])
ADDRESS = re.compile(r"^(tcp|tls|ucx|ws|wss)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
TOP_KEYS = ("experiment", "name", "description", "store", "grid", "params", "runner", "stages")
RUNNER = {
    "cluster": Param(str, "local", "local: LocalCluster; address: an existing scheduler; cuda: LocalCUDACluster; "
                     "inline: no Dask (run bundles in the flow process)", choices=("local", "address", "cuda", "inline")),
    "address": Param(str, "", "scheduler address tcp://host:port (cluster: address)"),
    "workers": Param(int, 2, "worker processes of a local cluster", min=1, max=256),
    "threads_per_worker": Param(int, 1, "threads per worker (torch uses 1 thread per task)", min=1, max=256),
    "device": Param(str, "auto", "where kernels run", choices=("auto", "cpu", "cuda")),
    "bundle_size": Param(int, 64, "most cells per bundle (one Prefect task)", min=1, max=100_000),
    "chunk_cells": Param(int, 0, "most cells of one Zarr chunk of a new group (0: bundle_size; 1: a chunk per "
                         "cell, as stores made before issue 33)", min=0, max=100_000),
    "retries": Param(int, 2, "retries of a bundle lost with its worker", min=0, max=100),
    "max_cells": Param(int, 100_000, "most grid cells (each is a dict in memory and a Prefect task input; "
                       "--max-cells raises it)", min=1),
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
    # A stage of a chain (flows/stages.py) that reads from an earlier stage: its name, and that
    # stage's store dims (its group's dims come first) and extra dims (inherited).
    source: str | None = None
    upstream_grid: dict[str, list] = dataclasses.field(default_factory=dict)
    upstream_extra: dict[str, int] = dataclasses.field(default_factory=dict)
    # A producer of nets: the contracts its cells can have (core.declare.NetsContract, flows/contracts.py).
    nets_contracts: set = dataclasses.field(default_factory=set)

    def store_path(self, override: str | None = None) -> str:
        """Where results go: ``override`` (``--store``), else the config's ``store``, else
        ``results/<name>.zarr``."""
        return override or self.store or DEFAULT_STORE.format(name=self.name)

    @property
    def exp(self) -> Experiment:
        return experiments.get(self.experiment)

    @property
    def stages(self) -> list["Config"]:
        """A config without ``stages:`` is a chain of one (see flows/stages.py)."""
        return [self]

    @property
    def store_grid(self) -> dict[str, list]:
        """The dims and coords of the store group: the upstream stage's, then this stage's axes."""
        return {**self.upstream_grid, **self.grid}

    @property
    def n_cells(self) -> int:
        """How many cells the store group has, from the axis lengths (the grid is not materialised)."""
        return math.prod(len(v) for v in self.store_grid.values())

    def store_cells(self) -> list[dict]:
        """The parameters of every cell of the store group, in C order of its dims: this stage's
        cells, repeated once per upstream cell (which upstream cell is the leading part of the
        cell's index)."""
        own = self.cells()
        return [cell for _ in range(math.prod(len(v) for v in self.upstream_grid.values())) for cell in own]

    def extra_sizes(self) -> dict[str, int]:
        """Sizes of the extra (non-grid) dims: the upstream's, then this experiment's own."""
        own = self.exp.extra_dims(self.cells())
        for dim, size in own.items():  # a list of names: as long as the longest of those upstream dims
            if isinstance(size, list):
                own[dim] = max(self.upstream_extra.get(name, 0) for name in size) or 1
        return {**self.upstream_extra, **own}

    def iter_cells(self):
        """Every grid cell as a full parameter dict, in C order of the grid dims, one at a time."""
        keys = list(self.grid)
        for vals in itertools.product(*self.grid.values()):
            cell = dict(self.params, **dict(zip(keys, vals)))
            for axis, by_value in self.cases.items():
                cell.update(by_value.get(cell[axis], {}))
            yield cell

    def cells(self) -> list[dict]:
        """Every grid cell as a full parameter dict, in C order of the grid dims."""
        return list(self.iter_cells())

    def to_dict(self) -> dict:
        """The config as :func:`parse` reads it back; a long integer axis in steps of one stride as
        ``{range: [start, stop, step]}`` (the flow's parameters stay small for 10^5-cell grids)."""
        grid = {axis: as_range(vals) or [{axis: v, **self.cases[axis][v]} if v in self.cases.get(axis, {}) else v
                                          for v in vals]
                for axis, vals in self.grid.items()}
        return {"experiment": self.experiment, "name": self.name, "store": self.store, "grid": grid,
                "params": self.params, "runner": self.runner, "description": self.description}


def coerce(field: str, p: Param, value: Any) -> Any:
    """Check one value against its Param; return it in the Param's type (or one of its choices,
    type for type: ``compile_step`` takes false, true or "auto")."""
    if p.choices is not None and any(type(value) is type(c) and value == c for c in p.choices):
        return value
    if p.type is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:  # an int beyond any float (1e308)
            raise ConfigError(field, f"{_show(value)} is out of range: every float is at most 1e100 in size; "
                              f"allowed: {p.allowed()}") from None
    if p.type is float and isinstance(value, str):
        try:  # YAML reads 1e-30 as a string
            value = float(value)
        except ValueError:
            pass
    if not isinstance(value, p.type) or (p.type is not bool and isinstance(value, bool)):
        raise ConfigError(field, f"expected {p.type.__name__}, got {type(value).__name__} {_show(value)}; "
                          f"allowed: {p.allowed()}")
    if p.type is float and not math.isfinite(value):
        raise ConfigError(field, f"{_show(value)} is not a finite number; allowed: {p.allowed()}")
    if p.type in (int, float) and p.max is None and abs(value) > p.limit():
        limit = "1e100" if p.type is float else "2**53"
        raise ConfigError(field, f"{_show(value)} is out of range: every {p.type.__name__} is at most {limit} in size; "
                          f"allowed: {p.allowed()}")
    if p.choices is not None and value not in p.choices:
        raise ConfigError(field, f"{_show(value)} is not allowed; allowed: {p.allowed()}")
    if p.min is not None and value < p.min or p.gt is not None and value <= p.gt or p.max is not None and value > p.max:
        raise ConfigError(field, f"{_show(value)} is out of range; allowed: {p.allowed()}")
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


def parse(raw: Any, text: str = ""):
    """A validated :class:`Config`, or for a config with ``stages:`` a :class:`flows.stages.Chain`
    (both have ``.stages``, ``.name``, ``.runner``, ``.store_path()``)."""
    if not isinstance(raw, dict):
        raise ConfigError("<top>", "a config is a YAML mapping with keys " + ", ".join(TOP_KEYS))
    if "stages" in raw:
        from flows import stages

        # what a chain shares is checked here, under its own field: each stage is parsed with the
        # chain's runner, and an error there would read 'stages[0].runner.…'
        if isinstance(raw.get("name"), str) and raw["name"].strip():
            check_name("name", raw["name"])
        parse_runner(raw.get("runner"))
        return stages.parse_chain(raw, text)
    return parse_one(raw, text)


def check_name(field: str, name: str) -> None:
    """A config or stage name names folders of the store (its group, its cache and checkpoints):
    at most :data:`MAX_NAME` bytes, letters, digits, '-' and '_'."""
    size = len(name.encode("utf-8"))
    if size > MAX_NAME:
        raise ConfigError(field, f"{_show(name)} is {size} bytes long; a name is at most {MAX_NAME} "
                          "(it names folders of the store)")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(field, f"{_show(name)}: use letters, digits, '-' and '_' only")


def parse_runner(runner_raw: Any) -> dict[str, Any]:
    """The ``runner`` block, defaults filled (RUNNER)."""
    runner = {}
    for key, value in _mapping("runner", runner_raw).items():
        if key not in RUNNER:
            raise ConfigError(f"runner.{key}", "unknown key; allowed: " + ", ".join(RUNNER))
        runner[key] = coerce(f"runner.{key}", RUNNER[key], value)
    for key, p in RUNNER.items():
        runner.setdefault(key, p.default)
    if runner["cluster"] == "address" and not runner["address"]:
        raise ConfigError("runner.address", "required when runner.cluster is 'address' (tcp://host:port)")
    if runner["address"]:
        check_address(runner["address"])
    return runner


def parse_one(raw: dict, text: str = "", source: str | None = None) -> Config:
    """One experiment (a config without stages, or one stage of a chain)."""
    for key in raw:
        if key not in TOP_KEYS or key == "stages":
            raise ConfigError(str(key), f"unknown key; allowed: {', '.join(TOP_KEYS)}")
    name = raw.get("experiment")
    if name is None:
        raise ConfigError("experiment", "missing; allowed: " + ", ".join(experiments.names()))
    if name not in experiments.names():
        raise ConfigError("experiment", f"unknown experiment {_show(name)}; allowed: " + ", ".join(experiments.names()))
    exp = experiments.get(name)

    grid_raw = _mapping("grid", raw.get("grid"))
    if not grid_raw:
        raise ConfigError("grid", "empty: name at least one parameter with a list of values; parameters: "
                          + ", ".join(exp.params))
    runner = parse_runner(raw.get("runner"))
    lengths = {key: axis_length(f"grid.{key}", v) for key, v in grid_raw.items() if key in exp.params}
    if None not in lengths.values():  # counted before any value is expanded or checked (issue 42: a 10^7-cell
        refuse_more_cells(lengths, runner)  # axis was refused after 171 s and 1.26 GB); else the loop says why
    grid: dict[str, list] = {}
    cases: dict[str, dict] = {}
    for key, values in grid_raw.items():
        f = f"grid.{key}"
        check_renamed(f, name, key)
        if key not in exp.params:
            raise ConfigError(f, f"unknown parameter of '{name}'; allowed: " + ", ".join(exp.params))
        check_axis_name(f, name, key)
        values = axis_values(f, values)
        if not isinstance(values, list):
            raise ConfigError(f, f"grid values must be a list, got {type(values).__name__} (fixed values go in params)")
        if not values:
            raise ConfigError(f, "empty list: a grid axis needs at least one value")
        vals = []
        for i, v in enumerate(values):
            vals.append(_case(exp, name, key, f"{f}[{i}]", v, grid_raw, cases) if isinstance(v, dict)
                        else coerce(f, exp.params[key], v))
        if len(set(vals)) != len(vals):
            met: set = set()
            twice = list(dict.fromkeys(v for v in vals if v in met or met.add(v)))
            raise ConfigError(f, f"duplicate values in {_show(vals)}: {_show(twice)[1:-1]} given more than once")
        grid[key] = vals

    params_raw = _mapping("params", raw.get("params"))
    params = {}
    for key, value in params_raw.items():
        f = f"params.{key}"
        check_renamed(f, name, key)
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


    for field in ("name", "store", "description"):
        if raw.get(field) is not None and not isinstance(raw[field], str):
            raise ConfigError(field, f"expected a string, got {type(raw[field]).__name__}")
    for field in ("name", "store"):
        if raw.get(field) is not None and not raw[field].strip():
            raise ConfigError(field, "is empty; leave the key out for the default "
                              + ("(the experiment name)" if field == "name" else "(results/<name>.zarr)"))
    group = raw.get("name") or name
    check_name("name", group)
    overridden: dict[str, str] = {}
    for axis, by_value in cases.items():
        for k in {k for o in by_value.values() for k in o}:
            if k in overridden:
                raise ConfigError(f"grid.{axis}", f"'{k}' is also set by the cases of grid.{overridden[k]}; "
                                  "set a parameter from the cases of one axis only")
            overridden[k] = axis
    cfg = Config(experiment=name, name=group, store=raw.get("store"), grid=grid, params=params,
                 runner=runner, description=raw.get("description") or "", text=text, cases=cases, source=source)
    for cell in cfg.iter_cells():
        exp.check(cell)
    check_data(cfg)
    check_payload(cfg)
    return cfg


def load(path: str | pathlib.Path, overrides: dict | None = None) -> Config:
    """Read and validate a YAML config; ``overrides`` replace top-level keys (e.g. store)."""
    raw, text = read_yaml(pathlib.Path(path))
    if overrides and isinstance(raw, dict):
        for key, value in overrides.items():
            if isinstance(value, dict):
                raw[key] = {**(raw.get(key) or {}), **value}
            else:
                raw[key] = value
    return parse(raw, text)


# the checks of a parsed config, in flows/config_checks.py (imported last: they use Config)
from flows.config_checks import (SEL_KEYWORDS, check_address, check_axis_name, check_data, check_renamed,  # noqa: E402,F401
                                 check_fits, check_payload, check_stages, field_of)
