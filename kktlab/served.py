"""``kktlab submit`` and ``kktlab deploy``: served mode as a user sees it (issue 17).

``submit`` queues a config on a Prefect server (one deployment per experiment; a chain runs under
its first stage's) and prints the flow run's URL; with ``--watch`` it follows the run: the progress
lines of each stage as the sweep logs them (cells done / total, ETA, from cache, failed), the
final state, and one clear line and a non-zero exit when no worker picks the run up, the run
fails or crashes, or Ctrl-C stops the watching (the run goes on on the server). A config one of
whose groups another run is computing in the same store is refused before anything is queued, in
one line naming that run and its flow run's page (storage/runlock.py); ``--wait`` waits for it.

``--watch`` rides out a restart of the server (issue 30): while the API does not answer it retries
with backoff and says once every ``WAIT_LINE_S`` that it is waiting; a server lost for longer than
``KKTLAB_SERVER_LOST_S`` (600 s) ends the watching with one line naming the URL and ``kktlab status
STORE``. The run is named ``<config> @ <store>`` and tagged (flows/run_ui.py).

A run the server marks Crashed while its process still holds the store's run lock is watched on (one
line says so; kktlab/watch_crash.py): it was alive, its heartbeats lost, and it sets itself Running again.

Exit codes of ``--watch``: 0 the run completed; 1 it failed, crashed (its process gone) or was cancelled (its error);
2 a bad config, an unreachable server at submit time, or no worker polling the pool (``KKTLAB_NO_WORKER_S``);
4 the server was lost (or lost the run) while watching: the run's outcome is unknown; 130 Ctrl-C."""

from __future__ import annotations

import datetime
import os
import sys
import time

from core.errors import UserError
from flows.progress import hms
from kktlab.watch_crash import CrashCheck
from storage import runlock

# a run still scheduled after this long with no live worker in its pool: say so ($KKTLAB_NO_WORKER_S)
NO_WORKER_S = float(os.environ.get("KKTLAB_NO_WORKER_S", "30"))
POLL_S = 2.0
SERVER_LOST_S = float(os.environ.get("KKTLAB_SERVER_LOST_S", "600"))  # then give up watching: exit EXIT_LOST
WAIT_LINE_S = 30.0  # at most one "waiting for the server" line this often
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)  # between tries while the server does not answer; then 15 s
EXIT_FAILED, EXIT_LOST = 1, 4


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
    store = os.path.abspath(cfg.store_path(args.store))
    # another run computing one of its groups (storage/runlock.py): refused here, in one line naming it
    # (its flow run's page), or (--wait) waited for; before the server is asked anything
    runlock.check(store, [stage.name for stage in cfg.stages], wait=getattr(args, "wait", False))
    api = _api()
    from deploy import runtime

    runtime.quiet_env()
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    from flows.served import FLOW_NAME

    from flows.run_ui import run_name, run_tags

    name = f"{FLOW_NAME}/{cfg.stages[0].experiment}"  # a chain runs under its first stage's deployment
    params = {"config_path": os.path.abspath(args.config), "store": store,
              "overrides": overrides, "force": args.force, "verbose": args.verbose}
    if getattr(args, "wait", False):  # a run that takes a group between the check and its start: waited for too
        params["wait"] = True
    run = _create_run(lambda key: run_deployment(
        name, parameters=params, timeout=0, flow_run_name=run_name(cfg.name, params["store"]),
        tags=run_tags(cfg.name, [s.experiment for s in cfg.stages], params["store"]), idempotency_key=key),
        name, api, ObjectNotFound)
    ui = api.rstrip("/").removesuffix("/api") + f"/runs/flow-run/{run.id}"
    print(f"flow run {run.name} ({run.id}) of {name}: {run.state.name if run.state else '?'}\n  {ui}", flush=True)
    print(f"  store: {params['store']}  (kktlab status {params['store']})", flush=True)
    if not args.watch:
        return 0
    try:
        return watch(run.id, ui, store=params["store"], stages=cfg.stages, api=api)
    except KeyboardInterrupt:
        print(f"kktlab: stopped watching; the run goes on on the server: {ui}", file=sys.stderr)
        return 130


def _create_run(create, name: str, api: str, not_found):
    """``create(idempotency_key)`` tried again (:data:`BACKOFF_S`) while the server answers 5xx / 429 or not at
    all (SQLite-backed: 503 while its database is locked), one key for every try (a run made but whose answer
    was lost is returned, never queued twice); then one line naming the server and the answer."""
    import uuid

    import httpx

    key = f"kktlab-submit-{uuid.uuid4().hex}"
    for pause in (*BACKOFF_S, None):
        try:
            return create(key)
        except not_found:
            raise UserError(f"no deployment {name!r} on {api}: run 'make deploy' first") from None
        except (httpx.HTTPStatusError, httpx.TransportError) as err:
            code = err.response.status_code if isinstance(err, httpx.HTTPStatusError) else None
            if code is not None and code < 500 and code != 429:
                raise
            said = f"answered {code}" if code else f"did not answer ({type(err).__name__})"
            if pause is None:
                raise UserError(f"the Prefect server at {api} {said} {len(BACKOFF_S) + 1} times while creating the run "
                                f"of {name!r}; none was confirmed: look at its flow runs (or kktlab status STORE) "
                                "and rerun the same kktlab submit") from None
            print(f"kktlab: the Prefect server {said}; trying again in {pause:g} s", file=sys.stderr, flush=True)
            time.sleep(pause)


