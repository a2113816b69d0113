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
most ``MAX_CONFIG_BYTES``, and no key may be given twice.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import pathlib
import re
from typing import Any

import yaml

from core.declare import REQUIRED, Experiment, Param
from core.errors import ConfigError
from flows import experiments

DEFAULT_STORE = "results/{name}.zarr"
MAX_CONFIG_BYTES = 256 * 1024  # the config travels as Prefect flow parameters (text and parsed: twice)
PREFECT_PARAMETER_LIMIT = 524_288  # Prefect's default server.api.max_parameter_size
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
    if p.type is float and not math.isfinite(value):
        raise ConfigError(field, f"{value!r} is not a finite number; allowed: {p.allowed()}")
    if p.type in (int, float) and p.max is None and abs(value) > p.limit():
        limit = "1e100" if p.type is float else "2**53"
        raise ConfigError(field, f"{value!r} is out of range: every {p.type.__name__} is at most {limit} in size; "
                          f"allowed: {p.allowed()}")
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


def parse(raw: Any, text: str = ""):
    """A validated :class:`Config`, or for a config with ``stages:`` a :class:`flows.stages.Chain`
    (both have ``.stages``, ``.name``, ``.runner``, ``.store_path()``)."""
    if not isinstance(raw, dict):
        raise ConfigError("<top>", "a config is a YAML mapping with keys " + ", ".join(TOP_KEYS))
    if "stages" in raw:
        from flows import stages

        return stages.parse_chain(raw, text)
    return parse_one(raw, text)


def parse_one(raw: dict, text: str = "", source: str | None = None) -> Config:
    """One experiment (a config without stages, or one stage of a chain)."""
    for key in raw:
        if key not in TOP_KEYS or key == "stages":
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
    if runner["address"]:
        check_address(runner["address"])
    n_cells = math.prod(len(v) for v in grid.values())
    if n_cells > runner["max_cells"]:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in grid.items())
        raise ConfigError("grid", f"{n_cells:,} cells ({sizes}) is more than the limit of {runner['max_cells']:,} "
                          f"(runner.max_cells); pass --max-cells {n_cells} if you mean it")

    for field in ("name", "store", "description"):
        if raw.get(field) is not None and not isinstance(raw[field], str):
            raise ConfigError(field, f"expected a string, got {type(raw[field]).__name__}")
    for field in ("name", "store"):
        if raw.get(field) is not None and not raw[field].strip():
            raise ConfigError(field, "is empty; leave the key out for the default "
                              + ("(the experiment name)" if field == "name" else "(results/<name>.zarr)"))
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
                 runner=runner, description=raw.get("description") or "", text=text, cases=cases, source=source)
    for cell in cfg.iter_cells():
        exp.check(cell)
    check_payload(cfg)
    return cfg


def check_address(address: str) -> None:
    """A Dask scheduler address must read protocol://host:port."""
    match = ADDRESS.match(address)
    if not match or not 1 <= int(match.group(3)) <= 65535:
        raise ConfigError("runner.address", f"{address!r} is not a scheduler address; allowed: "
                          "tcp://host:port (or tls://, ucx://, ws://, wss://), port 1-65535")


def check_payload(cfg: Config) -> None:
    """The sweep receives the config (text and parsed) as Prefect flow parameters, which Prefect
    caps in size: refuse here what the server would refuse after the store is made."""
    limit = int(os.environ.get("PREFECT_SERVER_API_MAX_PARAMETER_SIZE", PREFECT_PARAMETER_LIMIT))
    size = len(json.dumps(dict(cfg.to_dict(), _text=cfg.text), default=str).encode())
    if limit and size > limit * 0.9:  # 10% for the store path and Prefect's own fields
        raise ConfigError("<file>", f"the config makes {size:,} bytes of flow parameters; Prefect takes at most "
                          f"{int(limit * 0.9):,} here (PREFECT_SERVER_API_MAX_PARAMETER_SIZE); list fewer values")


def check_fits(cfg: Config) -> None:
    """Refuse a grid whose largest cell cannot fit in the memory of this machine (the workers of a
    local, inline or cuda cluster run here): the experiment's ``memory`` estimate against
    :func:`flows.bundles.memory_budget` with all of the free memory shared by the workers."""
    exp = cfg.exp
    if cfg.runner["cluster"] == "address" or not exp.memory_fields:
        return
    need, cell = max(((exp.memory(c), c) for c in cfg.iter_cells()), key=lambda t: t[0])
    from flows.bundles import memory_budget

    workers = cfg.runner["workers"] if cfg.runner["cluster"] in ("local", "inline") else 1
    have = memory_budget(cfg.runner["device"], workers, fraction=1.0)
    if need <= have:
        return
    fields = ", ".join(f"grid.{f}" if f in cfg.grid else f"params.{f}" for f in exp.memory_fields)
    sizes = ", ".join(f"{f}={cell[f]}" for f in exp.memory_fields)
    gib = 2.0**30
    raise ConfigError(fields, f"the largest cell ({sizes}) needs about {need / gib:,.1f} GiB, more than the "
                      f"{have / gib:,.1f} GiB free here for each of {workers} worker(s) (device "
                      f"{cfg.runner['device']}); make it smaller" + (" or use fewer runner.workers" if workers > 1 else ""))


def read_yaml(path: pathlib.Path) -> tuple[Any, str]:
    """The YAML document of a config file and its text; refuses a missing, oversized, binary or
    invalid file and a key given twice in one mapping (YAML would silently keep the last)."""
    if not path.is_file():
        raise ConfigError("<file>", f"no config file at {path}")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError("<file>", f"{path} is {size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,} bytes "
                          "(grid values are listed, cells are not)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError("<file>", f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                          f"{err.start}); a config is a YAML file") from None
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _no_duplicate_keys(node, "")
            raw = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError("<file>", f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    return raw, text


def _no_duplicate_keys(node: yaml.Node, path: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else "<key>"
            field = f"{path}.{name}" if path else name
            line = key.start_mark.line + 1
            if name in seen and name != "<<":
                raise ConfigError(field, f"given twice (lines {seen[name]} and {line}); give each key once")
            seen[name] = line
            _no_duplicate_keys(value, field)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_duplicate_keys(item, f"{path}[{i}]")


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
