"""What the Prefect UI shows of a run (issue 30): its name and tags, one progress card per stage
updated in place, and on completion a table of each stage's counts and where the results are.

The root flow run (the one ``kktlab submit`` printed, or ``kktlab run``'s sweep) is named
``<config> @ <store>`` and tagged ``kktlab``, ``config:<name>``, ``experiment:<e>`` (each stage's)
and ``store:<path>``. Per stage it carries a progress artifact (bar + the progress line as its
description) and a markdown artifact with the same line, both created once per run and updated in
place (a keyed artifact's page shows the newest run's, kept current). When every stage has run:
a table artifact of the stages' counts and a markdown artifact naming the store and
``kktlab report STORE --out DIR``; on a served run (:func:`results_tables`), per stage its summary
table, and (kktlab/served_flow.py, through :func:`post`) its acceptance table and the chain's findings. Everything here is best effort: the store is
the truth, and a server that does not answer never stops a sweep."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re

TAG = "kktlab"


def display_store(path) -> str:
    """``results/chain-small.zarr`` under the current directory, else the absolute path."""
    p = pathlib.Path(os.path.abspath(path))
    try:
        return str(p.relative_to(os.getcwd()))
    except ValueError:
        return str(p)


def run_name(config_name: str, store) -> str:
    """``chain-small @ results/chain-small.zarr``."""
    return f"{config_name} @ {display_store(store)}"


def run_tags(config_name: str, experiments, store) -> list[str]:
    """``kktlab``, ``config:<name>``, ``experiment:<e>`` for each distinct experiment, ``store:<path>``."""
    exps = list(dict.fromkeys(experiments))
    return [TAG, f"config:{config_name}", *(f"experiment:{e}" for e in exps), f"store:{display_store(store)}"]


def key(store, suffix: str) -> str:
    """``kktlab-<store name>-<suffix>``: lowercase letters, digits and dashes (Prefect's rule)."""
    name = pathlib.Path(str(store)).name.removesuffix(".zarr")
    return re.sub(r"[^a-z0-9-]+", "-", f"kktlab-{name}-{suffix}".lower()).strip("-")[:100]


def _client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


_AT_ONCE: list = [None, None]  # (the settings it was made from, those settings without retries)


def _at_once():
    """Prefect's client settings for a call that is skipped, not retried, while the server is away
    (an update made again at the next progress line): no retries and no backoff. The calls made
    once per run (the name, the cards' creation, the summary) keep Prefect's retries, which ride
    out a restart of the server in a served run (deploy/api_retry.py). Prefect's
    ``temporary_settings`` rebuilt and validated the whole settings model on every progress update
    (~26 ms); the copy is made once per settings object the context holds."""
    import prefect.context
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    context = prefect.context.get_settings_context()
    if _AT_ONCE[0] is not context.settings:
        _AT_ONCE[:] = [context.settings, context.settings.copy_with_update(updates={PREFECT_CLIENT_MAX_RETRIES: 0})]
    return prefect.context.SettingsContext(profile=context.profile, settings=_AT_ONCE[1])


def root_run() -> tuple[str | None, dict]:
    """The root flow run's id and the current flow run's parameters (outside a flow run: None, {})."""
    try:
        from prefect.runtime import flow_run

        run_id = flow_run.root_flow_run_id or flow_run.id
        return (str(run_id) if run_id else None), dict(flow_run.parameters or {})
    except Exception:  # noqa: BLE001 - outside a flow run
        return None, {}


def label(store, stages) -> None:
    """Name the root flow run ``<config> @ <store>`` (unless ``kktlab submit`` named it so already)
    and add the run's tags to it."""
    run_id, params = root_run()
    if not run_id:
        return
    config = params.get("config") if isinstance(params.get("config"), dict) else {}
    name = config.get("name") or stages[0].name
    try:
        with _client() as client:
            run = client.read_flow_run(run_id)
            tags = list(dict.fromkeys([*(run.tags or []), *run_tags(name, [s.experiment for s in stages], store)]))
            new_name = run.name if " @ " in (run.name or "") else run_name(name, store)
            if new_name != run.name or tags != list(run.tags or []):
                client.update_flow_run(run_id, name=new_name, tags=tags)
    except Exception:  # noqa: BLE001 - the UI is best effort
        pass


class StageCards:
    """A stage's progress artifact and markdown line on the root flow run, created once, then
    updated in place (no new card per update)."""

    def __init__(self, store, stage: str, percent: float, line: str):
        self.run_id, _ = root_run()
        self.ids: dict[str, object] = {}
        if not self.run_id:
            return
        from prefect.client.schemas.actions import ArtifactCreate

        stage_key = key(store, stage)
        try:
            with _client() as client:
                for kind, k, data in (("progress", f"{stage_key}-progress", percent), ("markdown", stage_key, line)):
                    self.ids[kind] = client.create_artifact(ArtifactCreate(
                        key=k, type=kind, data=data, description=line if kind == "progress" else f"kktlab {stage}",
                        flow_run_id=self.run_id)).id
        except Exception:  # noqa: BLE001 - the UI is best effort
            pass

    def update(self, percent: float, line: str) -> None:
        """Best effort and at once: a server that does not answer skips this update (the next one
        puts the card right), it never holds up the sweep; the last one (100%) waits as long as
        Prefect's retries do."""
        if not self.ids:
            return
        from prefect.client.schemas.actions import ArtifactUpdate

        try:
            with (_at_once() if percent < 100.0 else contextlib.nullcontext()), _client() as client:
                if "progress" in self.ids:
                    client.update_artifact(self.ids["progress"], ArtifactUpdate(data=percent, description=line))
                if "markdown" in self.ids:
                    client.update_artifact(self.ids["markdown"], ArtifactUpdate(data=line))
        except Exception:  # noqa: BLE001 - the UI is best effort
            pass


COUNTS = ("total", "done_before", "computed", "from_cache", "written", "failed", "refused_done", "bundles")


def summary_rows(stats: list[dict], experiments: list[str]) -> list[dict]:
    """One row per stage: its group, experiment and counts."""
    return [{"stage": st["group"], "experiment": exp, **{c: int(st.get(c, 0)) for c in COUNTS},
             "wall_s": round(float(st.get("wall_s", 0.0)), 1)} for st, exp in zip(stats, experiments)]


def results_markdown(store, rows: list[dict], lines: list[str]) -> str:
    path = os.path.abspath(store)
    out = [f"## Results: `{path}`", "", "Figures and the acceptance table:", "",
           f"```\nkktlab report {path} --out DIR\n```", "", f"Cells per stage: `kktlab status {path}`", ""]
    out += [f"- **{r['stage']}** ({r['experiment']}): {r['total']} cells, {r['written']} written by this run, "
            f"{r['done_before']} done before" + (f", {r['failed']} failed" if r["failed"] else "") for r in rows]
    return "\n".join(out + [""] + [f"    {line}" for line in lines]) + "\n"


def finish(store, stats: list[dict], experiments: list[str], lines: list[str]) -> None:
    """The root flow run's table of the stages' counts and its markdown with the store and the report command."""
    run_id, _ = root_run()
    if not run_id:
        return
    from prefect.client.schemas.actions import ArtifactCreate

    rows = summary_rows(stats, experiments)
    try:
        with _client() as client:
            client.create_artifact(ArtifactCreate(key=key(store, "summary"), type="table", data=json.dumps(rows),
                                                  description=f"kktlab: cells per stage of {display_store(store)}",
                                                  flow_run_id=run_id))
            client.create_artifact(ArtifactCreate(key=key(store, "results"), type="markdown",
                                                  data=results_markdown(store, rows, lines),
                                                  description="kktlab: where the results are", flow_run_id=run_id))
    except Exception:  # noqa: BLE001 - the UI is best effort
        pass


def results_tables(store, groups: list[str]) -> None:
    """``kktlab show``'s numbers, readable in the Prefect UI (issue 43), on the root flow run: per stage
    its summary (:func:`storage.query.summary_frame`: the statistics layer's means over seeds of the
    usable cells, ``n_used`` beside) as a table artifact ``<store>-<stage>-summary``. Called by the
    served flow only (flows/served.py): an embedded server's UI ends with its run. (The acceptance
    and findings tables are analysis/'s, a room above flows/: kktlab/served_flow.py posts them.)"""
    run_id, _ = root_run()
    if not run_id:
        return
    from prefect.client.schemas.actions import ArtifactCreate

    from storage.query import open_results, summary_frame

    try:
        with _client() as client:
            for g in groups:
                ds = open_results(store, g)
                rows = summary_frame(ds).reset_index().to_json(orient="records")  # NaN -> null
                client.create_artifact(ArtifactCreate(key=key(store, f"{g}-summary"), type="table", data=rows,
                                                      description=f"kktlab: {g} ({ds.attrs.get('kktlab_experiment')}), "
                                                      "means over seeds of the usable cells (kktlab show)",
                                                      flow_run_id=run_id))
    except Exception:  # noqa: BLE001 - the UI is best effort
        pass


def post(store, artifacts: list[dict]) -> None:
    """Post ``artifacts`` (dicts of ``suffix``, ``type`` ("table" or "markdown"), ``data``, ``description``)
    on the root flow run, each keyed :func:`key` (``store``, suffix); nothing outside a flow run."""
    run_id, _ = root_run()
    if not run_id or not artifacts:
        return
    from prefect.client.schemas.actions import ArtifactCreate

    try:
        with _client() as client:
            for a in artifacts:
                data = json.dumps(a["data"]) if a["type"] == "table" else a["data"]
                client.create_artifact(ArtifactCreate(key=key(store, a["suffix"]), type=a["type"], data=data,
                                                      description=a["description"], flow_run_id=run_id))
    except Exception:  # noqa: BLE001 - the UI is best effort
        pass
