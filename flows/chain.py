"""Running the stages of a chain in one flow run, without a barrier between stages. Wiring only.

Each stage's group is opened (made from the template, atomically) and planned as a sweep of its
own (done cells skipped, damaged ones recomputed). A stage's bundles are cut from its pending
cells; a reading stage's pending cells are grouped by the upstream bundle that computes their
upstream cell, and each group is cut into bundles (``flows.bundles``) and submitted, with
``wait_for=[that upstream task run]``, right after the flow has stored that upstream bundle: so a
downstream bundle starts as soon as its inputs are in the store, while other upstream bundles
still run, and the Prefect UI shows the dependency. Its bundles carry a higher Dask priority than
the upstream's queued ones, so a free worker takes them first (results of a chain come early). Cells whose upstream cell is already stored
(or comes from the result cache) are submitted at once, with no dependency. A reading stage's
cached bundle that read another version of its upstream cells than the stored one is not used. The downstream
worker reads its inputs from the store (``storage.nets.load_nets_at``); a cell whose upstream cell
failed or holds no nets is stored as failed with that reason.

Task runs are named by stage and cells (``nets d=25..50 seed=0..2 (6 cells)``). The worker writes its cells' regions of
the store and a receipt (:mod:`flows.result_cache`) and returns the receipt; the flow marks the
cells done and drops it (no array passes through Prefect or the flow process).
"""

from __future__ import annotations

import errno
import json
import pathlib
import queue
import time
from collections import defaultdict


from core.errors import UserError
from deploy import dask as dask_specs
from flows import checkpoint as checkpoint_io
from flows import result_cache
from flows import run_ui
from flows.result_cache import FAILED, HASH, NO_ROOM, REFUSED, ROOM_ERRNOS
from flows.bundle_progress import BundleCancelled
from flows.bundles import bundle_name, by_block, make_bundles, memory_budget, with_upstream_values
from flows.progress import Progress
from storage import bundle_progress as inside
from storage import runlock
from storage.consolidate import consolidate
from storage.schema import UPSTREAM_HASH
from storage.stale import read_another_version


POLL_S = 2.0  # how often the flow reads the progress files of running bundles


class Writer:
    """Marks the cells of finished bundles done (their workers wrote them) and keeps the run's counts."""

    def __init__(self, store, stats: dict, progress: Progress, force: bool, retry_failed: bool):
        self.store, self.stats, self.progress = store, stats, progress
        self.kw = {"force": force, "replace_failed": retry_failed}

    def write(self, bundle, receipts: list[dict], *, cached: bool) -> None:
        failed = self.stats["failed"]
        for (idx, _), got in zip(bundle, receipts):
            if FAILED in got:
                ok = self.store.write_failed(idx, str(got[FAILED]), **self.kw)
                if ok:
                    self.stats["failed"] += 1
                    if len(self.stats["failures"]) < 5:
                        self.stats["failures"].append(f"{self.store.cell_label(idx)}: {got[FAILED]}")
                self.stats["refused_done"] += not ok
        stored = [(idx, int(got[HASH])) for (idx, _), got in zip(bundle, receipts) if HASH in got]
        marked = self.store.mark_many([i for i, _ in stored], [h for _, h in stored], **self.kw)
        self.stats["written"] += sum(marked)
        self.stats["refused_done"] += len(bundle) - sum(FAILED in got for got in receipts) - sum(marked)
        self.stats["from_cache" if cached else "computed"] += len(bundle)
        self.progress.advance(len(bundle), cached=len(bundle) if cached else 0, failed=self.stats["failed"] - failed)


class _Stage:
    def __init__(self, cfg, store, todo, done_before, stats, writer):
        self.cfg, self.store, self.todo, self.done_before = cfg, store, todo, done_before
        self.stats, self.writer = stats, writer
        self.receipts: list = []  # (file, cell indices) a killed run left (flows/result_cache.py::receipts)
        self.up: _Stage | None = None
        self.depth = 0  # stages read before this one; a deeper stage's bundles go first on the workers
        self.k = len(cfg.upstream_grid)  # leading index dims that name the upstream cell
        self.pending = {tuple(idx) for idx, _ in todo}  # cells this run computes
        self.waiting: dict[tuple, list] = defaultdict(list)  # pending upstream cell -> this stage's cells
        self.readers: list[_Stage] = []
        self._coords: dict | None = None

    def coords(self, idx) -> dict:
        """The grid coordinates of the cell at ``idx`` (as stored: a case axis holds its labels)."""
        if self._coords is None:
            g = self.store.group()
            self._coords = {dim: [v.item() for v in g[dim][...]] for dim in self.store.dims()}
        return {dim: self._coords[dim][i] for dim, i in zip(self._coords, idx)}