def _pool_has_live_worker(client, deployment_id) -> tuple[str, bool]:
    dep = client.read_deployment(deployment_id)
    workers = client.read_workers_for_work_pool(dep.work_pool_name)
    return dep.work_pool_name, any(getattr(w, "status", None) and str(w.status.value).upper() == "ONLINE"
                                   for w in workers)


class _Server:
    """The watcher's view of the API: how long it has not answered, when to say so, when to give up."""

    def __init__(self, api: str, lost_s: float, console):
        self.api, self.lost_s, self.console = api, lost_s, console
        self.since: float | None = None
        self.said, self.tries, self.error = float("-inf"), 0, ""

    def lost(self, err: BaseException) -> bool:
        """Note a failed call; True when the server has been gone past the bound."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        self.tries += 1
        self.error = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}".rstrip(": ")
        if now - self.since >= self.lost_s:
            return True
        if now - self.said >= WAIT_LINE_S:
            self.said = now
            self.console.print(f"kktlab: waiting for the Prefect server at {self.api} ({self.error}); "
                               "the run goes on on the workers", markup=False, highlight=False, soft_wrap=True)
        time.sleep(min(BACKOFF_S[min(self.tries - 1, len(BACKOFF_S) - 1)], max(self.since + self.lost_s - now, 0.1)))
        return False

    def ok(self) -> None:
        if self.since is not None:
            self.console.print(f"kktlab: the Prefect server at {self.api} answers again (after "
                               f"{hms(time.monotonic() - self.since)})", markup=False, highlight=False, soft_wrap=True)
        self.since, self.said, self.tries = None, float("-inf"), 0


def watch(run_id, ui: str, no_worker_s: float = NO_WORKER_S, store: str | None = None, stages=(),
          console=None, api: str | None = None, lost_s: float | None = None) -> int:
    """Follow flow run ``run_id`` to its end: a live bar per stage from its progress log lines
    (plain lines when stdout is not a terminal), then each stage's summary table from ``store``.
    Rides out a server that stops answering for less than ``lost_s`` (``SERVER_LOST_S``)."""
    import httpx
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings
    from rich.console import Console

    from kktlab.progress_view import Bars

    console = console or Console(file=sys.stdout)
    api = api or PREFECT_API_URL.value() or "?"
    server = _Server(api, SERVER_LOST_S if lost_s is None else lost_s, console)
    where = f"`kktlab status {store}` shows its cells" if store else "`kktlab status STORE` shows its cells"
    # this loop retries, with its own backoff and lines: no silent minute of retries inside one call
    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}), \
            Bars(console, plain_every_s=0.0, prefix="  ") as bars:
        say = lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
        follow = _Follow(run_id, ui, no_worker_s, bars, console,
                         CrashCheck(run_id, store, [stage.name for stage in stages], say))
        try:
            while True:
                try:
                    state = follow.step()
                    server.ok()
                except ObjectNotFound:
                    print(f"kktlab: error: the Prefect server at {api} does not know flow run {run_id} (a new "
                          f"database?); {where}", file=sys.stderr)
                    return EXIT_LOST
                except (httpx.HTTPError, OSError) as err:
                    follow.close()
                    if server.lost(err):
                        print(f"kktlab: error: no answer from the Prefect server at {api} for {hms(server.lost_s)} "
                              f"({server.error}); the run may go on on the workers: {where}; its page: {ui}",
                              file=sys.stderr)
                        return EXIT_LOST
                    continue
                if state is not None:
                    break
        finally:
            follow.close()
    if state.is_completed():
        if store:
            _summaries(store, stages, console)
        return 0
    message = (state.message or "").strip().splitlines()
    print(f"kktlab: error: the flow run ended {state.name}" + (f": {message[0][:1000]}" if message else "") +
          f"; its logs: {ui}", file=sys.stderr)
    return EXIT_FAILED


class _Follow:
    """One poll of the run at a time (``step``): its state, new progress lines, the no-worker check."""

    def __init__(self, run_id, ui, no_worker_s, bars, console, crash):
        self.run_id, self.ui, self.no_worker_s, self.bars, self.console = run_id, ui, no_worker_s, bars, console
        self.crash = crash  # is a Crashed state final (kktlab/watch_crash.py)
        self.t0, self.seen, self.last_state, self.grace, self.state = time.monotonic(), {}, None, 0, None
        self.client = None

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - a dead connection has nothing to close
                pass
            self.client = None

    def step(self):
        """Poll once (sleeping after); the run's final state once it has ended, else None."""
        from prefect.client.orchestration import get_client

        from flows.progress import parse_line

        if self.client is None:
            self.client = get_client(sync_client=True).__enter__()
        client = self.client
        run = client.read_flow_run(self.run_id)
        state = self.state = run.state if not self.grace else self.state  # after the end: only the last log lines
        # the sweep logs its progress lines to the root flow run (flows/progress.py): this one
        for log in _new_logs(client, self.run_id, self.seen):
            event = parse_line(log.message)
            if event is not None:
                self.bars.update(event)
        if self.crash.goes_on(state, run.name):  # Crashed by the server, yet its process holds the run lock
            self.last_state = state.name  # its return to Running is said
            time.sleep(POLL_S)
            return None
        # a run's last log lines may reach the server after its final state: wait for every stage's N/N
        ended = state is not None and state.is_final() and (
            not state.is_completed() or self.grace >= 5 or all(d >= n for d, n in self.bars.last_counts.values()))
        if state and state.name != self.last_state and (ended or not state.is_final()):
            self.last_state = state.name
            self.console.print(f"kktlab: flow run {run.name}: {state.name}", markup=False, highlight=False, soft_wrap=True)
        if ended:
            return state
        if state and state.is_final():
            self.grace += 1
            time.sleep(1.0)
            return None
        if state and state.is_scheduled() and time.monotonic() - self.t0 > self.no_worker_s:
            pool, live = _pool_has_live_worker(client, run.deployment_id)
            if not live:
                raise UserError(f"no worker is polling work pool '{pool}' ({self.no_worker_s:.0f} s and the run is "
                                f"still {state.name}): start one with `make worker` (POOL={pool}); the run stays "
                                f"queued: {self.ui}")
        time.sleep(POLL_S)
        return None


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
    from deploy.prefect_deploy import ensure_crash_automation, heartbeat_s

    _, bound_s = ensure_crash_automation()
    print(f"flow runs without a heartbeat for {bound_s} s are marked Crashed (workers must send one "
          f"every {heartbeat_s()} s: PREFECT_FLOWS_HEARTBEAT_FREQUENCY)")
    print(f"deployed {len(ids)} deployments to work pool {args.pool}")
    return 0


