"""Write docs/tutorial.md from a finished store of configs/pipeline-small.yaml (issue 45): the tutorial's
question answered end to end, every number in the page written by this run. Each ``python`` block of
the template is executed in order (one namespace, from the folder that holds ``results/``) and what it
prints is written below it; the chain table is analysis/pipeline.py's, as ``kktlab report`` writes it.

    kktlab run configs/pipeline-small.yaml            # ~35 s on 2 cores: results/pipeline-small.zarr
    python docs/gen_tutorial.py [--root .]            # docs/tutorial.md (make tutorial does both)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "docs" / "tutorial.template.md"
OUT = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"```python\n(.*?)```\n", re.S)
SHOWN = re.compile(r"(```python\n.*?```\n)```text\n.*?```\n", re.S)  # a python block and the output shown below it


def printed_by_blocks(text: str, cwd: pathlib.Path, name: str = "<page>") -> list[str]:
    """What each python block of ``text`` prints, run in order in one namespace in ``cwd``."""
    namespace: dict = {}
    outs = []
    with contextlib.chdir(cwd):
        for m in BLOCK.finditer(text):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(m.group(1), name, "exec"), namespace)  # noqa: S102 - the page's own code
            outs.append(printed.getvalue().rstrip())
    return outs


def with_outputs(text: str, outs: list[str]) -> str:
    """``text`` with each python block followed by a ``text`` block of its output (``outs``, in order;
    an empty one shows nothing); output blocks already there are replaced."""
    text, it = SHOWN.sub(r"\1", text), iter(outs)
    return BLOCK.sub(lambda m: m.group(0) + (f"```text\n{o}\n```\n" if (o := next(it)) else ""), text)


def run_blocks(text: str, cwd: pathlib.Path) -> str:
    """``text`` with each python block followed by a ``text`` block of what it printed (run in ``cwd``)."""
    return with_outputs(text, printed_by_blocks(text, cwd, "<tutorial>"))


def chain_table(store: pathlib.Path) -> str:
    """The chain section of ``kktlab report``'s index (analysis/pipeline.py), headings one level down."""
    from analysis import pipeline

    with tempfile.TemporaryDirectory() as tmp:
        _, lines = pipeline.store_figures(store, tmp)
    keep = [ln for ln in lines if not ln.startswith("![")]
    return "\n".join(("#" + ln) if ln.startswith("## ") else ln for ln in keep).strip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=pathlib.Path, default=ROOT, help="the folder that holds results/")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    store = args.root / "results" / "pipeline-small.zarr"
    if not store.is_dir():
        raise SystemExit(f"{store} does not exist: run `kktlab run configs/pipeline-small.yaml` first")
    text = TEMPLATE.read_text()
    text = text.replace("<!-- chain table -->\n", chain_table(store))
    header = ("<!-- written by docs/gen_tutorial.py from results/pipeline-small.zarr (make tutorial); "
              "edit docs/tutorial.template.md -->\n")
    OUT.write_text(header + run_blocks(text, args.root))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
