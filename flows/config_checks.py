"""Checks of a parsed config beyond its fields' own types and bounds (flows/config.py): the data
files it reads, the Dask address, the payload Prefect carries, the memory of its largest cell, the
stages' groups; each one line naming the field."""

from __future__ import annotations

import json
import os

from core.errors import ConfigError
from flows.config import ADDRESS, PREFECT_PARAMETER_LIMIT, Config, _show


def field_of(cfg: Config, key: str, cell: dict | None = None) -> str:
    """Where the config sets parameter ``key`` (of ``cell``): ``grid.key``, the case that set it
    (``grid.axis[i].key``) or ``params.key``."""
    if key in cfg.grid:
        return f"grid.{key}"
    for axis, by_value in cfg.cases.items():
        if cell is not None and key in by_value.get(cell[axis], {}):
            return f"grid.{axis}[{cfg.grid[axis].index(cell[axis])}].{key}"
    return f"params.{key}"


def check_data(cfg: Config) -> None:
    """The files of every real data set the cells train on (a ``data`` parameter naming one,
    storage/datasets.py DATA_SETS) are present and match their checksums: a missing or corrupt file
    is refused here, naming it and the field, not on a worker after the store is made."""
    if "data" not in cfg.exp.params:
        return
    from storage import datasets

    seen = set()
    for cell in cfg.iter_cells():
        value = cell["data"]
        if value in seen or value not in datasets.DATA_SETS:
            continue
        seen.add(value)
        try:
            datasets.check_data(value)
        except datasets.DataError as err:
            raise ConfigError(field_of(cfg, "data", cell), f"{value!r}: {err}") from None


def check_address(address: str) -> None:
    """A Dask scheduler address must read protocol://host:port."""
    match = ADDRESS.match(address)
    if not match or not 1 <= int(match.group(3)) <= 65535:
        raise ConfigError("runner.address", f"{_show(address)} is not a scheduler address; allowed: "
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


def check_device(runner: dict) -> None:
    """``device: cuda`` on a cluster whose workers run here (local, inline, cuda) needs a CUDA GPU here:
    without one its bundles, annotated for GPU workers, would wait forever (issue 42). A scheduler
    (``address``) may have GPU workers elsewhere, or get them later: not refused."""
    if runner["device"] != "cuda" or runner["cluster"] == "address":
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("runner.device", f"cuda, but no CUDA GPU is visible here (torch.cuda.is_available() is "
                          f"False) and runner.cluster {runner['cluster']!r} runs its workers here; use device: auto "
                          "or cpu, or a scheduler with GPU workers (runner.cluster: address)")


def check_stages(cfg) -> None:
    """:func:`check_device`, then :func:`check_fits` for every stage of ``cfg`` (a Config, or a chain of
    flows/stages.py), each field named as the file names it (``stages[i].params.m`` in a chain)."""
    check_device(cfg.runner)
    for i, stage in enumerate(cfg.stages):
        try:
            check_fits(stage)
        except ConfigError as err:
            if isinstance(cfg, Config):
                raise
            raise ConfigError(", ".join(f"stages[{i}].{f}" for f in err.field.split(", ")), err.message) from None


# The keywords of xarray's Dataset.sel / isel / DataArray.sel (tests/test_exports.py checks the list against
# xarray): a dim of that name cannot be selected with ds.sel(name=...) (``method`` picks an inexact-match
# rule instead, and ds.sel(method="ga") returned every method). Refused as grid axes. unlearn's and
# single_step's ``method`` were renamed (issue 40); stores made before are read with the new names
# (storage/schema.py current_dims).
SEL_KEYWORDS = ("drop", "indexers", "method", "missing_dims", "tolerance")
RENAMED = {("unlearn", "method"): "unlearn_method", ("single_step", "method"): "single_step_method"}


def check_renamed(field: str, experiment: str, key: str) -> None:
    """A parameter renamed since (:data:`RENAMED`) is refused with its new name, in the grid or params."""
    if (experiment, key) in RENAMED:
        raise ConfigError(field, f"renamed '{RENAMED[experiment, key]}' (issue 40: an axis named '{key}' cannot be "
                                 f"selected with ds.sel({key}=...), a keyword of xarray's Dataset.sel)")


def check_axis_name(field: str, experiment: str, key: str) -> None:
    """A grid axis named like a keyword of ``Dataset.sel`` is refused."""
    if key in SEL_KEYWORDS:
        raise ConfigError(field, f"a grid axis may not be named like a keyword of xarray's Dataset.sel / isel "
                                 f"({', '.join(SEL_KEYWORDS)}): ds.sel({key}=...) would not select on it; "
                                 f"name the parameter e.g. '{experiment}_{key}'")
