"""The sweep flow: config -> grid -> bundles -> Dask -> tasks -> storage. Wiring only.

Each bundle (cells that share shapes) is one Prefect task run on a Dask worker. Prefect keeps no
results (nothing is pickled) and no array leaves the worker: the worker writes its cells' regions
of the store (a chunk's cells are one bundle's, storage/blocks.py: one writer per chunk) and then a receipt beside the store
(:mod:`flows.result_cache`, keyed on the cells, kernel code, device and versions, never the run
id) and returns the receipt, a few numbers per cell; the flow process marks each cell ``done``
and drops the receipt, so a killed sweep resumes where it stopped and no cell is written twice.
A cluster of several machines needs the store on a filesystem every worker sees. A
cell whose computation raises is stored as failed with its error; the others go on.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import pathlib
import shutil
import sys

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from core.errors import UserError
from deploy import dask as dask_specs
from flows import bundles
from flows import config as config_mod
from flows import experiments
from flows import result_cache
from flows.result_cache import FAILED, NO_ROOM, ROOM_ERRNOS
from storage import consolidate
from storage.schema import UPSTREAM_HASH
from storage.store import Store

SHOWN_DAMAGED = 5  # damaged cells named when a run recomputes them (kktlab verify names them all)

ROOT = pathlib.Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the kernels and experiment definitions (the 'task source' of a bundle): every
    ``.py`` below ``tasks/``, ``core/`` and ``flows/experiments/``, recursively, with its path."""
    return tree_fingerprint(ROOT, ("tasks", "core", "flows/experiments"))


