"""Chain overhead (issue 13): a two-stage chain (train -> universal_attack) in one flow run vs the
same two stages as two separate sweeps (a barrier between them) vs direct kernel calls.

For train bundles of about 1 s and 10 s (``max_iters`` calibrated here on one bundle; the loss
target is out of reach, so every bundle runs its iterations), U upstream bundles of 2 cells and
2 downstream cells per net run three ways, each on a fresh store:

* ``chain``: ``kktlab run`` of the two-stage config, one flow run (downstream bundles start as
  soon as their nets are stored);
* ``separate``: the train stage alone as one sweep, then the chain again (train cells done,
  only the attack stage computed): two flow runs, the second waits for the first;
* ``direct``: the train kernel on each bundle, then the attack kernel on the nets read back from
  the store (``load_nets_at``), in this process, one by one.

Also measured in the chain run: the delay between an upstream task run ending and the start of
the downstream task run that waited for it (Prefect task-run timestamps), the bytes that came back
from the workers to the flow (the pickled receipts, what Prefect and Dask carry) against the bytes
the workers wrote into the store themselves, and the size of Prefect's own result storage
(should be 0: nothing is persisted). Default W = 1 worker: the second core hosts the flow, the
Prefect server and the scheduler, as in ``orchestration_overhead.py``.

    python benchmarks/chain_overhead.py [--quick] [--workers 1] [--upstream 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import pickle
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from benchmarks.common import write  # noqa: E402
from deploy import runtime  # noqa: E402

TRAIN = {"width": 64, "lr0": 0.01, "lr_period": 10, "target_loss": 1.0e-300, "batch_size": 5000}
D = 48


def chain_cfg(name: str, max_iters: int, upstream: int, workers: int, attack_stage: bool = True) -> dict:
    stages = [{"name": "nets", "experiment": "train", "grid": {"d": [D], "seed": list(range(2 * upstream))},
               "params": dict(TRAIN, max_iters=max_iters)}]
    if attack_stage:
        stages.append({"name": "robustness", "experiment": "universal_attack", "from": "nets",
                       "grid": {"attack": ["margin_direction", "random_direction"]}})
    return {"name": name, "runner": {"workers": workers, "bundle_size": 2}, "stages": stages}


def calibrate(seconds: float) -> int:
    """``max_iters`` for which one 2-cell train bundle takes about ``seconds`` here."""
    from flows import config

    iters = 200
    while True:
        cells = config.parse(chain_cfg("cal", iters, 1, 1, False)).stages[0].cells()
        exp = config.parse(chain_cfg("cal", iters, 1, 1, False)).stages[0].exp
        t0 = time.perf_counter()
        exp.run_bundle(cells, "cpu")
        dt = time.perf_counter() - t0
        if dt > 0.3:
            return max(10, int(iters * seconds / dt))
        iters *= 4


def store_bytes(path: pathlib.Path, group: str) -> int:
    return sum(f.stat().st_size for f in (path / group).rglob("*") if f.is_file() and "/c/" in f.as_posix())


SUBMITTED: list[float] = []  # wall-clock times at which the flow submitted a bundle that waited for another


def run_chain(raw: dict, store: str) -> tuple[float, list[dict], list[int]]:
    """Wall time of ``raw`` run in one flow run, its stats, and the pickled size of every bundle's
    receipts as they reached the flow."""
    from flows import chain as chain_mod
    from flows import config
    from flows.sweep import run

    sizes: list[int] = []
    write, submit = chain_mod.Writer.write, chain_mod.Scheduler._submit

    def counting(self, bundle, receipts, *, cached):
        sizes.append(len(pickle.dumps(receipts)))
        return write(self, bundle, receipts, cached=cached)

    def stamping(self, st, items, wait_for=None):
        if wait_for:
            SUBMITTED.append(time.time())
        return submit(self, st, items, wait_for)

    chain_mod.Writer.write, chain_mod.Scheduler._submit = counting, stamping
    try:
        SUBMITTED.clear()
        t0 = time.perf_counter()
        stats = run(config.parse(raw), store)
        return time.perf_counter() - t0, stats, sizes
    finally:
        chain_mod.Writer.write, chain_mod.Scheduler._submit = write, submit


def handoff_delays(flow_run_name: str) -> tuple[list[float], list[float]]:
    """Seconds from each upstream task run's end to the start of the downstream task run waiting
    for it, and to the flow's submission of downstream bundles (the flow's own part: storing,
    cutting bundles, submitting; the rest is waiting for a free worker)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

    with get_client(sync_client=True) as client:
        # runs are named "<config> @ <store>" (flows/run_ui.py)
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{flow_run_name} @ ")))
        runs = [r for r in runs if r.name.startswith(f"{flow_run_name} @ ")]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[runs[-1].id])))
    by_id = {t.id: t for t in tasks}
    started, ends = [], set()
    for t in tasks:
        for dep in t.task_inputs.get("wait_for", []):
            up = by_id.get(dep.id)
            if up is not None and up.end_time and t.start_time:
                started.append((t.start_time - up.end_time).total_seconds())
                ends.add(up.end_time.timestamp())
    submitted = [min((s - e for s in SUBMITTED if s >= e), default=float("nan")) for e in sorted(ends)]
    return started, submitted


