"""docs/querying.md cannot rot (issue 31 item 2): every code block runs against a fresh store of
configs/chain-small.yaml (a smaller grid), from the folder that holds ``results/``; and a group is
self-describing (item 3): ``long_name`` and ``units`` on every variable and grid axis, a README.

Size: the blocks read whatever the store holds, so its two nets are trained to loss 1e-8 from lr 1e-3
(~2,600 steps) instead of the config's 1e-30 from 1e-5 (~12,000): still converged (status 1, every
point classified), which the usable-cell mask and the margins block need."""

from __future__ import annotations

import math
import pathlib
import re
import shlex

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "querying.md"
BLOCK = re.compile(r"```(python|bash)\n(.*?)```\n", re.S)


@pytest.fixture(scope="module")
def folder(prefect_server, cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    raw = yaml.safe_load((ROOT / "configs" / "chain-small.yaml").read_text())
    raw["stages"][0]["grid"] = {"d": [25], "seed": [0, 1]}
    raw["stages"][0]["params"].update(lr0=1e-3, target_loss=1e-8)
    (root / "chain-small.yaml").write_text(yaml.safe_dump(raw))
    res = cli.run("run", root / "chain-small.yaml", "--store", root / "results" / "chain-small.zarr", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return root


NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|\b(?:nan|NaN|inf)\b")
UPDATE = "KKTLAB_UPDATE_DOCS"  # set: the test writes what the blocks printed into docs/querying.md


def same_output(shown: str, printed: str, rtol: float = 1e-3) -> bool:
    """Whether ``printed`` is what the page shows: the same words (runs of blanks as one, so a table
    whose column widths change still matches) and the same numbers to ``rtol`` (another CPU's MKL
    path may change a trained net's last bits; 0.1 % is far above that, far below a wrong number)."""
    words = [re.sub(r"\s+", " ", NUMBER.sub("#", t)).strip() for t in (shown, printed)]
    nums = [[float(x) for x in NUMBER.findall(t)] for t in (shown, printed)]
    return words[0] == words[1] and len(nums[0]) == len(nums[1]) and all(
        (a != a and b != b) or math.isclose(a, b, rel_tol=rtol, abs_tol=1e-9) for a, b in zip(*nums))


def test_same_output_tells_a_changed_word_or_number_from_a_reflowed_table():
    shown = "   c_star  c_star_n\n0  0.1234       3\n1  1.5e-03       3"
    assert same_output(shown, "   c_star    c_star_n\n0  0.12341  3\n1  1.5e-03  3")
    assert not same_output(shown, shown.replace("0.1234", "0.1254"))
    assert not same_output(shown, shown.replace("c_star_n", "c_star_lo"))
    assert not same_output(shown, shown + "\n2  0.3  3")


@pytest.mark.requires_services
def test_every_block_of_the_querying_doc_runs_and_prints_what_the_page_shows(folder, monkeypatch, cli):
    """Every block runs; each python block that prints is followed on the page by a ``text`` block
    of what it prints (issue 45), compared by :func:`same_output`. ``KKTLAB_UPDATE_DOCS=1`` rewrites
    the page's output blocks from this run (docs/gen_tutorial.py's helpers, as the tutorial's)."""
    import os
    import sys

    sys.path.insert(0, str(ROOT / "docs"))
    import gen_tutorial

    text = DOC.read_text()
    blocks = BLOCK.findall(text)
    assert sum(kind == "python" for kind, _ in blocks) >= 6
    printed = gen_tutorial.printed_by_blocks(text, folder, "docs/querying.md")
    if os.environ.get(UPDATE):
        DOC.write_text(gen_tutorial.with_outputs(text, printed))
    shown = dict(re.findall(r"```python\n(.*?)```\n```text\n(.*?)\n```\n", text, re.S))
    for code, out in zip(gen_tutorial.BLOCK.findall(text), printed):
        assert bool(out) == (code in shown), ("a block's output shown / printed", code[:200])
        assert not out or same_output(shown[code], out), (f"set {UPDATE}=1 to rewrite the page", code[:200], out)
    monkeypatch.chdir(folder)
    for kind, code in blocks:
        for line in (ln.strip() for ln in code.splitlines()) if kind == "bash" else ():
            if not line.startswith("kktlab ") or line.startswith("kktlab run "):  # the store is made above
                continue
            res = cli.run(*shlex.split(line)[1:], cwd=folder)  # in this process, as in a shell in the folder
            assert res.returncode == 0, (line, res.stderr[-2000:])
    assert (folder / "c_star_by_attack.parquet").exists() and (folder / "robustness.parquet").exists()


@pytest.mark.requires_services
def test_a_group_describes_itself(folder):
    import xarray as xr

    for group in ("nets", "robustness"):
        ds = xr.open_zarr(folder / "results" / "chain-small.zarr", group=group, consolidated=False)
        for name in [*ds.data_vars, *ds[["done"]].dims]:
            units = ds[name].attrs.get("units") or ds[name].encoding.get("units")  # a CF time's units: in encoding
            text = ds[name].dtype.kind == "U"  # cell_host: a name, no units in CF
            assert ds[name].attrs.get("long_name") and (units or text), (group, name)
        assert {"title", "references", "README", "config"} <= set(ds.attrs), group


@pytest.mark.requires_services
def test_the_concepts_pages_blocks_run_and_its_config_parses(folder):
    """docs/concepts.md's python block runs against the same store (from the folder that holds
    results/), and each of its YAML blocks is a config kktlab accepts (issue 45: every code block runs)."""
    import sys

    from flows import config

    sys.path.insert(0, str(ROOT / "docs"))
    import gen_tutorial

    text = (ROOT / "docs" / "concepts.md").read_text()
    assert gen_tutorial.BLOCK.findall(text), "concepts.md has a python block"
    gen_tutorial.printed_by_blocks(text, folder, "docs/concepts.md")
    configs = re.findall(r"```yaml\n(.*?)```\n", text, re.S)
    assert configs
    for raw in configs:
        assert config.parse(yaml.safe_load(raw)).stages


@pytest.mark.requires_services
def test_the_running_pages_blocks_run_against_the_store_or_parse(folder, cli, tmp_path):
    """docs/running.md (issue 45: every code block runs): each ``kktlab`` line of its bash blocks
    runs in the folder that holds results/chain-small.zarr (the store it names), a ``run`` of a
    config there as ``--dry-run`` (it starts nothing); a line with placeholders (CONFIG, PATH,
    [MORE.zarr ...]) is parsed by kktlab's own parser; the python block runs; the YAML block is a grid
    a forging config accepts."""
    import sys

    from flows import config
    from kktlab.cli import parser

    sys.path.insert(0, str(ROOT / "docs"))
    import gen_tutorial

    text = (ROOT / "docs" / "running.md").read_text()
    lines = [ln.strip() for kind, code in BLOCK.findall(text) if kind == "bash" for ln in code.splitlines()]
    commands = [shlex.split(ln, comments=True)[1:] for ln in lines if ln.split(" ")[0].endswith("kktlab")]
    assert len(commands) >= 10
    ran = set()
    for args in commands:
        args = [a for a in args if not a.startswith("[") and not a.endswith("]")]  # [optional ...] left out
        if any(a.isupper() for a in args):  # placeholders: the options must exist
            parser().parse_args(args)
            continue
        args = [*args, "--dry-run"] if args[0] == "run" else args
        args = [str(tmp_path / "figs") if a == "figs/" else a for a in args]
        config_path = next((a for a in args[1:] if a.endswith(".yaml")), None)
        res = cli.run(*args, cwd=ROOT if config_path else folder)  # configs/ lies in the repository
        assert res.returncode == 0 and (res.stdout or res.stderr), (args, res.stderr[-2000:])
        ran.add(args[0])
    assert ran >= {"experiments", "run", "status", "verify", "show", "report", "table"}
    assert (folder / "chain-small.parquet").exists()
    assert gen_tutorial.printed_by_blocks(text, folder, "docs/running.md") == [""]  # its one block prints nothing
    grid = yaml.safe_load(re.search(r"```yaml\n(.*?)```\n", text, re.S).group(1))["grid"]
    raw = yaml.safe_load((ROOT / "configs" / "quickstart-forging.yaml").read_text())
    raw["grid"] = {**{k: v for k, v in raw["grid"].items() if k != "estimator"}, **grid}
    assert config.parse(raw).stages[0].n_cells > 0
