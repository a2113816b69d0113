"""The ``kktlab`` command line: run, submit, cancel, deploy, status, verify, show, table, experiments, report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from core.errors import UserError
from kktlab import schema, served, stopping, tables
from kktlab.status_lines import left_out


def check_prefect_api() -> None:
    """A set API URL ($PREFECT_API_URL or the Prefect profile's) must answer now (else the sweep
    fails after retries, store made)."""
    from deploy.probe import api_url
    from deploy.probe import check_prefect_api as probe

    if api_url():
        probe(api_url())


# the commands that wrap Prefect's SIGTERM handler at start (the readers start in ~1 s); `run` wraps it
# once its configs are checked (cmd_run), so a bad config is refused without importing Prefect
FLOW_COMMANDS = ("submit", "cancel", "deploy")
SHOWN_DAMAGED = 5  # damaged cells named by status, show and run (verify names them all)
SHOW_ROWS = 200  # rows of `show`'s table before it averages over the last axes (--all: every cell)


def _declared(experiment: str) -> dict:
    """The declared variables of an experiment, name -> Var (storage/verify.py checks attributes by them)."""
    from flows import experiments

    return dict(experiments.get(experiment).variables) if experiment in experiments.names() else {}


def _verify(store: str, group: str | None = None) -> list:
    """storage/verify.py's report of each group (or of ``group``); metadata damage raises StoreError."""
    from storage.verify import find_groups, verify_group

    names = find_groups(store)
    if group is not None:
        if group not in names:
            raise UserError(f"{store} has no experiment group {group!r}; it has {names}")
        names = [group]
    return [verify_group(store, name, _declared) for name in names]


def _cells(n: int) -> str:
    return f"{n} cell" + ("" if n == 1 else "s")


def _damage_lines(store: str, report, limit: int | None = SHOWN_DAMAGED) -> list[str]:
    out = [f"  damaged: {p}" for p in report.problems]
    out += [f"  damaged: {line}" for line in report.lines(limit)]
    if report.damaged and limit is not None:
        out.append(f"  `kktlab verify {store}` lists every damaged cell; `kktlab run` on the config recomputes them")
    return out


def cmd_run(args) -> int:
    """Run one or more configs (in order) on one Prefect server; each resumes where it stopped. An
    embedded server, where one is needed, starts first: it starts while the configs are read and
    checked (issue 44), and is stopped if one is refused; with --wait, only once the wait is over."""
    from deploy import runtime

    server = None if args.dry_run or args.wait else runtime.embedded_server(args.verbose)
    try:
        return _run_configs(args, server)
    finally:
        if server is not None:
            server.stop()


