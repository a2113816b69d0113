"""What a Prefect deployment runs: a config path (+ overrides) -> a sweep.

One deployment per experiment (``kktlab-submit/<experiment>``) on a process work pool; a
worker runs the flow ``kktlab/served_flow.py:submit`` in a child process that reads the config from
the shared filesystem and runs the sweep flow (a subflow) on the config's Dask runner
(:func:`run_submitted`, here); the flow then puts the report's tables in the UI, which is
analysis/'s work, a room above this one. See deploy/prefect_deploy.py.
"""

from __future__ import annotations

FLOW_NAME = "kktlab-submit"


def run_submitted(config_path: str, store: str | None = None, overrides: dict | None = None, force: bool = False,
                  verbose: bool = False, wait: bool = False):
    """Run the sweep of ``config_path`` (with top-level ``overrides``) into ``store``; ``verbose``
    (``kktlab submit --verbose``): the local cluster's and prefect-dask's INFO lines in the logs;
    ``wait`` (``kktlab submit --wait``): wait for another run computing one of its groups instead of
    failing (storage/runlock.py). Returns (config, store path, the stages' counts), or a Cancelled
    state when ``kktlab cancel`` stopped the run (it ends Cancelled, not Failed); the summary table of
    each stage is in the UI then (flows/run_ui.py)."""
    from deploy import api_retry, runtime
    from flows import config as config_mod
    from flows.bundle_progress import BundleCancelled
    from flows.sweep import run

    api_retry.install()  # the run's fresh Prefect clients ride out a restart of the server (deploy/api_retry.py)
    runtime.quiet_env(verbose)
    runtime.quiet_logs(verbose)
    cfg = config_mod.load(config_path, overrides or {})
    path = cfg.store_path(store)
    try:
        stats = run(cfg, path, force=force, wait=wait)
    except BundleCancelled as err:  # `kktlab cancel`: this run ends Cancelled (not Failed), whoever stopped it
        from prefect.states import Cancelled

        return Cancelled(message=str(err))
    for st in stats if isinstance(stats, list) else [stats]:  # a chain: one per stage
        print(f"kktlab: {st['written']} cells written to {path} group {st['group']} "
              f"({st['done_before']} were done before, {st['total']} in all)")
    from flows import run_ui

    run_ui.results_tables(path, [stage.name for stage in cfg.stages])  # kktlab show's numbers, in the UI
    return cfg, path, stats
