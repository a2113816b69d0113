"""``kktlab report STORE --out DIR``: every paper figure a store can draw, as PNG + index.md."""

from __future__ import annotations

import importlib
import pathlib

from storage.query import groups, open_results, provenance, status

# experiment -> module in analysis/ with ``figures(ds, out_dir, prefix) -> [paths]``
FIGURES = {"nonrobust": "analysis.nonrobust", "forging": "analysis.forging", "forging_sgd": "analysis.forging_sgd"}


def report(store: str | pathlib.Path, out: str | pathlib.Path) -> list[pathlib.Path]:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[pathlib.Path] = []
    lines = [f"# kktlab report for `{store}`", ""]
    done = {r["group"]: r for r in status(store)}
    for g in groups(store):
        ds = open_results(store, g)
        exp = ds.attrs.get("kktlab_experiment", "?")
        prov = provenance(ds)
        lines += [f"## {g} ({exp})", "",
                  f"cells done {done[g]['done']}/{done[g]['total']}, git {prov.get('git_commit')}, "
                  f"device {prov.get('device')}, created {prov.get('created')}", ""]
        if exp not in FIGURES:
            lines += ["(no figures registered for this experiment)", ""]
            continue
        module = importlib.import_module(FIGURES[exp])
        figs = module.figures(ds, out, prefix=f"{g}_")
        for f in figs:
            lines.append(f"![{f.stem}]({f.name})")
        lines.append("")
        paths += figs
    index = out / "index.md"
    index.write_text("\n".join(lines))
    return paths + [index]
