"""The nets contract between stages (core.declare.NetsContract / NetsNeeds), wired: checked at
config time for every (producer cell, reader cell) pairing a chain can make, and resolved per
upstream cell on the worker, so every reader takes the parametrisation (trained blocks, output
layer, bias, forgotten points) from the producer's declaration rather than guessing it.

A producer's contract may depend on its cell (paper 003: the bias by variant) and on the contract
of the cell it read (``unlearn`` hands on its upstream's nets plus the forgotten points), so
contracts are resolved along the chain, first stage first.
"""

from __future__ import annotations

import json

from core.declare import NetsContract
from core.errors import ConfigError
from flows import experiments


def stage_contracts(cfg, upstream: set | None) -> set:
    """Every contract the cells of producing stage ``cfg`` can have (``upstream``: its upstream
    stage's contracts, None for a first stage)."""
    nets = cfg.exp.nets
    if nets is None:
        return set()
    ups = upstream or {None}
    return {nets(cell, up) for cell in unique_cells(cfg) for up in ups}


def unique_cells(cfg) -> list[dict]:
    """The distinct cells of a stage's own grid (a contract or a need depends on a cell's params only)."""
    seen, out = set(), []
    for cell in cfg.iter_cells():
        key = repr(sorted(cell.items()))
        if key not in seen:
            seen.add(key)
            out.append(cell)
    return out


def check_pairing(field: str, cfg, source: str, contracts: set) -> None:
    """Refuse, naming ``field``, a reading stage any of whose cells cannot read some upstream cell."""
    needs = {cfg.exp.needs(cell) for cell in unique_cells(cfg)}
    for need in sorted(needs, key=repr):
        for c in sorted(contracts, key=repr):
            why = need.refusal(c)
            if why:
                raise ConfigError(field, f"experiment '{cfg.exp.name}' cannot read stage {source!r}: it {why}")


def check_points(f: str, cfg, source: str, up) -> None:
    """Refuse, naming the field (``stages[i].params.forget``), a reading stage a cell of which
    indexes the upstream's training set past the smallest m of the upstream's cells
    (Experiment.points / check_points): caught here, before the upstream trains, not after it."""
    if cfg.exp.check_points is None or up.exp.points is None:
        return
    sizes = {up.exp.points(c) for c in unique_cells(up)} - {None}
    if not sizes:
        return
    m = min(sizes)
    for cell in unique_cells(cfg):
        bad = cfg.exp.check_points(cell, m)
        if bad:
            from flows.config_checks import field_of

            key, why = bad
            upstream = f"upstream {source!r} with m = {m}" + (" at its smallest" if len(sizes) > 1 else "")
            raise ConfigError(f"{f}.{field_of(cfg, key, cell)}", f"{cell[key]} {why.format(upstream=upstream)}")


def cells_at(store: str, group: str, indices: list[tuple[int, ...]]) -> list[dict]:
    """The cells of ``group`` at grid ``indices`` as they were run (storage.nets.cells_as_run), with
    the parameters they took from their own upstream cells (Experiment.inherits: e.g. an unlearn cell's
    loss is its train_kkt cell's), resolved along the chain."""
    import pathlib

    import zarr

    from storage.nets import cells_as_run, producer, source

    g = zarr.open_group(str(pathlib.Path(store) / group), mode="r", zarr_format=3)
    cells = cells_as_run(g, indices)
    exp = experiments.get(producer(store, group))
    up, n_up = source(store, group)
    if up is None or not exp.inherits:
        return cells
    ups = cells_at(store, up, [tuple(i)[:n_up] for i in indices])
    return [exp.with_inherited(c, u) for c, u in zip(cells, ups)]


def check_nets_arrays(store: str, group: str, exp) -> None:
    """Refuse, in one line naming the attribute and the group, nets whose group attribute
    ``kktlab_nets_arrays`` (what a reader loads beside them: storage/nets.py) is damaged or says
    otherwise than ``exp``'s declaration (``Experiment.nets_arrays``), their producer's: a reader
    never acts on an attribute nothing has checked (issue 40: one without ``forgotten`` made a
    reader treat the forgotten point as retained). A group made before the attribute is read as
    it always was."""
    import pathlib

    import zarr

    from core.errors import StoreError
    from storage import schema
    from storage.nets import nets_arrays

    g = zarr.open_group(str(pathlib.Path(store) / group), mode="r", zarr_format=3)
    if schema.NETS_ARRAYS not in g.attrs and schema.NETS_ARRAYS_CRC not in g.attrs:
        return
    stored, declared = nets_arrays(g, f"group '{group}' of {store}"), {k: tuple(v) for k, v in exp.nets_arrays.items()}
    if stored != declared:
        show = lambda m: json.dumps({k: list(v) for k, v in m.items()}, sort_keys=True)  # noqa: E731
        raise StoreError(f"group '{group}' of {store}: attribute {schema.NETS_ARRAYS} {show(stored)} is not what "
                         f"its producer '{exp.name}' declares ({show(declared)}); `kktlab verify {store}` names it, "
                         "`kktlab run` on its config restores it")


def contracts_at(store: str, group: str, indices: list[tuple[int, ...]]) -> list[NetsContract]:
    """The contract of each stored cell of ``group`` at grid ``indices``, resolved along the chain
    from the cells as they were run (storage.nets.cells_as_run), each group's ``kktlab_nets_arrays``
    checked against its producer's declaration first (:func:`check_nets_arrays`)."""
    from storage.nets import producer, source

    exp = experiments.get(producer(store, group))
    check_nets_arrays(store, group, exp)
    if exp.nets is None:
        return []
    cells = cells_at(store, group, indices)
    up, n_up = source(store, group)
    if up is None:
        return [exp.nets(c, None) for c in cells]
    ups = contracts_at(store, up, [tuple(i)[:n_up] for i in indices])
    return [exp.nets(c, u) for c, u in zip(cells, ups or [None] * len(cells))]