def tree_fingerprint(root: pathlib.Path, subdirs: tuple[str, ...]) -> str:
    """sha256 over (relative path, bytes) of every ``.py`` file below ``root/subdir``, sorted."""
    h = hashlib.sha256()
    for sub in subdirs:
        for f in sorted((root / sub).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(b"\0")
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def retry_unless_user_error(task, task_run, state) -> bool:
    """Retry bundles lost to transient causes: worker deaths and crashes (Dask/Prefect errors
    raised outside the kernel), memory and I/O errors. Errors the kernel raises on its own are
    deterministic: the task stores them as failed cells instead (:func:`compute_cells`)."""
    try:
        state.result()
    except UserError:
        return False
    except (MemoryError, OSError):
        return True
    except (ValueError, TypeError, KeyError, ArithmeticError, AssertionError):
        return False
    except BaseException:  # noqa: BLE001 - anything else (KilledWorker, comm errors, OOM) is retried
        return True
    return False


def _transient() -> tuple[type, ...]:
    import torch

    return (UserError, MemoryError, OSError, torch.cuda.OutOfMemoryError)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip().splitlines()[0][:500]


def compute_cells(exp, cells: list[dict], device: str, checkpoint: str | None, inputs=None) -> list[dict]:
    """The bundle's results; a cell whose computation raises becomes ``{FAILED: error}`` and the
    others are kept (issue 12 item 5). A failed bundle is split and its cells run one by one (a
    cell's numbers do not depend on its bundle mates, tests/test_bundle_invariance.py), so one bad
    cell does not take the others down. Transient errors (memory, I/O, bad input) propagate.
    ``inputs``: what a reading stage loaded from its upstream cells (storage.nets.Nets), one per cell."""
    kw = {"checkpoint": checkpoint} if exp.checkpoints and checkpoint else {}
    one = lambda i: {"inputs": inputs.select([i])} if inputs is not None else {}  # noqa: E731
    if inputs is not None:
        kw["inputs"] = inputs
    try:
        return exp.run_bundle(cells, device, **kw)
    except _transient():
        raise
    except Exception as err:  # noqa: BLE001 - the kernel's own error: deterministic
        if len(cells) == 1:
            return [{FAILED: _describe(err)}]
    out = []
    for i, cell in enumerate(cells):
        try:
            out.extend(exp.run_bundle([cell], device, **one(i)))
        except _transient():
            raise
        except Exception as err:  # noqa: BLE001
            out.append({FAILED: _describe(err)})
    return out


def compute_reading(exp, cells: list[dict], device: str, inputs: dict) -> list[dict]:
    """A reading stage's bundle: its upstream cells' nets are read from the store here, on the
    worker (never passed through the flow); a cell whose upstream cell is not usable (not done,
    failed, no nets stored) is failed with that reason, not computed. Each computed cell keeps the
    ``cell_hash`` of the upstream cell read with its nets (``upstream_hash``: storage/stale.py)."""
    indices = [tuple(i) for i in inputs["indices"]]
    nets = nets_at(inputs["store"], inputs["group"], indices)
    if exp.reads_before:  # the nets the upstream read: the pair before / after its deletion
        nets.before = load_before(inputs["store"], inputs["group"], indices, nets.problems)
    ok = [i for i, p in enumerate(nets.problems) if not p]
    out: list[dict] = [{FAILED: p} for p in nets.problems]
    cells = [exp.with_inherited(c, upc) for c, upc in zip(cells, nets.cells)]  # e.g. unlearn retrains with its upstream's lr
    if ok:
        first = bundles.same_input(exp, cells, ok, nets)
        uniq = sorted(set(first.values()))
        got = dict(zip(uniq, compute_cells(exp, [cells[i] for i in uniq], device, None, nets.select(uniq))))
        for i in ok:
            res = got[first[i]]
            out[i] = res if FAILED in res else dict(res, **{UPSTREAM_HASH: nets.hashes[i]})
    return out


def nets_at(store: str, group: str, indices: list[tuple[int, ...]]):
    """The stored nets of ``group`` at ``indices`` (rebuilt as their producer says), with each one's
    contract (what the net is) and cell as run (with what it inherited)."""
    from flows.contracts import cells_at, contracts_at
    from storage.nets import load_nets_at, producer

    nets = load_nets_at(store, group, indices, experiments.get(producer(store, group)).rebuild)
    nets.contracts = contracts_at(store, group, indices)
    nets.cells = cells_at(store, group, indices)
    return nets


def load_before(store: str, group: str, indices: list[tuple[int, ...]], problems: list[str]):
    """The nets the cells of ``group`` at ``indices`` read (its own upstream group, at the leading
    indices: a stage's dims are its upstream's followed by its own), for readers that compare a net
    before and after a stage (Experiment.reads_before). An unusable upstream cell becomes the problem
    of the cell that needs it."""
    from storage.nets import source

    up, n_up = source(store, group)
    if up is None:
        from core.errors import StoreError

        raise StoreError(f"group '{group}' of {store} read no earlier stage: there is no net before it")
    before = nets_at(store, up, [tuple(i)[:n_up] for i in indices])
    for i, p in enumerate(before.problems):
        if p and not problems[i]:
            problems[i] = f"the net before it: {p}"
    return before


def write_bundle(target: dict, results: list[dict]) -> list[dict]:
    """Write a computed bundle's cells into their regions of the store, on the worker that computed
    them (issue 13 item 5: arrays never travel back through Prefect or the flow), and return its
    receipts: per cell ``{HASH: content hash}`` (plus ``upstream_hash`` for a reading stage),
    ``{REFUSED: 1}`` when the cell is done already (never overwritten silently) or ``{FAILED: error}``
    (the flow records failures). ``target``: store, group, indices, force, replace_failed."""
    from storage.store import Store

    store = Store(target["store"], target["group"])
    kw = {"force": target.get("force", False), "replace_failed": target.get("replace_failed", False)}
    computed = [i for i, values in enumerate(results) if FAILED not in values]
    hashes = store.write_many([target["indices"][i] for i in computed], [results[i] for i in computed], **kw)
    out = [{FAILED: values[FAILED]} if FAILED in values else None for values in results]
    for i, h in zip(computed, hashes):
        out[i] = {result_cache.REFUSED: 1} if h is None else {result_cache.HASH: h}
        if h is not None and UPSTREAM_HASH in results[i]:
            out[i][UPSTREAM_HASH] = int(results[i][UPSTREAM_HASH])
    return out


@task(name="run-bundle", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=1,
      retry_condition_fn=retry_unless_user_error)
def run_bundle(experiment: str, cells: list[dict], device: str, checkpoint: str | None = None,
               cache_path: str | None = None, cache_key: str | None = None, inputs: dict | None = None,
               target: dict | None = None) -> list[dict]:
    """Run one bundle of cells on this worker (one torch thread per worker process), write its
    cells into the store (``target``, :func:`write_bundle`) and keep its receipts beside the store
    (:mod:`flows.result_cache`) until the flow has marked the cells done; return the receipts (a few
    numbers per cell). ``inputs`` (a reading stage): the store, group and grid indices of its
    upstream cells. Without ``target`` the results themselves are returned (tests, benchmarks)."""
    import torch

    torch.set_num_threads(1)
    exp = experiments.get(experiment)
    wait_at_gate()
    if target and _free_bytes(target["store"]) < MIN_FREE:  # a full disk: nothing to compute for
        return [{NO_ROOM: os.strerror(errno.ENOSPC)}] * len(cells)
    try:
        from flows.bundle_progress import reporting  # issue 30: the bundle's progress file, its cancel check

        with reporting(target, cache_key, cells=len(cells)):
            results = (compute_reading(exp, cells, device, inputs) if inputs
                       else compute_cells(exp, cells, device, checkpoint))
        if target:
            results = write_bundle(target, results)
        if cache_path:
            result_cache.save(cache_path, cache_key, results, target["indices"] if target else None)
    except OSError as err:  # the store's file system refused (full, quota, read-only): the flow stops
        if err.errno not in ROOM_ERRNOS:
            raise
        return [{NO_ROOM: os.strerror(err.errno)}] * len(cells)
    return results


GATE_ENV = "KKTLAB_GATE"


def wait_at_gate(poll_s: float = 0.05) -> None:
    """``$KKTLAB_GATE`` names a file: while it exists, every bundle of the run waits here before it
    computes, after creating ``<file>.reached``, and creates ``<file>.passed`` once let through. How a
    test (or an operator) holds a run at a point it controls (to kill it, refuse a second run, cancel it,
    kill its worker) and lets it go by deleting the file; unset, nothing waits."""
    gate = os.environ.get(GATE_ENV)
    if not gate or not os.path.exists(gate):
        return
    import time

    pathlib.Path(gate + ".reached").touch()
    while os.path.exists(gate):
        time.sleep(poll_s)
    pathlib.Path(gate + ".passed").touch()


# A bundle whose writes the file system refused returns the receipt NO_ROOM (flows/result_cache.py).
MIN_FREE = 1 << 20  # bytes free beside the store below which a bundle is not computed


def _free_bytes(store: str) -> int:
    path = pathlib.Path(store)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def refused_room(stats: list[dict], store: str) -> None:
    """Raise the one line of a run the store's file system stopped, if it did."""
    why = next((s["no_room"] for s in stats if s.get("no_room")), None)
    if why:
        done = ", ".join(f"{s['group']}: {s.get('done_before', 0) + s['written']}/{s['total']}" for s in stats)
        raise UserError(f"the file system of store {store} refused a write ({why.lower()}); free space there (or "
                        f"make it writable) and rerun the same command: it resumes (cells stored: {done})")


def bundle_id(experiment: str, cells: list[dict]) -> str:
    """Names a bundle's checkpoint: its cells and the kernels' code (a checkpoint of other code
    is never resumed)."""
    payload = json.dumps({"experiment": experiment, "cells": cells, "code": code_fingerprint()},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def plan(cfg: config_mod.Config, store: Store, force: bool, retry_failed: bool = False, stats: dict | None = None):
    """The cells still to compute, as (grid index, cell) pairs, and how many were done before
    (failed cells count as done unless ``retry_failed``).

    ``done`` is not trusted alone: arrays whose metadata is gone are re-created from the template,
    and done cells with a missing, corrupt or non-finite value (storage/verify.py) are marked not
    done, so they are recomputed and not counted as done before. So are the stale cells of a
    reading stage (they read an upstream cell that has changed since, storage/stale.py): their
    count goes to ``stats["stale_recomputed"]``."""
    from storage.stale import stale_cells

    cells = cfg.store_cells()
    restored = store.restore_arrays(cfg.exp, cfg.store_grid, cfg.extra_sizes())
    if restored:
        print(f"[kktlab] {store.path}: re-created damaged arrays from the template: {', '.join(restored)} "
              f"(group '{cfg.name}')", file=sys.stderr)
    report = store.verify(cfg.exp)
    if report.damaged:
        print(f"[kktlab] {report.damaged} done cells of '{cfg.name}' are damaged; they are recomputed:", file=sys.stderr)
        print("\n".join(report.lines(SHOWN_DAMAGED)), file=sys.stderr)
    store.mark_not_done(report.cells)
    stale = store.mark_not_done(stale_cells(store.path, store.group_name).cells)
    if stats is not None:
        stats["stale_recomputed"], stats["damaged_recomputed"] = stale, report.damaged
    done = store.done_mask().ravel()
    if retry_failed:
        done &= ~store.failed_mask().ravel()
    indices = store.cell_indices()
    todo = [(idx, cell) for idx, cell, d in zip(indices, cells, done) if force or not d]
    return todo, int(done.sum())


def open_stores(stages: list, store_path: str) -> list[Store]:
    """The store group of every stage of a chain, in order, a reading stage's chunked within its
    upstream group's block (:func:`open_store`), as the run opens them."""
    opened: dict[str, Store] = {}
    for stage in stages:
        up_block = opened[stage.source].block() if stage.source else None
        opened[stage.name] = open_store(stage, store_path, stage.runner["device"], up_block)
    return list(opened.values())


def open_store(cfg: config_mod.Config, store_path: str, device: str, up_block: tuple | None = None) -> Store:
    """The store group of one stage (dims: its upstream's, then its own axes), made from the
    template if new, chunked by blocks of cells (``up_block``: its upstream group's block, for a
    reading stage: flows/bundles.py::block_for)."""
    exp = cfg.exp
    consolidate.invalidate(store_path)  # a run changes the store: no stale consolidated view (storage/consolidate.py)
    store = Store(store_path, cfg.name)
    from flows.bundles import block_for

    new = not (pathlib.Path(store_path) / cfg.name / "zarr.json").is_file()
    return store.open_or_create(exp, cfg.store_grid, cfg.params, cases=cfg.cases, source=cfg.source,
                                config_text=cfg.text or json.dumps(cfg.to_dict()),
                                extra_sizes=cfg.extra_sizes(), device=used_device(device),
                                block=block_for(cfg, up_block) if new else None)


def used_device(requested: str) -> str:
    """The device the kernels run on, for the group's provenance (never ``auto``): where the flow runs,
    which for local and cuda clusters is where the workers run (as flows/bundles.py::memory_budget)."""
    import torch

    if requested in ("cuda", "auto") and torch.cuda.is_available():
        used = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        used = "cpu"
    return used if requested in ("cpu", "cuda") else f"{used} (requested: {requested})"


@flow(name="kktlab-sweep", log_prints=False, validate_parameters=False)
def sweep(config: dict, store: str, force: bool = False, retry_failed: bool = False):
    """Run every pending cell of ``config`` (a validated config dict) into ``store``: every stage
    of a chain in this one flow run. Returns the run's counts (a list, one per stage, for a chain)."""
    config = dict(config)
    text = config.pop("_text", "")
    cfg = config_mod.parse(config, text)
    from flows.liveness import guard
    from flows.progress import announce

    try:  # guard: marked Crashed while alive (its heartbeats lost in an outage), the run sets itself Running
        with guard(), dask_specs.on_dashboard(lambda url: announce(f"Dask dashboard: {url}")):  # once, when it starts
            stats = execute_chain(cfg.stages, store, force, retry_failed)
    finally:
        from flows.progress import flush_logs

        flush_logs()  # the progress lines reach the server before an embedded one stops
    return stats if "stages" in config else stats[0]


def execute(cfg: config_mod.Config, store_path: str, force: bool, retry_failed: bool = False) -> dict:
    """One experiment (a chain of one)."""
    return execute_chain([cfg], store_path, force, retry_failed)[0]


def execute_chain(stages: list[config_mod.Config], store_path: str, force: bool,
                  retry_failed: bool = False) -> list[dict]:
    """Every stage in order, in this flow run: see :class:`flows.chain.Scheduler`."""
    from flows.chain import Scheduler

    return Scheduler(stages, store_path, force, retry_failed).run()


def run(cfg, store_path: str, force: bool = False, retry_failed: bool = False, wait: bool = False):
    """Run a validated config (a Config: its counts; a Chain: a list of counts, one per stage) on
    its task runner, in one flow run (the Prefect API must already be set).

    Its groups are made (or checked) first, then the run lock of each is taken (storage/runlock.py)
    and held until the flow run ends, whatever the way out: another run computing one of them
    refuses this one in one line naming it, before any flow run or cluster starts, or, with
    ``wait`` (``kktlab run --wait``), is waited for, and this run then skips the cells it stored."""
    from deploy import settings_once, tls_context
    from storage import runlock

    store_path = os.path.abspath(store_path)  # the workers' folder is not ours (`make dask-worker`, a cluster's)

    tls_context.install()  # this process's Prefect clients share one TLS context (its workers': their preload)
    settings_once.install()  # and its settings are serialized once, not once per bundle submitted
    runner = dask_specs.task_runner(cfg.runner)
    raw = dict(cfg.to_dict(), _text=cfg.text)
    raw.pop("store")
    one_run = sweep.with_options(task_runner=runner, flow_run_name=f"{cfg.name}")
    open_stores(cfg.stages, store_path)
    with runlock.hold(store_path, [stage.name for stage in cfg.stages], wait=wait):
        out = one_run(raw, store_path, force, retry_failed)
    refused_room(out if isinstance(out, list) else [out], store_path)
    return out
