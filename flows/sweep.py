"""The sweep flow: config -> grid -> bundles -> Dask -> tasks -> storage. Wiring only.

Each bundle (cells that share shapes) is one Prefect task run on a Dask worker. Prefect keeps no
results (nothing is pickled): the worker writes the bundle's numbers beside the store
(:mod:`flows.result_cache`, keyed on the cells, kernel code, device and versions, never the run
id), the flow process writes each finished cell's region and then its ``done`` flag and drops
the cached file, so a killed sweep resumes where it stopped and no cell is written twice. A
cell whose computation raises is stored as failed with its error; the others go on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib
import time

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from core.errors import UserError
from deploy import dask as dask_specs
from flows import checkpoint as checkpoint_io
from flows import config as config_mod
from flows import experiments
from flows import result_cache
from flows.bundles import make_bundles, memory_budget
from flows.progress import Progress
from storage.store import Store

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


FAILED = "__failed__"  # key of a cell's result when computing it raised: the error text


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


def compute_cells(exp, cells: list[dict], device: str, checkpoint: str | None) -> list[dict]:
    """The bundle's results; a cell whose computation raises becomes ``{FAILED: error}`` and the
    others are kept (issue 12 item 5). A failed bundle is split and its cells run one by one (a
    cell's numbers do not depend on its bundle mates, tests/test_bundle_invariance.py), so one bad
    cell does not take the others down. Transient errors (memory, I/O, bad input) propagate."""
    kw = {"checkpoint": checkpoint} if exp.checkpoints and checkpoint else {}
    try:
        return exp.run_bundle(cells, device, **kw)
    except _transient():
        raise
    except Exception as err:  # noqa: BLE001 - the kernel's own error: deterministic
        if len(cells) == 1:
            return [{FAILED: _describe(err)}]
    out = []
    for cell in cells:
        try:
            out.extend(exp.run_bundle([cell], device))
        except _transient():
            raise
        except Exception as err:  # noqa: BLE001
            out.append({FAILED: _describe(err)})
    return out


@task(name="run-bundle", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=1,
      retry_condition_fn=retry_unless_user_error)
def run_bundle(experiment: str, cells: list[dict], device: str, checkpoint: str | None = None,
               cache_path: str | None = None, cache_key: str | None = None) -> list[dict]:
    """Run one bundle of cells on this worker (one torch thread per worker process) and keep its
    results beside the store (:mod:`flows.result_cache`) until the flow has written them."""
    import torch

    torch.set_num_threads(1)
    results = compute_cells(experiments.get(experiment), cells, device, checkpoint)
    if cache_path:
        result_cache.save(cache_path, cache_key, results)
    return results


def bundle_id(experiment: str, cells: list[dict]) -> str:
    """Names a bundle's checkpoint: its cells and the kernels' code (a checkpoint of other code
    is never resumed)."""
    payload = json.dumps({"experiment": experiment, "cells": cells, "code": code_fingerprint()},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def plan(cfg: config_mod.Config, store: Store, force: bool, retry_failed: bool = False):
    """The cells still to compute, as (grid index, cell) pairs, and how many were done before
    (failed cells count as done unless ``retry_failed``).

    ``done`` is not trusted alone: arrays whose metadata is gone are re-created from the template,
    and done cells with a missing, corrupt or non-finite value (storage/verify.py) are marked not
    done, so they are recomputed and not counted as done before."""
    cells = cfg.cells()
    store.restore_arrays(cfg.exp, cfg.grid, cfg.exp.extra_dims(cells))
    store.mark_not_done(store.verify(cfg.exp).cells)
    done = store.done_mask().ravel()
    if retry_failed:
        done &= ~store.failed_mask().ravel()
    indices = store.cell_indices()
    todo = [(idx, cell) for idx, cell, d in zip(indices, cells, done) if force or not d]
    return todo, int(done.sum())


def open_store(cfg: config_mod.Config, store_path: str, device: str) -> Store:
    exp = cfg.exp
    store = Store(store_path, cfg.name)
    return store.open_or_create(exp, cfg.grid, cfg.params, cases=cfg.cases,
                                config_text=cfg.text or json.dumps(cfg.to_dict()),
                                extra_sizes=exp.extra_dims(cfg.cells()), device=device)


@flow(name="kktlab-sweep", log_prints=False, validate_parameters=False)
def sweep(config: dict, store: str, force: bool = False, retry_failed: bool = False) -> dict:
    """Run every pending cell of ``config`` (a validated config dict) into ``store``."""
    config = dict(config)
    text = config.pop("_text", "")
    return execute(config_mod.parse(config, text), store, force, retry_failed)


class _Writer:
    """Writes finished bundles into the store and keeps the run's counts."""

    def __init__(self, store: Store, stats: dict, progress: Progress, force: bool, retry_failed: bool):
        self.store, self.stats, self.progress = store, stats, progress
        self.kw = {"force": force, "replace_failed": retry_failed}

    def write(self, bundle, results: list[dict], *, cached: bool) -> None:
        for (idx, _), values in zip(bundle, results):
            if FAILED in values:
                ok = self.store.write_failed(idx, str(values[FAILED]), **self.kw)
                if ok:
                    self.stats["failed"] += 1
                    if len(self.stats["failures"]) < 5:
                        self.stats["failures"].append(f"{self.store.cell_label(idx)}: {values[FAILED]}")
            else:
                ok = self.store.write_cell(idx, values, **self.kw)
                self.stats["written"] += ok
            self.stats["refused_done"] += not ok
        self.stats["from_cache" if cached else "computed"] += len(bundle)
        self.progress.advance(len(bundle))


def execute(cfg: config_mod.Config, store_path: str, force: bool, retry_failed: bool = False) -> dict:
    t0 = time.perf_counter()
    device = cfg.runner["device"]
    store = open_store(cfg, store_path, device)
    todo, done_before = plan(cfg, store, force, retry_failed)
    total = len(cfg.cells())
    stats = {"group": cfg.name, "store": str(store_path), "total": total, "done_before": done_before,
             "computed": 0, "from_cache": 0, "written": 0, "failed": 0, "failures": [], "refused_done": 0,
             "bundles": 0}
    if not todo:
        stats["wall_s"] = time.perf_counter() - t0
        return stats
    budget = memory_budget(device, cfg.runner["workers"])
    bundles = make_bundles(cfg.exp, todo, cfg.runner["bundle_size"], memory_budget=budget,
                           workers=dask_specs.worker_count(cfg.runner))
    stats["bundles"] = len(bundles)
    writer = _Writer(store, stats, Progress(total, total - len(todo), cfg.name), force, retry_failed)
    task_fn = run_bundle.with_options(retries=cfg.runner["retries"])
    resources = dask_specs.resources_for(device)
    declared = set(cfg.exp.variables)
    futures = {}
    import dask

    with dask.annotate(**({"resources": resources} if resources else {})):
        for b in bundles:
            cells = [cell for _, cell in b]
            ckpt = checkpoint_io.path_for(store_path, cfg.name, bundle_id(cfg.experiment, cells))
            key = result_cache.bundle_key(cfg.experiment, cells, device, code_fingerprint())
            cpath = result_cache.path_for(store_path, cfg.name, key)
            cached = None if force else result_cache.load(cpath, key, len(cells), declared, FAILED)
            if cached is not None:  # computed by a run killed before it wrote them
                writer.write(b, cached, cached=True)
                result_cache.remove(cpath)
                checkpoint_io.remove(ckpt)
                continue
            fut = task_fn.submit(cfg.experiment, cells, device, ckpt if cfg.exp.checkpoints else None, cpath, key)
            futures[fut] = (b, ckpt, cpath)
    for fut in as_completed(list(futures)):
        bundle, ckpt, cpath = futures[fut]
        try:
            results = fut.result()
        except UserError as err:  # bad input: not retried
            cells = ", ".join(json.dumps(cell, default=str) for _, cell in bundle[:2])
            raise UserError(f"a bundle of {len(bundle)} cells failed on bad input ({err}); "
                            f"first cells: {cells}") from err
        writer.write(bundle, results, cached=False)
        result_cache.remove(cpath)
        checkpoint_io.remove(ckpt)
    stats["wall_s"] = time.perf_counter() - t0
    return stats


def run(cfg: config_mod.Config, store_path: str, force: bool = False, retry_failed: bool = False) -> dict:
    """Run a validated config on its task runner (the Prefect API must already be set)."""
    runner = dask_specs.task_runner(cfg.runner)
    raw = dict(cfg.to_dict(), _text=cfg.text)
    raw.pop("store")
    return sweep.with_options(task_runner=runner, flow_run_name=f"{cfg.name}")(raw, store_path, force, retry_failed)