def _run_configs(args, server) -> int:
    from flows import config as config_mod
    from kktlab import preflight

    overrides: dict = {}
    runner: dict = {}
    if args.dask_address is not None:
        runner.update(cluster="address", address=args.dask_address)
    runner.update({k: getattr(args, k) for k in ("workers", "max_cells", "device") if getattr(args, k) is not None})
    if runner:
        overrides["runner"] = runner
    if args.store and len(args.config) > 1:
        raise UserError("--store with several configs: give each config its own 'store' instead")
    if args.store is not None and not args.store.strip():
        raise UserError("--store is empty: give a path, or leave it out for the config's store")
    # every config is validated, its memory, store, output and services checked before any
    # store is made or any server or cluster starts
    cfgs = [config_mod.load(path, overrides) for path in args.config]
    for cfg in cfgs:
        config_mod.check_stages(cfg)
    if args.json is not None:
        preflight.file_for_writing(args.json, "--json")
    stores = [cfg.store_path(args.store) for cfg in cfgs]
    for store in stores:
        preflight.store(store, "--store" if args.store else "store")
    if args.dry_run:
        from kktlab.plan import print_plan

        print_plan(cfgs, stores)
        return 0
    check_prefect_api()
    from deploy.probe import check_scheduler

    for address in sorted({cfg.runner["address"] for cfg in cfgs if cfg.runner["cluster"] == "address"}):
        check_scheduler(address)
    # every check that can refuse a config or store runs, for every config and stage, before the
    # first group is made (and before Prefect and Dask are imported): a refused run leaves no new group
    from storage.store import check_kktlab_store

    planned: dict = {}
    for cfg, store in zip(cfgs, stores):
        check_kktlab_store(store)  # a file, a foreign folder or Zarr store: one line
        if os.path.exists(os.path.join(store, "zarr.json")):
            from storage.verify import find_groups

            find_groups(store)  # a group whose metadata is gone: one line, before anything runs
        for i, stage in enumerate(cfg.stages):  # an existing group of another experiment or grid: one line
            preflight.group(stage, store, planned, "" if cfg.stages[0] is cfg else f"stages[{i}].")
    from deploy import runtime

    runtime.quiet_env(args.verbose)
    runtime.quiet_logs(args.verbose)
    from flows.sweep import open_stores, run
    from kktlab.progress_view import terminal_bars
    from storage.query import open_results, summary

    for cfg, store in zip(cfgs, stores):
        open_stores(cfg.stages, store)  # then the groups are made, before the server
    all_stats = []
    stopping.install()
    try:
        # the run lock of every group (storage/runlock.py) before any server or cluster starts: another
        # run computing one of them refuses this one here, in one line, or (--wait) is waited for here
        with _run_locks(cfgs, stores, args.wait), runtime.prefect_api(server):  # both released on every way out
            for cfg, store in zip(cfgs, stores):
                for stage in cfg.stages:
                    print(f"[kktlab] {stage.experiment} '{stage.name}': {stage.n_cells} cells -> {store}",
                          file=sys.stderr)
                # damaged cells are found (once) and named when each stage is planned (flows/sweep.py::plan)
                with terminal_bars():  # live bars on a terminal (closed before the tables), else plain lines
                    ran = run(cfg, store, force=args.force, retry_failed=args.retry_failed, wait=args.wait)
                for stage, stats in zip(cfg.stages, ran if isinstance(ran, list) else [ran]):
                    _print_stage(stage, store, stats, summary(open_results(store, stage.name),
                                                              variables=stage.exp.summary))
                    all_stats.append(stats)
    except BaseException as err:
        if stopping.signalled(err):  # SIGTERM/SIGINT, whatever Prefect turned it into (TerminationSignal, Abort)
            _say_how_far(cfgs, stores)
        raise
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_stats[0] if len(all_stats) == 1 else all_stats, f, indent=2, default=str)
    n_failed = sum(st["failed"] for st in all_stats)
    if n_failed:
        print(f"kktlab: {n_failed} cells failed (their errors are above and in `kktlab status`); "
              "rerun with --retry-failed to compute them again", file=sys.stderr)
        return 3
    return 0


@contextlib.contextmanager
def _run_locks(cfgs, stores, wait: bool):
    """Hold the run lock of every group of every config, per store (flows.sweep.run finds them held)."""
    from storage import runlock

    groups: dict[str, set] = {}
    for cfg, store in zip(cfgs, stores):
        groups.setdefault(store, set()).update(stage.name for stage in cfg.stages)
    with contextlib.ExitStack() as stack:
        for store in sorted(groups):
            stack.enter_context(runlock.hold(store, groups[store], wait=wait))
        yield


def _print_stage(cfg, store, stats, table: str) -> None:
    print(f"\n== {cfg.experiment} / {cfg.name}")
    print(table)
    print(f"store: {os.path.abspath(store)}  group: {cfg.name}")
    print("cells: {total} total, {done_before} done before, {written} written now ({from_cache} of them from the "
          "result cache, {damaged_recomputed} damaged cells recomputed, {stale_recomputed} stale), {failed} failed, "
          "{refused_done} refused (already done), {bundles} bundles, {wall_s:.1f} s"
          .format(**stats))
    for line in stats["failures"]:
        print(f"  failed: {line}")
    left = left_out(store, cfg.name, cfg.experiment)
    if left:
        print(f"  left out by status: {left} (stored as not-a-result; figures, tables and the report leave them out)")


def _say_how_far(cfgs, stores) -> None:
    """After an interrupt: cells stored per config, and how to go on."""
    from storage.query import status

    for cfg, store in zip(cfgs, stores):
        for stage in cfg.stages:
            try:
                row = next((r for r in status(store) if r["group"] == stage.name), None)
            except Exception:  # noqa: BLE001 - a store not created yet
                row = None
            got = f"{row['done']}/{row['total']} cells stored" if row else "no cells stored"
            print(f"kktlab: interrupted: {stage.name}: {got} in {store}; the same command resumes", file=sys.stderr)


