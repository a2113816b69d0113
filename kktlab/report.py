"""``kktlab report STORE [STORE ...] --out DIR``: every paper figure the stores can draw, as PNG
(300 dpi) with an SVG twin beside it, ``index.md`` and ``index.html`` (captions, configs,
provenance), and the acceptance table of every paper claim the stores have data for (also echoed
to the terminal). A figure without data is not drawn; the report says so instead."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from typing import Callable

from analysis import acceptance as acc
from analysis import common
from kktlab import report_html
from storage.query import chain_order, open_checked, provenance, stage_scalars, status

# What each experiment draws and judges is in its declaration (core.declare.Experiment.figures /
# .acceptance: modules of analysis/), so a new stage is one declaration plus its maths.
# modules in analysis/ with ``store_acceptance(store) -> [Row]``: claims that compare several groups of one
# store per test point (paper 003 X3: single step vs DeepFool vs PGD on the same nets)
STORE_ACCEPTANCE = ("analysis.acceptance_003",)


@dataclasses.dataclass
class Section:
    """One group of one store (or a store's cross-group part) as the HTML page shows it."""
    store: str
    title: str
    group: str = ""  # the store's group this section shows ("" for the chain's and the cross-group part)
    info: dict = dataclasses.field(default_factory=dict)  # provenance and cells done
    config: str = ""
    rows: list = dataclasses.field(default_factory=list)  # acceptance rows
    about: str = ""  # what the paper's figures show: the analysis module's docstring
    notes: list = dataclasses.field(default_factory=list)  # markdown lines: seeds per point, left out
    figures: list = dataclasses.field(default_factory=list)  # (path relative to out, caption)
    not_drawn: list = dataclasses.field(default_factory=list)  # (file name, why)
    text: str = ""  # a line in place of figures (e.g. none registered)


def _declared(exp: str):
    from flows import experiments

    return experiments.get(exp) if exp in experiments.names() else None


def acceptance_rows(ds) -> list[acc.Row]:
    """The acceptance rows of one experiment group ([] when none are registered)."""
    decl = _declared(ds.attrs.get("kktlab_experiment", "?"))
    return importlib.import_module(decl.acceptance).acceptance(ds) if decl and decl.acceptance else []


def _drawn(figs, section: Section, out: pathlib.Path, lines: list[str], prefix: str = "",
           claims: dict | None = None) -> list[pathlib.Path]:
    """The figures ``figs`` that were written (their captions and SVG twins to ``section``); those
    not drawn are named in ``lines`` with why. A figure a paper claim is about (``claims``, the figures
    module's ``CLAIMS``) says under it how this store compares with the paper (``section.rows``)."""
    not_drawn, captions = common.take_records()
    kept = [f for f in figs if f.exists()]
    for f in kept:
        paper = acc.against_paper(f.stem.removeprefix(prefix), claims or {}, section.rows)
        caption = "\n".join([captions.get(f.name, ""), *paper]).strip()
        section.figures.append((f.relative_to(out).as_posix(), caption))
        lines += [f"![{f.stem}]({f.relative_to(out).as_posix()})", *(f"- {line}" for line in paper)]
    for name, why in not_drawn:
        section.not_drawn.append((name, why))
        lines.append(f"- not drawn: `{name}`: {why}")
    return kept


@dataclasses.dataclass
class Written:
    """What :func:`write` wrote and judged: the served flow posts its tables as the run's artifacts
    (kktlab/served_flow.py) instead of reading and judging the store a second time."""
    paths: list[pathlib.Path]  # the PNGs (each with its .svg twin), index.md and index.html
    sections: list[Section]  # each group's acceptance rows in ``rows``, its name in ``group``
    findings: list[str]  # the chain's findings (markdown, without its figures): none without an unlearn stage


def _store(store, out: pathlib.Path, fig_dir: pathlib.Path, echo) -> tuple[list[str], list[Section], list, list]:
    """index.md lines, HTML sections, the PNG paths and the chain's findings lines of one store, its
    figures in ``fig_dir``."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths: list[pathlib.Path] = []
    sections: list[Section] = []
    lines = [f"# kktlab report for `{store}`", ""]
    done = {r["group"]: r for r in status(store)}
    common.take_records()
    scalars = {}  # each group read once: its section, then the chain's findings
    for g in chain_order(store):  # upstream first, as the chain runs
        ds = scalars[g] = stage_scalars(store, g)
        exp = ds.attrs.get("kktlab_experiment", "?")
        prov = provenance(ds)
        bad = int(ds["damaged"].sum()) if "damaged" in ds else 0  # left out of every figure and row
        cells = f"{done[g]['done']}/{done[g]['total']}" + (f", {bad} damaged (left out; `kktlab verify`)" if bad else "")
        sec = Section(str(store), f"{g} ({exp})", group=g, config=str(ds.attrs.get("config", "")),
                      info={"cells done": cells, **prov})
        sections.append(sec)
        lines += [f"## {g} ({exp})", "",
                  f"cells done {cells}, git {prov.get('git_commit')}, "
                  f"device {prov.get('device')}, created {prov.get('created')}", ""]
        sec.rows = rows = acceptance_rows(ds)
        if rows:
            lines += ["### Acceptance", "", acc.markdown(rows), ""]
            echo(f"== {g} ({exp}): acceptance")
            echo(acc.text(rows))
        decl = _declared(exp)
        if decl and decl.produces and not decl.figures:
            sec.text = "(its nets are drawn with the stages that read them)"
            lines += [sec.text, ""]
            continue
        if not decl or not decl.figures:
            sec.text = "(no figures registered for this experiment)"
            lines += [sec.text, ""]
            continue
        module = importlib.import_module(decl.figures)
        sec.about = (module.__doc__ or "").strip()
        figs = module.figures(ds, fig_dir, prefix=f"{g}_")
        if hasattr(module, "sample_figures"):  # figures from per-sample variables (paper 003 Fig 7)
            figs += module.sample_figures(open_checked(store, g), fig_dir, prefix=f"{g}_")
        sec.notes = notes = module.notes(ds) if hasattr(module, "notes") else []
        if notes:
            lines += ["### Seeds per point", "", *notes]
            echo(f"== {g} ({exp}): {notes[0]}")
        paths += _drawn(figs, sec, out, lines, f"{g}_", getattr(module, "CLAIMS", {}))
        lines.append("")
    from analysis import pipeline

    figs, chain_lines = pipeline.store_figures(store, fig_dir, scalars)  # the cross-paper chain (issue 27)
    findings = [ln for ln in chain_lines if not ln.startswith("![")]
    if chain_lines:
        sec = Section(str(store), "the chain: forgotten vs retained points",
                      notes=[ln for ln in chain_lines if not ln.startswith(("#", "!["))])
        sections.append(sec)
        lines += findings
        paths += _drawn(figs, sec, out, lines)
        lines.append("")
        echo("== the chain: forgotten vs retained points")
        echo("\n".join(line for line in chain_lines if line.startswith("|")))
    rows = [r for name in STORE_ACCEPTANCE for r in importlib.import_module(name).store_acceptance(store)]
    if rows:
        sections.append(Section(str(store), "across groups", rows=rows))
        lines += ["## Across groups", "", "### Acceptance", "", acc.markdown(rows), ""]
        echo("== across groups: acceptance")
        echo(acc.text(rows))
    return lines, sections, paths, findings


def report(store, out: str | pathlib.Path, echo: Callable[[str], None] | None = None) -> list[pathlib.Path]:
    """Draw every figure of every group of ``store`` (one path, or a list of them) into ``out``, write
    ``out/index.md`` and ``out/index.html`` with the figures, captions, seed counts, configs,
    provenance and acceptance tables; ``echo`` (e.g. ``print``) gets the tables as text. Of several
    stores, each one's figures go to ``out/<store name>/``. Returns the PNGs written (each has its
    ``.svg`` twin beside it), ``index.md`` and ``index.html``."""
    return write(store, out, echo).paths


def write(store, out: str | pathlib.Path, echo: Callable[[str], None] | None = None) -> Written:
    """:func:`report`, with the sections and findings it judged."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    echo = echo or (lambda line: None)
    stores = [store] if isinstance(store, (str, pathlib.Path)) else list(store)
    paths: list[pathlib.Path] = []
    lines: list[str] = []
    sections: list[Section] = []
    findings: list[str] = []
    used: set[str] = set()
    for s in stores:
        sub = ""
        if len(stores) > 1:  # a folder per store: the same group names in two stores do not collide
            sub = pathlib.Path(s).name.removesuffix(".zarr") or "store"
            while sub in used:
                sub += "_"
            used.add(sub)
        more, secs, figs, found = _store(s, out, out / sub if sub else out, echo)
        lines += more
        sections += secs
        paths += figs
        findings += found
    index = out / "index.md"
    index.write_text("\n".join(lines))
    page = out / "index.html"
    page.write_text(report_html.page([str(s) for s in stores], sections))
    return Written(paths + [index, page], sections, findings)
