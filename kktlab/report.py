"""``kktlab report STORE --out DIR``: every paper figure a store can draw, as PNG + index.md, and
the acceptance table of every paper claim the store has data for (also echoed to the terminal)."""

from __future__ import annotations

import importlib
import pathlib
from typing import Callable

from analysis import acceptance as acc
from storage.query import groups, open_results, provenance, stage_scalars, status

# What each experiment draws and judges is in its declaration (core.declare.Experiment.figures /
# .acceptance: modules of analysis/), so a new stage is one declaration plus its maths.
# modules in analysis/ with ``store_acceptance(store) -> [Row]``: claims that compare several groups of one
# store per test point (paper 003 X3: single step vs DeepFool vs PGD on the same nets)
STORE_ACCEPTANCE = ("analysis.acceptance_003",)


def _declared(exp: str):
    from flows import experiments

    return experiments.get(exp) if exp in experiments.names() else None


def acceptance_rows(ds) -> list[acc.Row]:
    """The acceptance rows of one experiment group ([] when none are registered)."""
    decl = _declared(ds.attrs.get("kktlab_experiment", "?"))
    return importlib.import_module(decl.acceptance).acceptance(ds) if decl and decl.acceptance else []


def report(store: str | pathlib.Path, out: str | pathlib.Path,
           echo: Callable[[str], None] | None = None) -> list[pathlib.Path]:
    """Draw every figure of every group of ``store`` into ``out``, write ``out/index.md`` with the
    figures, seed counts and acceptance tables; ``echo`` (e.g. ``print``) gets the tables as text."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    echo = echo or (lambda line: None)
    paths: list[pathlib.Path] = []
    lines = [f"# kktlab report for `{store}`", ""]
    done = {r["group"]: r for r in status(store)}
    for g in groups(store):
        ds = stage_scalars(store, g)
        exp = ds.attrs.get("kktlab_experiment", "?")
        prov = provenance(ds)
        lines += [f"## {g} ({exp})", "",
                  f"cells done {done[g]['done']}/{done[g]['total']}, git {prov.get('git_commit')}, "
                  f"device {prov.get('device')}, created {prov.get('created')}", ""]
        rows = acceptance_rows(ds)
        if rows:
            lines += ["### Acceptance", "", acc.markdown(rows), ""]
            echo(f"== {g} ({exp}): acceptance")
            echo(acc.text(rows))
        decl = _declared(exp)
        if decl and decl.produces and not decl.figures:
            lines += ["(its nets are drawn with the stages that read them)", ""]
            continue
        if not decl or not decl.figures:
            lines += ["(no figures registered for this experiment)", ""]
            continue
        module = importlib.import_module(decl.figures)
        figs = module.figures(ds, out, prefix=f"{g}_")
        if hasattr(module, "sample_figures"):  # figures from per-sample variables (paper 003 Fig 7)
            figs += module.sample_figures(open_results(store, g), out, prefix=f"{g}_")
        notes = module.notes(ds) if hasattr(module, "notes") else []
        if notes:
            lines += ["### Seeds per point", "", *notes]
            echo(f"== {g} ({exp}): {notes[0]}")
        for f in figs:
            lines.append(f"![{f.stem}]({f.name})")
        lines.append("")
        paths += figs
    from analysis import pipeline

    figs, chain_lines = pipeline.store_figures(store, out)  # the cross-paper chain (issue 27)
    if chain_lines:
        lines += chain_lines
        paths += figs
        echo("== the chain: forgotten vs retained points")
        echo("\n".join(line for line in chain_lines if line.startswith("|")))
    rows = [r for name in STORE_ACCEPTANCE for r in importlib.import_module(name).store_acceptance(store)]
    if rows:
        lines += ["## Across groups", "", "### Acceptance", "", acc.markdown(rows), ""]
        echo("== across groups: acceptance")
        echo(acc.text(rows))
    index = out / "index.md"
    index.write_text("\n".join(lines))
    return paths + [index]