def cmd_status(args) -> int:
    """Cells done / total per group, and for a group part done the pace of its current run and an
    ETA (storage/pace.py); done cells that are damaged (storage/verify.py) are not counted as done
    but named below (exit status 1); stale done cells (storage/stale.py) are named too."""
    from storage import runlock
    from storage.bundle_progress import status_lines as inside_lines
    from storage.pace import pace
    from storage.query import status
    from storage.stale import status_lines as stale_lines

    rc = 0
    if not os.path.exists(args.store) and not os.path.exists(args.store + ".partial"):
        print(f"{args.store}: no store yet (nothing written; a submitted run creates it once a worker starts it: "
              "queued, or not submitted)")
        return 3
    if not os.path.exists(args.store):
        print(f"{args.store}: being created (its run is starting)")
        return 3
    reports = _verify(args.store)  # metadata damage: one line (StoreError) before anything else reads it
    failures = {row["group"]: row for row in status(args.store)}
    for r in reports:
        pct = 100 * r.sound / r.total if r.total else 100
        extra = f"  + {_cells(r.damaged)} damaged (done, values lost)" if r.damaged else ""
        row = failures.get(r.group, {})
        if row.get("failed"):
            extra += f"  ({_cells(row['failed'])} failed: `kktlab run --retry-failed` computes them again)"
        left = left_out(args.store, r.group, r.experiment)
        if left:
            extra += f"  ({left}: done, left out by status)"
        print(f"{r.group:<24} {r.experiment:<12} {r.sound:>7}/{r.total:<7} ({pct:.0f}%){extra}")
        p = pace(args.store, r.group, r.sound) if 0 < r.sound < r.total else None
        if p is not None:
            print(f"  {p.line()}")
        if r.sound < r.total and runlock.held_by(args.store, r.group) is not None:  # a run computes it now
            for line in inside_lines(args.store, r.group, SHOWN_DAMAGED):  # storage/bundle_progress.py
                print(line)
        for line in _damage_lines(args.store, r):
            print(line)
        for cell, err in list(row.get("failures", {}).items())[:SHOWN_DAMAGED]:
            print(f"  failed: {cell}: {err}")
        for line in stale_lines(args.store, r.group, SHOWN_DAMAGED):  # storage/stale.py
            print(line)
        rc = rc or int(not r.ok)
    return rc


def cmd_verify(args) -> int:
    """Every done cell has every variable readable (chunk present, checksum matching) and finite
    where declared; names each damaged cell. Exit status 1 when anything is damaged."""
    rc = 0
    for r in _verify(args.store, args.group):
        state = "ok" if r.ok else f"DAMAGED: {_cells(r.damaged)}" + (", whole arrays" if r.problems else "")
        print(f"{r.group} ({r.experiment}): {r.sound} of {r.total} cells done and sound, {state}")
        for line in _damage_lines(args.store, r, limit=None):
            print(line)
        for note in r.notes:
            print(f"  note: {note}")
        rc = rc or int(not r.ok)
    return rc


def cmd_show(args) -> int:
    from storage.query import groups, open_results, provenance, summary

    for r in _verify(args.store, args.group):  # never a summary over damaged cells
        if not r.ok:
            first = (r.problems + r.lines(1))[0]
            raise UserError(f"group '{r.group}' of {args.store} is damaged ({_cells(r.damaged)}; {first}): "
                            f"`kktlab verify {args.store}` lists it all, `kktlab run` on its config repairs it")
    for g in [args.group] if args.group else groups(args.store):
        ds = open_results(args.store, g, dask=False)
        print(f"== {g}")
        print(ds)
        print(json.dumps(provenance(ds), indent=1))
        print(summary(ds, variables=tables.summary_vars(ds), max_rows=None if args.all else SHOW_ROWS))
    return 0


def cmd_experiments(args) -> int:
    from flows import experiments

    for name in experiments.names():
        exp = experiments.get(name)
        print(f"{name}: {exp.description}\n  paper {exp.paper}\n  spec ids: {', '.join(exp.spec_ids)}")
        for pname, p in exp.params.items():
            default = "required" if p.default is experiments.REQUIRED else repr(p.default)
            print(f"    {pname:<16} {p.allowed():<36} default {default:<12} {p.doc}")
        print("  stores: " + ", ".join(exp.variables))
    return 0


