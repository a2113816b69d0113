"""The sweep flow: config -> grid -> bundles -> Dask -> tasks -> storage. Wiring only.

Each bundle (cells that share shapes) is one Prefect task run on a Dask worker. Its cache key
is the bundle's scalar parameters plus the source of the kernels it runs, never the run id or
tensors. The flow process writes each finished cell's region and then its ``done`` flag, so a
killed sweep resumes where it stopped and no cell is written twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib
import time

from prefect import flow, task
from prefect.futures import as_completed

from core.errors import UserError
from deploy import dask as dask_specs
from flows import checkpoint as checkpoint_io
from flows import config as config_mod
from flows import experiments
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


def bundle_cache_key(context, parameters) -> str:
    payload = json.dumps({"experiment": parameters["experiment"], "cells": parameters["cells"],
                          "device": parameters["device"], "code": code_fingerprint()}, sort_keys=True)
    return "kktlab-bundle-" + hashlib.sha256(payload.encode()).hexdigest()


def retry_unless_user_error(task, task_run, state) -> bool:
    """Retry bundles lost to worker deaths or crashes, never ones that failed on bad input."""
    try:
        state.result()
    except (UserError, ValueError, TypeError, KeyError):
        return False
    except BaseException:  # noqa: BLE001 - anything else (KilledWorker, OOM, comm errors) is retried
        return True
    return False


@task(name="run-bundle", cache_key_fn=bundle_cache_key, persist_result=True, retries=2,
      retry_delay_seconds=1, retry_condition_fn=retry_unless_user_error)
def run_bundle(experiment: str, cells: list[dict], device: str, checkpoint: str | None = None) -> list[dict]:
    """Run one bundle of cells on this worker (one torch thread per worker process)."""
    import torch

    torch.set_num_threads(1)
    exp = experiments.get(experiment)
    if exp.checkpoints and checkpoint:
        return exp.run_bundle(cells, device, checkpoint=checkpoint)
    return exp.run_bundle(cells, device)


def bundle_id(experiment: str, cells: list[dict]) -> str:
    """Names a bundle's checkpoint: its cells and the kernels' code (a checkpoint of other code
    is never resumed)."""
    payload = json.dumps({"experiment": experiment, "cells": cells, "code": code_fingerprint()},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def plan(cfg: config_mod.Config, store: Store, force: bool):
    """The cells still to compute, as (grid index, cell) pairs, and how many were done before.

    ``done`` is not trusted alone: arrays whose metadata is gone are re-created from the template,
    and done cells with a missing, corrupt or non-finite value (storage/verify.py) are marked not
    done, so they are recomputed and not counted as done before."""
    cells = cfg.cells()
    store.restore_arrays(cfg.exp, cfg.grid, cfg.exp.extra_dims(cells))
    store.mark_not_done(store.verify(cfg.exp).cells)
    done = store.done_mask().ravel()
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
def sweep(config: dict, store: str, force: bool = False) -> dict:
    """Run every pending cell of ``config`` (a validated config dict) into ``store``."""
    config = dict(config)
    text = config.pop("_text", "")
    return execute(config_mod.parse(config, text), store, force)


def execute(cfg: config_mod.Config, store_path: str, force: bool) -> dict:
    t0 = time.perf_counter()
    device = cfg.runner["device"]
    store = open_store(cfg, store_path, device)
    todo, done_before = plan(cfg, store, force)
    total = len(cfg.cells())
    stats = {"group": cfg.name, "store": str(store_path), "total": total, "done_before": done_before,
             "computed": 0, "written": 0, "refused_done": 0, "bundles": 0}
    if not todo:
        stats["wall_s"] = time.perf_counter() - t0
        return stats
    budget = memory_budget(device, cfg.runner["workers"])
    bundles = make_bundles(cfg.exp, todo, cfg.runner["bundle_size"], memory_budget=budget,
                           workers=dask_specs.worker_count(cfg.runner))
    stats["bundles"] = len(bundles)
    progress = Progress(total, total - len(todo), cfg.name)
    task_fn = run_bundle.with_options(retries=cfg.runner["retries"], refresh_cache=force)
    resources = dask_specs.resources_for(device)
    futures = {}
    import dask

    with dask.annotate(**({"resources": resources} if resources else {})):
        for b in bundles:
            cells = [cell for _, cell in b]
            ckpt = checkpoint_io.path_for(store_path, cfg.name, bundle_id(cfg.experiment, cells))
            fut = task_fn.submit(cfg.experiment, cells, device, ckpt if cfg.exp.checkpoints else None)
            futures[fut] = (b, ckpt)
    for fut in as_completed(list(futures)):
        bundle, ckpt = futures[fut]
        try:
            results = fut.result()
        except (ValueError, TypeError, KeyError, UserError) as err:  # bad input: not retried
            cells = ", ".join(json.dumps(cell, default=str) for _, cell in bundle[:2])
            raise UserError(f"a bundle of {len(bundle)} cells failed on bad input ({type(err).__name__}: {err}); "
                            f"first cells: {cells}") from err
        stats["computed"] += len(bundle)
        for (idx, _), values in zip(bundle, results):
            if store.write_cell(idx, values, force=force):
                stats["written"] += 1
            else:
                stats["refused_done"] += 1
        checkpoint_io.remove(ckpt)
        progress.advance(len(bundle))
    stats["wall_s"] = time.perf_counter() - t0
    return stats


def run(cfg: config_mod.Config, store_path: str, force: bool = False) -> dict:
    """Run a validated config on its task runner (the Prefect API must already be set)."""
    runner = dask_specs.task_runner(cfg.runner)
    raw = dict(cfg.to_dict(), _text=cfg.text)
    raw.pop("store")
    return sweep.with_options(task_runner=runner, flow_run_name=f"{cfg.name}")(raw, store_path, force)