def direct(raw: dict, store: str) -> float:
    """The same work by direct kernel calls in this process (nets read back from ``store``)."""
    from flows import config
    from flows.bundles import make_bundles
    from storage.nets import load_nets_at

    cfg = config.parse(raw)
    train, attack = cfg.stages
    t0 = time.perf_counter()
    items = list(enumerate(train.cells()))
    for b in make_bundles(train.exp, items, 2):
        train.exp.run_bundle([c for _, c in b], "cpu")
    cells = attack.cells()
    per_net = len(cells) // len(items)
    for i in range(len(items)):
        mine = cells[i * per_net:(i + 1) * per_net]
        for j in range(0, len(mine), 2):
            nets = load_nets_at(store, "nets", [(0, i)] * len(mine[j:j + 2]))
            attack.exp.run_bundle(mine[j:j + 2], "cpu", inputs=nets)
    return time.perf_counter() - t0


def measure(seconds: float, a, tmp: str) -> dict:
    iters = calibrate(seconds)
    name = f"chain{int(seconds * 10)}"
    full = chain_cfg(name, iters, a.upstream, a.workers)
    t_chain, stats, receipts = run_chain(full, f"{tmp}/{name}.zarr")
    delays, to_submit = handoff_delays(name)
    stored = sum(store_bytes(pathlib.Path(f"{tmp}/{name}.zarr"), g) for g in ("nets", "robustness"))
    t_first, _, _ = run_chain(chain_cfg(name + "a", iters, a.upstream, a.workers, False), f"{tmp}/{name}-sep.zarr")
    t_second, _, _ = run_chain(chain_cfg(name + "a", iters, a.upstream, a.workers), f"{tmp}/{name}-sep.zarr")
    t_direct = direct(full, f"{tmp}/{name}.zarr")
    row = {"bundle_s_target": seconds, "max_iters": iters, "upstream_bundles": a.upstream,
           "downstream_bundles": stats[1]["bundles"], "written": [s["written"] for s in stats],
           "chain_s": t_chain, "separate_s": t_first + t_second, "separate_parts_s": [t_first, t_second],
           "direct_s": t_direct, "chain_vs_separate": (t_first + t_second) / t_chain,
           "chain_vs_direct": t_chain / t_direct,
           "handoff_delay_s": {"median": statistics.median(delays), "max": max(delays), "n": len(delays)}
           if delays else None,
           "flow_submit_delay_s": {"median": statistics.median(to_submit), "max": max(to_submit)} if to_submit else None,
           "bytes_returned_to_flow": sum(receipts), "bytes_written_by_workers": stored,
           "bytes_returned_per_bundle_max": max(receipts)}
    print(f"~{seconds:g} s bundles (max_iters {iters}): chain {t_chain:.1f} s, separate sweeps {t_first + t_second:.1f}"
          f" s ({row['chain_vs_separate']:.2f}x the chain), direct {t_direct:.1f} s (chain = {row['chain_vs_direct']:.2f}x"
          f" direct); upstream end -> downstream start median "
          f"{row['handoff_delay_s']['median'] if delays else float('nan'):.2f} s, of which the flow took "
          f"{row['flow_submit_delay_s']['median'] if to_submit else float('nan'):.2f} s to submit it; "
          f"{sum(receipts)} bytes back to the flow for {stored} bytes the workers wrote", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--upstream", type=int, default=4, help="train bundles (2 cells each)")
    ap.add_argument("--quick", action="store_true", help="1 s bundles only")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [1.0] if a.quick else [1.0, 10.0]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        os.environ["PREFECT_HOME"] = os.path.join(tmp, "prefect-home")
        stack.enter_context(runtime.prefect_api())
        run_chain(chain_cfg("warmup", 10, 1, a.workers), f"{tmp}/warmup.zarr")  # imports, first flow run
        rows = [measure(s, a, tmp) for s in sizes]
        storage = pathlib.Path(os.environ["PREFECT_HOME"]) / "storage"
        persisted = sum(f.stat().st_size for f in storage.rglob("*") if f.is_file()) if storage.exists() else 0
    path = write("chain_overhead", {"workers": a.workers, "rows": rows, "prefect_result_storage_bytes": persisted,
                                    "note": "chain_vs_separate > 1: the chain is faster than two sweeps with a "
                                            "barrier; chain_vs_direct: orchestration cost over the kernels alone"})
    print(f"Prefect result storage: {persisted} bytes; wrote {path}")


if __name__ == "__main__":
    main()