CANCEL_WAIT_S = float(os.environ.get("KKTLAB_CANCEL_WAIT_S", "60"))  # how long `kktlab cancel` waits for the run to let go


def cmd_cancel(args) -> int:
    """Stop the run computing ``store`` (issue 30 item 1): its Prefect flow run is set Cancelling
    first (the server then lets it end only Cancelled; a Prefect worker stops the flow process, and
    with it a local Dask cluster), then its bundles are asked to stop (the group's cancel request,
    which every worker, local or at an ``address``, sees at its next progress report:
    flows/bundle_progress.py; a run they stop ends itself Cancelled: flows/served.py); waits until
    the run has let go of its groups. Checkpoints and stored cells stay: the same run / submit resumes."""
    import pathlib

    from storage import bundle_progress, runlock

    store = args.store.rstrip("/")
    locks = sorted(pathlib.Path(store + runlock.SUFFIX).glob("*.lock"))
    held = {p.stem: info for p in locks if (info := runlock.held_by(store, p.stem)) is not None}
    if not held:
        print(f"kktlab: no run computes {store} now; nothing to cancel")
        return 0
    runs = {info["flow_run_id"]: info.get("flow_run_url") or info["flow_run_id"]
            for info in held.values() if info.get("flow_run_id")}
    for run_id, where in runs.items():  # first: the server then lets it end only Cancelled
        print(f"kktlab: flow run {where}: {_cancel_flow_run(run_id, where)}", flush=True)
    for group, info in held.items():
        bundle_progress.request_cancel(store, group, "kktlab cancel")
        print(f"kktlab: group '{group}': its bundles are asked to stop ({runlock.describe(info)})", flush=True)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline and any(runlock.held_by(store, g) is not None for g in held):
        time.sleep(0.5)
    left = [g for g in held if runlock.held_by(store, g) is not None]
    if left:
        print(f"kktlab: error: the run still holds {', '.join(left)} after {CANCEL_WAIT_S:.0f} s (a bundle that "
              f"reports no progress runs on until it ends); `kktlab status {store}` shows it", file=sys.stderr)
        return 1
    print(f"kktlab: stopped; the cells stored stay and checkpoints are kept: the same command resumes "
          f"(`kktlab status {store}`)")
    return 0


def _cancel_flow_run(run_id: str, url: str) -> str:
    """Set the flow run Cancelling (what the UI's Cancel does) on the server its lock record names;
    a few words of how it went."""
    api = url.split("/runs/flow-run/")[0] + "/api" if "/runs/flow-run/" in url else None
    if not api:
        return "its server is not recorded; its bundles stop anyway"
    try:
        from deploy.probe import check_prefect_api
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings
        from prefect.states import Cancelling

        check_prefect_api(api)  # 3 s at most (an embedded server of a `kktlab run` is gone with its run)
        with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            state = client.read_flow_run(run_id).state
            if state is not None and state.is_final():
                return f"already {state.name}"
            client.set_flow_run_state(run_id, Cancelling(message="kktlab cancel"), force=True)
            return "Cancelling"
    except Exception as err:  # noqa: BLE001 - the bundles stop anyway (the cancel request beside the store)
        return f"its server {api} did not take the cancel ({type(err).__name__}); its bundles stop anyway"
