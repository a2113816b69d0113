"""``index.html`` of ``kktlab report`` (issue 31 item 4): one self-contained page (relative image
links, inline style, no scripts) with, per group, its provenance, the config that made it
(collapsible), its figures with captions (PNG shown, PNG and SVG linked), the figures it could
not draw and why, and its acceptance table. Every text from a store is escaped."""

from __future__ import annotations

import datetime
import html
import json

CSS = """
body{font-family:system-ui,sans-serif;max-width:64rem;margin:1rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.15rem;border-top:1px solid #ccc;padding-top:.8rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.85rem}
td,th{border:1px solid #ccc;padding:.15rem .4rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}.pass{color:#006d2c}.FAIL{color:#b2182b;font-weight:bold}.nj{color:#777}
figure{display:inline-block;width:30rem;max-width:100%;vertical-align:top;margin:.5rem 1rem .5rem 0}
figure img{width:100%;border:1px solid #eee}figcaption{font-size:.8rem}
pre{background:#f7f7f7;padding:.5rem;overflow-x:auto;font-size:.8rem}.store{color:#555;font-size:.85rem}
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def _versions(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def info_table(info: dict) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(_versions(v))}</td></tr>" for k, v in info.items())
    return f'<table class="provenance">{rows}</table>' if rows else ""


def acceptance_table(rows) -> str:
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("spec prediction", "criterion", "measured", "threshold", "verdict", "note"))
    body = []
    for r in rows:
        cls = "pass" if r.passed else "nj" if r.passed is None else "FAIL"
        cells = (r.spec_id, r.criterion, r.measured or "-", r.threshold)
        body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells)
                    + f'<td class="{cls}">{esc(r.verdict)}</td><td>{esc(r.note)}</td></tr>')
    return f'<h3>Acceptance</h3><table class="acceptance"><tr>{head}</tr>{"".join(body)}</table>'


def markdown_block(lines: list[str]) -> str:
    """The report's markdown note lines: pipe tables as tables, other lines as paragraphs."""
    out, table = [], []

    def flush():
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= set("-: ")]
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
            head = "".join(f"<th>{esc(c)}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
            out.append(f"<table><tr>{head}</tr>{body}</table>")
            table.clear()

    for line in lines:
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.strip():
            out.append(f"<p>{esc(line)}</p>")
    flush()
    return "".join(out)


def figure(src: str, caption: str, seeds: str) -> str:
    name = src.rsplit("/", 1)[-1].removesuffix(".png")
    svg = src.removesuffix(".png") + ".svg"
    text = "<br>".join(esc(line) for line in caption.splitlines() if line.strip())
    return (f'<figure><a href="{esc(src)}"><img src="{esc(src)}" alt="{esc(name)}"></a><figcaption>'
            f"<b>{esc(name)}</b>" + (f": {text}" if text else "")
            + (f"<br><i>seeds and cells:</i> {esc(seeds)}" if seeds else "")
            + f' <a href="{esc(src)}">PNG</a> · <a href="{esc(svg)}">SVG</a></figcaption></figure>')


def section(sec) -> str:
    parts = [f"<section><h2>{esc(sec.title)}</h2>", f'<p class="store">store <code>{esc(sec.store)}</code></p>',
             info_table(sec.info)]
    if sec.config:
        parts.append(f"<details><summary>config</summary><pre>{esc(sec.config)}</pre></details>")
    if sec.about:
        parts.append(f"<details><summary>what the paper's figures show</summary><pre>{esc(sec.about)}</pre></details>")
    if sec.text:
        parts.append(f"<p>{esc(sec.text)}</p>")
    parts.append(acceptance_table(sec.rows))
    if sec.notes:
        parts.append("<h3>Seeds per point</h3>" + markdown_block(sec.notes))
    seeds = next((ln for ln in sec.notes if ln.strip() and not ln.startswith(("|", "#"))), "")
    if sec.figures:
        parts.append("<h3>Figures</h3>" + "".join(figure(src, cap, seeds) for src, cap in sec.figures))
    if sec.not_drawn:
        items = "".join(f"<li><code>{esc(n)}</code>: {esc(why)}</li>" for n, why in sec.not_drawn)
        parts.append(f"<h3>Not drawn</h3><ul>{items}</ul>")
    return "\n".join(p for p in parts if p) + "</section>"


def page(stores: list[str], sections: list) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    title = "kktlab report for " + ", ".join(stores)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n"
            f"<h1>{esc(title)}</h1><p class=\"store\">made {esc(now)}; stores: "
            f"{esc(json.dumps(stores))}</p>\n" + "\n".join(section(s) for s in sections) + "\n</body></html>\n")
