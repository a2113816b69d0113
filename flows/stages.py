"""Configs with stages: experiments that read what an earlier stage of the same store produced.

```yaml
name: chain-small               # shared: the flow run's name
store: results/chain.zarr       # shared: one store, one group per stage (the stage's name)
runner: {workers: 2}            # shared
stages:
  - name: nets
    experiment: train           # produces ("nets",)
    grid: {d: [25, 50], seed: [0, 1, 2]}
    params: {width: 64}
  - name: robustness
    experiment: universal_attack   # reads "nets"
    from: nets
    grid: {attack: [margin_direction, random_direction]}
```

Each stage is a :class:`flows.config.Config` (its ``name`` is its store group) parsed as a
config of its own; the chain adds what links them: a stage's group has the dims of the stage it
reads ``from`` followed by its own grid axes, so each of its cells names the upstream cell it
used. Validated before any work, one line naming the field: ``from`` naming no earlier stage
(missing, later, itself: so no cycle can be written), two stages with one name, a grid axis that
is also an axis of the upstream, an experiment that does not read what its upstream produces,
a stage that reads from one that stores nothing (``store_nets: false``), a reader whose nets
contract the upstream's cannot meet, an index into the upstream's training set past its size.

A config without ``stages`` is a chain of one whose group is its ``name`` (nothing changes).
A stage may give ``cases`` beside its grid (``{axis: [case, ...]}``): cases appended to that
grid axis, as if written in the grid.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from core.errors import ConfigError
from flows import config as config_mod
from flows import contracts
from flows import experiments

CHAIN_KEYS = ("name", "description", "store", "runner", "stages")
STAGE_KEYS = ("name", "experiment", "grid", "params", "cases", "from")


@dataclasses.dataclass
class Chain:
    """Validated stages in run order (every stage after the stage it reads from)."""

    name: str
    store: str | None
    runner: dict[str, Any]
    stages: list[config_mod.Config]
    description: str = ""
    text: str = ""

    def store_path(self, override: str | None = None) -> str:
        return override or self.store or config_mod.DEFAULT_STORE.format(name=self.name)

    @property
    def n_cells(self) -> int:
        return sum(s.n_cells for s in self.stages)

    def stage(self, name: str) -> config_mod.Config:
        return next(s for s in self.stages if s.name == name)

    def to_dict(self) -> dict:
        out = []
        for s in self.stages:
            d = s.to_dict()
            stage = {"name": s.name, "experiment": s.experiment, "grid": d["grid"], "params": d["params"]}
            if s.source:
                stage["from"] = s.source
            out.append(stage)
        return {"name": self.name, "store": self.store, "runner": self.runner, "description": self.description,
                "stages": out}


def parse_chain(raw: dict, text: str = "") -> Chain:
    for key in raw:
        if key not in CHAIN_KEYS:
            hint = " (give it per stage)" if key in ("experiment", "grid", "params") else ""
            raise ConfigError(str(key), f"unknown key beside 'stages'{hint}; allowed: {', '.join(CHAIN_KEYS)}")
    raw_stages = raw["stages"]
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ConfigError("stages", "expected a non-empty list of stages (each: name, experiment, grid, params, "
                          "optional cases and from)")
    for field in ("name", "store", "description"):
        if raw.get(field) is not None and not isinstance(raw[field], str):
            raise ConfigError(field, f"expected a string, got {type(raw[field]).__name__}")
        if field != "description" and raw.get(field) is not None and not raw[field].strip():
            raise ConfigError(field, "is empty; leave the key out for the default")
    name = raw.get("name") or "chain"
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError("name", f"{name!r}: use letters, digits, '-' and '_' only")
    stages: list[config_mod.Config] = []
    for i, st in enumerate(raw_stages):
        stages.append(_stage(i, st, raw, stages))
    runner = stages[0].runner
    total = sum(s.n_cells for s in stages)
    if total > runner["max_cells"]:
        sizes = ", ".join(f"{s.name} {s.n_cells:,}" for s in stages)
        raise ConfigError("stages", f"{total:,} cells ({sizes}) is more than the limit of {runner['max_cells']:,} "
                          f"(runner.max_cells); pass --max-cells {total} if you mean it")
    for s in stages:
        s.text = text  # provenance: every group keeps the whole chain's config
    chain = Chain(name=name, store=raw.get("store"), runner=runner, stages=stages,
                  description=raw.get("description") or "", text=text)
    config_mod.check_payload(chain)
    return chain


def _stage(i: int, st: Any, raw: dict, earlier: list[config_mod.Config]) -> config_mod.Config:
    f = f"stages[{i}]"
    if not isinstance(st, dict):
        raise ConfigError(f, f"expected a mapping with keys {', '.join(STAGE_KEYS)}, got {type(st).__name__}")
    for key in st:
        if key not in STAGE_KEYS:
            raise ConfigError(f"{f}.{key}", f"unknown key of a stage; allowed: {', '.join(STAGE_KEYS)}")
    name = st.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{f}.name", "missing: every stage needs a name (its store group)")
    if any(s.name == name for s in earlier):
        raise ConfigError(f"{f}.name", f"{name!r} names two stages; give each stage its own name")
    grid = dict(config_mod._mapping(f"{f}.grid", st.get("grid")))
    for axis, extra in config_mod._mapping(f"{f}.cases", st.get("cases")).items():
        if not isinstance(extra, list):
            raise ConfigError(f"{f}.cases.{axis}", "expected a list of cases (mappings)")
        grid[axis] = list(grid.get(axis) or []) + extra
    one = {"experiment": st.get("experiment"), "name": name, "grid": grid, "params": st.get("params"),
           "runner": raw.get("runner")}
    source = st.get("from")
    if source is not None:
        up = _upstream(f, name, source, earlier, raw)
        if st.get("experiment") in experiments.names():
            _reads(f, experiments.get(st["experiment"]), source, up)
        up_grid = up.store_grid
        for axis in grid:
            if axis in up_grid:
                raise ConfigError(f"{f}.grid.{axis}", f"is also an axis of stage {source!r} (its cells' dims come "
                                  "first in this stage's group); name each axis in one stage only")
    try:
        cfg = config_mod.parse_one(one, source=source)
    except ConfigError as err:
        raise ConfigError(f"{f}.{err.field}", err.message) from None
    exp = cfg.exp
    if source is None:
        if exp.reads:
            raise ConfigError(f"{f}.from", f"experiment '{exp.name}' reads {exp.reads!r} from an earlier stage; "
                              "name it in 'from'")
        cfg.nets_contracts = contracts.stage_contracts(cfg, None)
        return cfg
    up = _upstream(f, name, source, earlier, raw)
    _reads(f, exp, source, up)
    contracts.check_pairing(f"{f}.from", cfg, source, up.nets_contracts)
    contracts.check_points(f, cfg, source, up)
    cfg.nets_contracts = contracts.stage_contracts(cfg, up.nets_contracts)
    _inherited(f, st, cfg, source, up)
    cfg.upstream_grid = dict(up.store_grid)
    cfg.upstream_extra = up.extra_sizes()
    if math.prod(len(v) for v in cfg.store_grid.values()) > cfg.runner["max_cells"]:
        raise ConfigError(f"{f}.grid", f"{cfg.n_cells:,} cells (the cells of {source!r} x this grid) is more than "
                          f"the limit of {cfg.runner['max_cells']:,} (runner.max_cells)")
    return cfg


def _inherited(f: str, st: dict, cfg: config_mod.Config, source: str, up: config_mod.Config) -> None:
    """A parameter the stage takes from its upstream cells (Experiment.inherits) is set there only:
    two values for one thing would be one silently overridden. It leaves the stage's own params (and
    so its group's identity): each cell gets the upstream cell's value on the worker."""
    for mine, theirs in cfg.exp.inherits.items():
        if theirs not in up.exp.params:
            continue
        where = [f"{part}.{mine}" for part in ("params", "grid") if mine in (st.get(part) or {})]
        where += [f"grid.{axis}" for axis, by_value in cfg.cases.items() if any(mine in o for o in by_value.values())]
        if where:
            raise ConfigError(f"{f}.{where[0]}", f"sets {mine!r}, which is taken from each cell of stage {source!r} "
                              f"(its {theirs!r}, experiment '{up.exp.name}'); set {theirs!r} there, not here")
        cfg.params.pop(mine, None)


def _reads(f: str, exp, source: str, up: config_mod.Config) -> None:
    """Can ``exp`` read what stage ``up`` produces?"""
    if not exp.reads:
        raise ConfigError(f"{f}.from", f"experiment '{exp.name}' reads nothing from another stage; "
                          "leave 'from' out")
    if exp.reads not in up.exp.produces:
        made = ", ".join(map(repr, up.exp.produces)) or "nothing"
        raise ConfigError(f"{f}.from", f"experiment '{exp.name}' reads {exp.reads!r}, stage {source!r} "
                          f"(experiment '{up.exp.name}') produces {made}")
    if up.params.get("store_nets") is False:
        raise ConfigError(f"{f}.from", f"stage {source!r} has store_nets: false, so it stores no nets to read")
    if exp.reads_before and up.source is None:
        raise ConfigError(f"{f}.from", f"experiment '{exp.name}' compares each net before and after stage "
                          f"{source!r}, which reads no earlier stage (no net before it); read an unlearn stage")


def _upstream(f: str, name: str, source: Any, earlier: list[config_mod.Config], raw: dict) -> config_mod.Config:
    """The earlier stage ``from`` names; any other name (a later stage, this one: a cycle, or none) is an error."""
    if not isinstance(source, str):
        raise ConfigError(f"{f}.from", f"expected a stage name, got {type(source).__name__}")
    for s in earlier:
        if s.name == source:
            return s
    names = [s.get("name") for s in raw["stages"] if isinstance(s, dict)]
    if source == name:
        why = "is this stage itself (a cycle)"
    elif source in names:
        why = "comes later in 'stages' (a stage reads only from an earlier one, so stages cannot form a cycle)"
    else:
        why = "names no stage"
    allowed = ", ".join(repr(s.name) for s in earlier) or "none (this is the first stage)"
    raise ConfigError(f"{f}.from", f"{source!r} {why}; allowed: {allowed}")
