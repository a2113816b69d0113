"""The flow a Prefect deployment runs (entrypoint ``kktlab/served_flow.py:submit``, deploy/prefect_deploy.py):
flows/served.py's sweep, then what ``kktlab report`` would print, as artifacts of the run in the
Prefect UI (issue 43): per stage its acceptance table (every paper claim it can judge), and for a
chain that reads an ``unlearn`` stage the findings table (forgotten vs retained points). Beside each
stage's summary table (flows/run_ui.py), and a link to the report's figures (written beside the store,
``<store>.report/``). Best effort, as all of the UI: the store is the truth."""

from __future__ import annotations

import pathlib

from prefect import flow

from flows.served import FLOW_NAME, run_submitted


@flow(name=FLOW_NAME, log_prints=True, validate_parameters=False)
def submit(config_path: str, store: str | None = None, overrides: dict | None = None, force: bool = False,
           verbose: bool = False, wait: bool = False):
    """Run the sweep of ``config_path`` into ``store`` (flows/served.py :func:`run_submitted`: the same
    parameters), then post the report's tables on this run."""
    done = run_submitted(config_path, store, overrides, force, verbose, wait)
    if not isinstance(done, tuple):  # Cancelled
        return done
    cfg, path, stats = done
    from flows import run_ui
    from kktlab.report import write

    groups = [stage.name for stage in cfg.stages]
    try:  # the report read and judged the store once: its tables are the artifacts
        written = write(path, report_dir(path))
        arts = artifacts({s.group: s.rows for s in written.sections if s.group in groups}, written.findings)
        arts.append(report_link(path, written.paths))
    except Exception as err:  # noqa: BLE001 - the store is done; the tables alone, and why there is no report
        arts = report_artifacts(path, groups)
        arts.append({"suffix": "report", "type": "markdown", "description": "kktlab: the report, not written",
                     "data": f"The report was not written: {type(err).__name__}: {err}. `kktlab report {path} "
                             f"--out DIR` writes it from the store."})
    run_ui.post(path, arts)
    return stats


def report_dir(store) -> pathlib.Path:
    """Where a served run writes its report: ``<store>.report/`` beside the store (as its ``.cache``)."""
    return pathlib.Path(str(store) + ".report")


def report_link(store, paths: list[pathlib.Path]) -> dict:
    """A markdown artifact (key ``<store>-report``) that links the index.html and each figure of
    ``kktlab report STORE --out <store>.report`` (``paths``: what it wrote), with the command that writes
    it again: the report's figures from the run's page in the UI (issue 43)."""
    out = report_dir(store)
    figures = [p for p in paths if p.suffix == ".png"]
    lines = [f"**The report** of `{store}`: [index.html]({(out / 'index.html').resolve().as_uri()}) "
             f"({len(figures)} figures, each with its .svg twin; `kktlab report {store} --out {out}` "
             "writes it again)", ""]
    lines += [f"- [{p.relative_to(out)}]({p.resolve().as_uri()})" for p in figures]
    if not figures:
        lines.append("- no figure drawn (index.html says why)")
    return {"suffix": "report", "type": "markdown", "data": "\n".join(lines),
            "description": f"kktlab: the report's figures, written to {out}"}


def report_artifacts(store, groups: list[str]) -> list[dict]:
    """The acceptance table of each group in ``groups`` that has acceptance rows (key
    ``<store>-<group>-acceptance``) and the chain's findings (markdown, key ``<store>-findings``),
    as :func:`flows.run_ui.post` takes them; what ``kktlab report`` prints, without its figures (the
    served flow's fallback where the report cannot be written)."""
    from analysis import pipeline
    from kktlab.report import acceptance_rows
    from storage.query import stage_scalars

    scalars = {g: stage_scalars(store, g) for g in groups}
    return artifacts({g: acceptance_rows(ds) for g, ds in scalars.items()}, pipeline.store_figures(store, None, scalars)[1])


def artifacts(acceptance: dict[str, list], findings: list[str]) -> list[dict]:
    """The artifacts of each group's acceptance rows (``acceptance``: by group; groups without rows get
    none) and of the chain's ``findings`` lines."""
    out = []
    for g, rows in acceptance.items():
        if rows:
            out.append({"suffix": f"{g}-acceptance", "type": "table",
                        "data": [{"spec": r.spec_id, "criterion": r.criterion, "measured": r.measured or "-",
                                  "threshold": r.threshold, "result": r.verdict, "note": r.note} for r in rows],
                        "description": f"kktlab: {g}, the paper claims its data can judge (kktlab report)"})
    if findings:
        out.append({"suffix": "findings", "type": "markdown", "data": "\n".join(findings),
                    "description": "kktlab: the chain's findings, forgotten vs retained points (kktlab report)"})
    return out
