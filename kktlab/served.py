"""``kktlab submit`` and ``kktlab deploy``: served mode as a user sees it (issue 17).

``submit`` queues a config on a Prefect server (one deployment per experiment; a chain runs under
its first stage's) and prints the flow run's URL; with ``--watch`` it follows the run: the progress
lines of each stage as the sweep logs them (cells done / total, ETA, from cache, failed), the
final state, and one clear line and a non-zero exit when no worker picks the run up, the run
fails or crashes, or Ctrl-C stops the watching (the run goes on on the server)."""

from __future__ import annotations

import datetime
import os
import sys
import time

from core.errors import UserError

# a run still scheduled after this long with no live worker in its pool: say so ($KKTLAB_NO_WORKER_S)
NO_WORKER_S = float(os.environ.get("KKTLAB_NO_WORKER_S", "30"))
POLL_S = 2.0


def _api() -> str:
    from deploy.probe import api_url
    from deploy.probe import check_prefect_api as probe

    api = api_url()
    if not api:
        raise UserError("no Prefect API URL: start a server (make server) and export PREFECT_API_URL "
                        "(or `prefect config set PREFECT_API_URL=...`)")
    probe(api)
    return api


def cmd_submit(args) -> int:
    """Create a flow run of the experiment's deployment on a Prefect server (served mode)."""
    from flows import config as config_mod

    runner = {"cluster": "address", "address": args.dask_address} if args.dask_address is not None else {}
    if args.max_cells is not None:
        runner["max_cells"] = args.max_cells
    overrides = {"runner": runner} if runner else {}
    cfg = config_mod.load(args.config, overrides)  # validated here, before anything is queued
    api = _api()
    from deploy import runtime

    runtime.quiet_env()
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    from flows.served import FLOW_NAME

    name = f"{FLOW_NAME}/{cfg.stages[0].experiment}"  # a chain runs under its first stage's deployment
    params = {"config_path": os.path.abspath(args.config), "store": os.path.abspath(cfg.store_path(args.store)),
              "overrides": overrides, "force": args.force, "verbose": args.verbose}
    try:
        run = run_deployment(name, parameters=params, timeout=0)
    except ObjectNotFound:
        raise UserError(f"no deployment {name!r} on {api}: run 'make deploy' first") from None
    ui = api.rstrip("/").removesuffix("/api") + f"/runs/flow-run/{run.id}"
    print(f"flow run {run.name} ({run.id}) of {name}: {run.state.name if run.state else '?'}\n  {ui}", flush=True)
    print(f"  store: {params['store']}  (kktlab status {params['store']})", flush=True)
    if not args.watch:
        return 0
    try:
        return watch(run.id, ui, store=params["store"], stages=cfg.stages)
    except KeyboardInterrupt:
        print(f"kktlab: stopped watching; the run goes on on the server: {ui}", file=sys.stderr)
        return 130


def _pool_has_live_worker(client, deployment_id) -> tuple[str, bool]:
    dep = client.read_deployment(deployment_id)
    workers = client.read_workers_for_work_pool(dep.work_pool_name)
    return dep.work_pool_name, any(getattr(w, "status", None) and str(w.status.value).upper() == "ONLINE"
                                   for w in workers)