class Scheduler:
    def __init__(self, stages, store_path: str, force: bool, retry_failed: bool):
        """Open (or make) every stage's group and plan it. The run lock of every group is held
        already (:func:`flows.sweep.run`, storage/runlock.py); its record gets this flow run here."""
        from flows.sweep import open_store, plan

        self.path, self.force, self.retry_failed = store_path, force, retry_failed
        self.t0 = time.perf_counter()
        self.stages: list[_Stage] = []
        self.futures: dict = {}  # future -> (stage, bundle, ckpt, cache path)
        self.no_room = ""  # why the store's file system refused a write, once it did
        self.done_q: queue.SimpleQueue = queue.SimpleQueue()
        self.workers = dask_specs.worker_count(stages[0].runner)
        by_name: dict[str, _Stage] = {}
        runlock.note(store_path, [cfg.name for cfg in stages], _flow_run())  # whose lock it is, on the server
        run_ui.label(store_path, stages)  # the root run's name and tags (flows/run_ui.py)
        for cfg in stages:
            inside.clear(store_path, cfg.name)  # a killed run's progress files and cancel request (we hold the lock)
            up_block = by_name[cfg.source].store.block() if cfg.source else None
            store = open_store(cfg, store_path, cfg.runner["device"], up_block)
            stats = {"group": cfg.name, "store": str(store_path), "total": cfg.n_cells, "computed": 0,
                     "from_cache": 0, "written": 0, "failed": 0, "failures": [], "refused_done": 0, "bundles": 0}
            todo, done_before = plan(cfg, store, force, retry_failed, stats)
            stats["done_before"] = done_before
            writer = None
            if todo:
                writer = Writer(store, stats, Progress(cfg.n_cells, cfg.n_cells - len(todo), cfg.name,
                                                       store=str(store_path)), force, retry_failed)
            st = _Stage(cfg, store, todo, done_before, stats, writer)
            st.receipts = [] if force else result_cache.receipts(store_path, cfg.name)
            if cfg.source:
                st.up = by_name[cfg.source]
                st.depth = st.up.depth + 1
                st.up.readers.append(st)
            by_name[cfg.name] = st
            self.stages.append(st)

    # --- submitting ------------------------------------------------------------------------
    def _bundles(self, st: _Stage, items: list) -> list:
        cfg = st.cfg
        budget = memory_budget(cfg.runner["device"], cfg.runner["workers"])
        items = with_upstream_values(cfg.exp, items, st.up.cfg if st.up else None)
        by_index = {tuple(idx): (idx, cell) for idx, cell in items}
        kept = []  # a killed run's bundles whose receipts are left: cut as they were, so they are used
        for receipt in list(st.receipts):
            if all(i in by_index for i in receipt[1]):
                kept.append([by_index.pop(i) for i in receipt[1]])
                st.receipts.remove(receipt)
        return kept + make_bundles(cfg.exp, list(by_index.values()), cfg.runner["bundle_size"],
                                   memory_budget=budget, workers=self.workers, block=st.store.block())

    def _submit(self, st: _Stage, items: list, wait_for=None) -> None:
        """Cut ``items`` (pending cells of one stage) into bundles; take each from the result
        cache or submit it as a task run."""
        import dask

        from flows.sweep import bundle_id, code_fingerprint, run_bundle
        from storage.verify import cells_damage

        if self.no_room:  # the store's file system refused a write: nothing more is started
            return
        cfg, device = st.cfg, st.cfg.runner["device"]
        resources = dask_specs.resources_for(device)
        bundles = self._bundles(st, items)
        st.stats["bundles"] += len(bundles)
        for b in bundles:
            cells = [cell for _, cell in b]
            ups = [list(idx[:st.k]) for idx, _ in b]
            keyed = [dict(c, __upstream__=u) for c, u in zip(cells, ups)] if st.up else cells
            ckpt = checkpoint_io.path_for(self.path, cfg.name, bundle_id(cfg.experiment, keyed))
            key = result_cache.bundle_key(cfg.experiment, keyed, device, code_fingerprint())
            cpath = result_cache.path_for(self.path, cfg.name, key)
            names = {HASH, REFUSED, UPSTREAM_HASH}
            cached = None if self.force else result_cache.load(cpath, key, len(cells), names)
            if cached is not None and st.up and read_another_version(self.path, st.up.cfg.name, ups, cached):
                result_cache.quarantine(cpath, "it read an upstream cell that has changed since")
                cached = None
            written = [(idx, int(r[HASH])) for (idx, _), r in zip(b, cached or []) if HASH in r]
            # used only if the store holds what it records: each cell's cell_hash, and values that still hash to it
            # (a chunk lost or edited since the kill: recomputed, issue 40)
            if cached is not None and (not st.store.holds(written)
                                       or cells_damage(self.path, cfg.name, [i for i, _ in written])):
                result_cache.quarantine(cpath, "the store does not hold the values it records (store made anew, "
                                        "or a chunk lost or edited since?)")
                cached = None
            if cached is not None:  # computed and written by a run killed before it marked them done
                self._store(st, b, cached, True, cpath, ckpt, None)
                continue
            inputs = {"store": str(self.path), "group": st.up.cfg.name, "indices": ups} if st.up else None
            name = bundle_name(cfg.name, st.store.dims(), [st.coords(idx) for idx, _ in b])
            target = {"store": str(self.path), "group": cfg.name, "indices": [list(idx) for idx, _ in b],
                      "force": self.force, "replace_failed": self.retry_failed}
            fn = run_bundle.with_options(retries=cfg.runner["retries"], task_run_name=name)
            with dask.annotate(priority=st.depth, **({"resources": resources} if resources else {})):
                fut = fn.submit(cfg.experiment, cells, device, ckpt if cfg.exp.checkpoints else None, cpath, key,
                                inputs, target, wait_for=wait_for or None)
            self.futures[fut] = (st, b, ckpt, cpath)
            st.writer.progress.running()  # its inputs are stored, its priority is the highest queued: its clock starts
            _on_done(fut, self.done_q.put)

    def _release(self, st: _Stage, bundle, fut) -> None:
        """The cells of reading stages that waited for the cells of ``bundle`` (now stored)."""
        for reader in st.readers:
            items = [it for idx, _ in bundle for it in reader.waiting.pop(tuple(idx), [])]
            if items:
                self._submit(reader, items, [fut] if fut is not None else None)

    def _store(self, st: _Stage, bundle, results, cached: bool, cpath, ckpt, fut) -> None:
        st.writer.write(bundle, results, cached=cached)
        st.pending.difference_update(tuple(idx) for idx, _ in bundle)
        result_cache.remove(cpath)
        checkpoint_io.remove(ckpt)
        inside.remove(self.path, st.cfg.name, pathlib.Path(cpath).stem)  # its progress file (issue 30)
        self._release(st, bundle, fut)

    # --- running ---------------------------------------------------------------------------
    def run(self) -> list[dict]:
        """Submit, store what comes back, and on any way out but the normal one (a cancelled flow run's
        TerminationSignal, Ctrl-C, an error) ask the bundles still running to stop (issue 30 item 1)."""
        try:
            return self._run()
        except BaseException:
            self.stop_bundles()
            raise

    def stop_bundles(self) -> None:
        """The cancel request of every stage with bundles in flight (flows/bundle_progress.py: workers
        at an ``address`` stop at their next progress report; a local cluster is closed anyway), and
        their futures cancelled; checkpoints stay, so the rerun resumes."""
        for st in {id(s): s for s, *_ in self.futures.values()}.values():
            try:
                inside.request_cancel(self.path, st.cfg.name, "the run stopped")
            except OSError:
                pass
        for fut in self.futures:
            try:
                fut.wrapped_future.cancel()  # the Dask future (a thread's for the inline runner)
            except Exception:  # noqa: BLE001 - a finished or lost future has nothing to cancel
                pass

    def _poll_inside(self) -> None:
        """Each stage's running bundles, as their progress files say (at most every POLL_S s)."""
        for st in self.stages:
            if st.writer is not None and st.pending:
                st.writer.progress.inside(inside.summary(inside.read(self.path, st.cfg.name)))
                st.writer.progress.tick()  # elapsed and ETA refreshed even when nothing changed

    def _run(self) -> list[dict]:
        for st in self.stages:
            if not st.todo:
                continue
            if st.up is None:
                self._submit(st, st.todo)
                continue
            ready = []
            for unit in by_block(st.todo, st.store.block()):  # a block's cells go together (storage/blocks.py)
                up = next((tuple(idx[:st.k]) for idx, _ in unit if tuple(idx[:st.k]) in st.up.pending), None)
                (st.waiting[up].extend(unit) if up is not None else ready.extend(unit))  # its upstream cells
            if ready:  # pending lie in one upstream block, so one upstream bundle releases the block
                self._submit(st, ready)
        pending = len(self.futures)
        while pending:
            try:
                fut = self.done_q.get(timeout=POLL_S)
            except queue.Empty:
                self._poll_inside()
                continue
            pending -= 1
            st, bundle, ckpt, cpath = self.futures[fut]
            try:
                results = fut.result()
            except BundleCancelled as err:  # still a UserError; the served flow ends Cancelled on it (flows/served.py)
                raise BundleCancelled(f"{err}: the cells stored stay, checkpoints are kept; the same command "
                                      "resumes") from err
            except UserError as err:  # bad input: not retried
                cells = ", ".join(json.dumps(cell, default=str) for _, cell in bundle[:2])
                raise UserError(f"a bundle of {len(bundle)} cells of stage '{st.cfg.name}' failed on bad input "
                                f"({err}); first cells: {cells}") from err
            before = len(self.futures)
            try:
                if results and NO_ROOM in results[0]:
                    raise OSError(errno.ENOSPC, results[0][NO_ROOM])
                self._store(st, bundle, results, False, cpath, ckpt, fut)
            except OSError as err:  # the worker's writes or ours refused: stop submitting, drain, say so
                if err.errno not in ROOM_ERRNOS:
                    raise
                self.no_room = self.no_room or (err.strerror or str(err))
            pending += len(self.futures) - before
        wall = time.perf_counter() - self.t0
        for st in self.stages:
            st.stats["wall_s"] = wall
            if not self.no_room:  # every cell is done: receipts still here belong to no bundle
                stray = list(result_cache.cache_dir(self.path, st.cfg.name).glob("*.npz"))
                for path in stray:
                    result_cache.remove(str(path))
                st.stats["stray_receipts_removed"] = len(stray)
            if self.no_room:
                st.stats["no_room"] = self.no_room
            inside.clear(self.path, st.cfg.name)
        consolidate(self.path)  # the run's end: plain xr.open_zarr(store, group=...) opens it (storage/consolidate.py)
        run_ui.finish(self.path, [st.stats for st in self.stages], [st.cfg.experiment for st in self.stages],
                      [st.writer.progress.line().removeprefix("[kktlab] ") for st in self.stages if st.writer])
        return [st.stats for st in self.stages]


def _flow_run() -> dict:
    """The Prefect flow run this run is part of, as the lock file records it: the root one (what
    ``kktlab submit`` printed) and its page on the server, when known."""
    try:
        from prefect.runtime import flow_run
        from prefect.settings import PREFECT_API_URL

        run_id = flow_run.root_flow_run_id or flow_run.id
        api = PREFECT_API_URL.value()
    except Exception:  # noqa: BLE001 - outside a flow run, or the server is unreachable: not recorded
        return {}
    if not run_id:
        return {}
    url = f"{api.rstrip('/').removesuffix('/api')}/runs/flow-run/{run_id}" if api else None
    return {"flow_run_id": str(run_id), "flow_run_url": url}


def _on_done(fut, callback) -> None:
    """Call ``callback(fut)`` once ``fut`` reached its final state (as prefect.futures.as_completed does)."""
    add = getattr(fut, "_add_prefect_done_callback", None)
    (add or fut.add_done_callback)(callback)