def cmd_report(args) -> int:
    from kktlab import preflight
    from kktlab.report import report

    preflight.folder_for_writing(args.out, "--out")

    paths = report(args.store, args.out, echo=print)
    for p in paths:
        print(p)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stopping.install(prefect=args.cmd in FLOW_COMMANDS)
    try:
        return args.fn(args)
    except UserError as err:
        print(f"kktlab: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the file system or network refused; what was asked is in the message
        if stopping.signalled(err):
            return stopping.stopped()
        print(f"kktlab: error: {err}", file=sys.stderr)
        return 1
    except BaseException as err:
        if not stopping.signalled(err):
            raise
        return stopping.stopped()


def parser() -> argparse.ArgumentParser:
    """The command line's parser (docs/gen_reference.py writes the CLI reference from it)."""
    ap = argparse.ArgumentParser(prog="kktlab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a config's sweep (resumes; never overwrites done cells)")
    r.add_argument("config", nargs="+", help="one or more YAML configs, run in order")
    r.add_argument("--store", help="results store path (default: the config's store)")
    r.add_argument("--dask-address", help="use an existing Dask scheduler tcp://host:port")
    r.add_argument("--workers", type=int, help="local Dask worker processes")
    r.add_argument("--device", choices=("auto", "cpu", "cuda"))
    r.add_argument("--force", action="store_true", help="recompute and overwrite done cells")
    r.add_argument("--retry-failed", action="store_true", help="compute cells stored as failed again")
    r.add_argument("--json", help="write the run's statistics to this JSON file")
    r.add_argument("--dry-run", action="store_true", help="print cells, bundles, files and bytes; start nothing")
    r.add_argument("--wait", action="store_true", help="wait for another run computing a group of the store to finish")
    r.add_argument("--max-cells", type=int, help="allow a grid of up to this many cells (runner.max_cells)")
    r.add_argument("--verbose", action="store_true", help="Prefect's and Dask's INFO logs (the local cluster's too)")
    r.set_defaults(fn=cmd_run)
    s = sub.add_parser("submit", help="queue a config's sweep on a Prefect server (served mode)")
    s.add_argument("config")
    s.add_argument("--store")
    s.add_argument("--dask-address", help="run the sweep on this Dask scheduler")
    s.add_argument("--force", action="store_true")
    s.add_argument("--watch", action="store_true", help="follow the flow run to its end (progress per stage)")
    s.add_argument("--wait", action="store_true",
                   help="wait for another run computing a group of the store to finish, then queue")
    s.add_argument("--max-cells", type=int, help="allow a grid of up to this many cells (runner.max_cells)")
    s.add_argument("--verbose", action="store_true", help="the flow run logs Prefect's and Dask's INFO lines")
    s.set_defaults(fn=served.cmd_submit)
    s = sub.add_parser("deploy", help="create the work pool and one deployment per experiment (served mode)")
    s.add_argument("--pool", default="kktlab-pool")
    s.add_argument("--write-yaml", metavar="FILE", help="write the deployments as a prefect.yaml instead")
    s.set_defaults(fn=served.cmd_deploy)
    s = sub.add_parser("cancel", help="stop the run computing a store: its Prefect flow run and its Dask work")
    s.add_argument("store")
    s.set_defaults(fn=served.cmd_cancel)
    s = sub.add_parser("status", help="cells done / total per experiment")
    s.add_argument("store")
    s.set_defaults(fn=cmd_status)
    s = sub.add_parser("verify", help="check every done cell's values (chunks, checksums, finite); name damaged cells")
    s.add_argument("store")
    s.add_argument("--group")
    s.set_defaults(fn=cmd_verify)
    s = sub.add_parser("show", help="the xarray summary of a store")
    s.add_argument("store")
    s.add_argument("--group")
    s.add_argument("--all", action="store_true", help="every cell's row (default: averaged over the last axes past "
                                                        f"{SHOW_ROWS} rows)")
    s.set_defaults(fn=cmd_show)
    s = sub.add_parser("experiments", help="what can be run, with parameters")
    s.set_defaults(fn=cmd_experiments)
    tables.add_parser(sub)
    schema.add_parser(sub)
    s = sub.add_parser("report", help="the paper figures as PNG + SVG, index.md and index.html")
    s.add_argument("store", nargs="+", help="one or more stores (each one's figures in DIR/<store name>/)")
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_report)
    return ap


if __name__ == "__main__":
    sys.exit(main())