def watch(run_id, ui: str, no_worker_s: float = NO_WORKER_S, store: str | None = None, stages=(),
          console=None) -> int:
    """Follow flow run ``run_id`` to its end: a live bar per stage from its progress log lines
    (plain lines when stdout is not a terminal), then each stage's summary table from ``store``."""
    from prefect.client.orchestration import get_client
    from rich.console import Console

    from flows.progress import parse_line
    from kktlab.progress_view import Bars

    t0, seen, last_state, grace = time.monotonic(), {}, None, 0
    console = console or Console(file=sys.stdout)
    with get_client(sync_client=True) as client, Bars(console, plain_every_s=0.0, prefix="  ") as bars:
        while True:
            run = client.read_flow_run(run_id)
            state = run.state if not grace else state  # after the end: only the last log lines
            # the sweep logs its progress lines to the root flow run (flows/progress.py): this one
            for log in _new_logs(client, run_id, seen):
                event = parse_line(log.message)
                if event is not None:
                    bars.update(event)
            # a run's last log lines may reach the server after its final state: wait for every stage's N/N
            ended = state is not None and state.is_final() and (
                not state.is_completed() or grace >= 5 or all(d >= n for d, n in bars.last_counts.values()))
            if state and state.name != last_state and (ended or not state.is_final()):
                last_state = state.name
                console.print(f"kktlab: flow run {run.name}: {state.name}", markup=False, highlight=False)
            if ended:
                break
            if state and state.is_final():
                grace += 1
                time.sleep(1.0)
                continue
            if state and state.is_scheduled() and time.monotonic() - t0 > no_worker_s:
                pool, live = _pool_has_live_worker(client, run.deployment_id)
                if not live:
                    raise UserError(f"no worker is polling work pool '{pool}' ({no_worker_s:.0f} s and the run is "
                                    f"still {state.name}): start one with `make worker` (POOL={pool}); the run stays "
                                    f"queued: {ui}")
            time.sleep(POLL_S)
    if state.is_completed():
        if store:
            _summaries(store, stages, console)
        return 0
    message = (state.message or "").strip().splitlines()
    print(f"kktlab: error: the flow run ended {state.name}" + (f": {message[0][:1000]}" if message else "") +
          f"; its logs: {ui}", file=sys.stderr)
    return 1


PAGE = 200  # the API's default page of log lines


def _new_logs(client, run_id, seen: dict) -> list:
    """Log lines of flow run ``run_id`` not in ``seen`` (log id -> timestamp), oldest first, paged; only
    the last minute's are asked for again (a night's sweep logs thousands of lines)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
    from prefect.client.schemas.sorting import LogSort

    since = max(seen.values()) - datetime.timedelta(seconds=60) if seen else None
    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]),
                    **({"timestamp": LogFilterTimestamp(after_=since)} if since else {}))
    out, offset = [], 0
    while True:
        page = client.read_logs(flt, limit=PAGE, offset=offset, sort=LogSort.TIMESTAMP_ASC)
        for log in page:
            if log.id not in seen:
                seen[log.id] = log.timestamp
                out.append(log)
        if len(page) < PAGE:
            return out
        offset += PAGE


def _summaries(store: str, stages, console) -> None:
    """Each stage's summary table and cell counts, read from the store (a filesystem the workers share)."""
    from storage.query import open_results, status, summary

    try:
        rows = {row["group"]: row for row in status(store)}
        for stage in stages:
            row = rows.get(stage.name, {})
            table = summary(open_results(store, stage.name), variables=stage.exp.summary)
            failed = f", {row['failed']} failed" if row.get("failed") else ""
            print(f"\n== {stage.experiment} / {stage.name}\n{table}\nstore: {store}  group: {stage.name}  cells: "
                  f"{row.get('done', '?')}/{row.get('total', '?')} done{failed}", file=console.file, flush=True)
    except Exception as err:  # noqa: BLE001 - the run is done; its table is a courtesy
        print(f"kktlab: the store {store} is not readable here ({type(err).__name__}: {err}); "
              "workers and this machine must share its filesystem", file=console.file, flush=True)


def cmd_deploy(args) -> int:
    """Create the process work pool and one deployment per experiment (served mode)."""
    from deploy.prefect_deploy import deploy_all, prefect_yaml
    from flows import experiments

    described = {name: experiments.get(name).description for name in experiments.names()}
    if args.write_yaml:  # deploy/prefect.yaml, for `prefect deploy --all`: no server needed
        with open(args.write_yaml, "w") as f:
            f.write(prefect_yaml(described, args.pool))
        print(f"wrote {len(described)} deployments to {args.write_yaml}")
        return 0
    _api()
    ids = deploy_all(args.pool, described)
    print(f"deployed {len(ids)} deployments to work pool {args.pool}")
    return 0
