"""The docs site (issue 45): its reference pages are generated from the code and cover all of it, the
README stays short and its links into docs/ resolve. (`make docs` builds the site with --strict in CI.)"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_has_every_subcommand_and_option(gen):
    parser = gen.cli_parser()
    page = gen.cli_page()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices) >= 10
    for name, p in sub.choices.items():
        assert f"## kktlab {name}\n" in page, name
        for action in p._actions:
            for flag in action.option_strings:
                assert flag in page, (name, flag)


def test_the_config_page_has_every_experiment_parameter_and_variable(gen):
    from flows import experiments

    page = gen.config_page()
    for name in experiments.names():
        exp = experiments.get(name)
        section = page.split(f"## `{name}`\n", 1)[1].split("\n## `", 1)[0]
        for param in exp.params:
            assert f"| `{param}` |" in section, (name, param)
        for var in exp.variables:
            assert f"| `{var}` |" in section, (name, var)
        if exp.reads:
            assert f"### Which nets `{name}` reads" in section, name


def test_the_config_page_says_which_producers_unlearn_reads(gen):
    """The question a researcher could only answer from a refusal (issue 45): train_kkt's nets yes,
    train's yes for the GA step over W, b, v and for retraining (issue 39) but not for what needs a frozen
    output layer (ref_retrain), lazy nets yes but not for retraining."""
    page = gen.config_page()
    table = page.split("### Which nets `unlearn` reads", 1)[1].split("###", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| `")}
    assert "| yes |" in rows["`train_kkt`"]
    assert "| yes |" in rows["`train`"] and "`ref_retrain: True`" in rows["`train`"]
    assert "`unlearn_method: 'retrain'`" not in rows["`train`"]
    assert "| yes |" in rows["`lazy_train`"] and "`unlearn_method: 'retrain'`" in rows["`lazy_train`"]


def test_the_checkpoint_note_names_only_experiments_that_checkpoint(gen):
    from flows import experiments

    note = gen.checkpointing_note()
    for name in experiments.names():
        assert (f"`{name}`" in note) == experiments.get(name).checkpoints, name


def test_readme_is_short_and_its_doc_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\(((?:docs/)[^)#]+)", text)
    assert links, "the README links into docs/"
    for link in links:
        assert (ROOT / link).exists(), link


def test_every_page_of_the_nav_exists_or_is_generated(gen):
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # mkdocs' !relative tags
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    pages = []

    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            walk(value) if isinstance(value, list) else pages.append(value)

    walk(config["nav"])
    missing = [p for p in pages if not (ROOT / "docs" / p).exists() and p not in gen.PAGES]
    assert not missing, missing


def test_the_tutorial_is_its_template_run(gen):
    """docs/tutorial.md is docs/tutorial.template.md as docs/gen_tutorial.py ran it (issue 45): the same
    code blocks in the same order, each followed by what it printed, and the chain table in place of
    its marker (`make tutorial` rewrites it; .ci/run does so before building the site)."""
    import re

    docs = ROOT / "docs"
    code = re.compile(r"```python\n(.*?)```\n", re.S)
    template, page = (docs / "tutorial.template.md").read_text(), (docs / "tutorial.md").read_text()
    assert code.findall(page) == code.findall(template) and len(code.findall(page)) >= 4
    assert len(re.findall(r"```python\n.*?```\n```text\n", page, re.S)) == len(code.findall(page))
    assert "<!-- chain table -->" not in page and "| stage | quantity | method | α |" in page
    assert "{" not in page.split("### The chain", 1)[1].split("|", 1)[0]  # its text formatted, thresholds shown


def test_the_benchmark_page_has_every_results_file_and_reads_its_numbers(gen, tmp_path):
    """reference/benchmarks.md (issue 45: performance tables generated from benchmarks/results/*.json):
    a section per file, and a number changed in a file is the number the page shows."""
    import json

    page = gen.benchmarks_page()
    for f in (ROOT / "benchmarks" / "results").glob("*.json"):
        assert f"## `{f.name}`\n" in page, f.name
    spec = importlib.util.spec_from_file_location("gen_benchmarks", ROOT / "docs" / "gen_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "x.json").write_text(json.dumps({"benchmark": "x", "device": {"device": "cpu", "cpu": "Some CPU"},
                                                 "ratio": 1.23456, "rows": [{"E": 4, "s": 0.5}, {"E": 8, "s": 0.25}]}))
    made = module.page(tmp_path)
    assert "| ratio | 1.235 |" in made and "| 8 | 0.25 |" in made and "measured on cpu / Some CPU" in made


@pytest.mark.parametrize("page", ["docs/served.md", "README.md"])
def test_the_bash_blocks_name_real_targets_and_commands(page):
    """docs/served.md and the README (issue 45: every code block runs in a test): served.md's block starts
    servers and workers, which the served tests do through the same commands (tests/served_support.py),
    and the README's run the quickstart and the suite (.ci/run runs both); here each ``make`` line is a
    real target whose recipe ``make -n`` prints (the kktlab commands in it parse), each ``kktlab`` line
    parses with kktlab's own parser, and nothing else is in the pages' bash blocks."""
    import shlex
    import subprocess

    from kktlab.cli import parser

    text = (ROOT / page).read_text()
    lines = [ln.strip() for code in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in code.splitlines()
             if ln.strip()]
    made = parsed = 0
    for line in lines:
        args = [a for a in shlex.split(line, comments=True) if not a.startswith("[") and not a.endswith("]")]
        if args[0] == "make":
            res = subprocess.run(["make", "-n", *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert res.returncode == 0 and res.stdout.strip(), (line, res.stderr)
            for cmd in re.findall(r"bin/kktlab (.*)", res.stdout):
                parser().parse_args(shlex.split(cmd))
            made += 1
        elif args[0].endswith("kktlab"):
            parser().parse_args(args[1:])
            parsed += 1
        elif args[0].endswith("pip"):  # an optional extra the project declares
            import tomllib

            extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
            assert set(re.findall(r'"\.\[(\w+)\]"', line)) <= set(extras), line
        else:
            assert args[0] == "export", line  # served.md's shell line: the server's address for what follows
    assert made >= {"docs/served.md": 5, "README.md": 4}[page] and parsed >= 2


def test_the_readmes_quickstart_reading_lines_and_python_block_run(cli, tmp_path):
    """The README's reading commands and its python block (issue 45: every code block runs) against a
    quickstart store: configs/quickstart.yaml's grid, its cells written with known numbers (c* = 1 + the
    d index), no training. Each ``kktlab`` line naming results/quickstart.zarr (or no store) runs in a
    folder that holds it and exits 0; a line naming another store or a placeholder is parsed by the test
    above. The python block's table has the numbers written."""
    import shlex
    import sys

    import numpy as np

    from flows import config
    from flows.sweep import open_store

    cfg = config.load(ROOT / "configs" / "quickstart.yaml")
    store = open_store(cfg, tmp_path / "results" / "quickstart.zarr", "cpu")
    for idx in np.ndindex(*[len(v) for v in cfg.grid.values()]):
        vals = {n: (np.zeros(4, v.dtype) if v.dims else np.asarray(1, v.dtype)) for n, v in cfg.exp.variables.items()}
        assert store.write_cell(idx, dict(vals, c_star=np.float64(1 + idx[0]), c_star_rel=np.float64(0.1)))
    text = (ROOT / "README.md").read_text()
    ran = []
    for code in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in code.splitlines():
            args = shlex.split(line, comments=True)
            stores = [a for a in args if a.endswith(".zarr")]
            if not args or not args[0].endswith("kktlab") or any(a.isupper() for a in args) or \
                    stores not in ([], ["results/quickstart.zarr"]) or args[1] == "run":
                continue
            args = [str(tmp_path / "figs") if a == "figs/" else a for a in args[1:]]
            res = cli.run(*args, cwd=tmp_path)
            assert res.returncode == 0 and (res.stdout or res.stderr), (line, res.stderr[-2000:])
            ran.append(args[0])
    assert sorted(set(ran)) == ["experiments", "report", "status", "table"] and ran.count("table") == 2
    assert (tmp_path / "figs" / "index.html").exists() and (tmp_path / "quickstart.parquet").exists()
    sys.path.insert(0, str(ROOT / "docs"))
    import gen_tutorial

    printed = gen_tutorial.printed_by_blocks(text, tmp_path, "README.md")
    assert printed == [""]  # the block prints nothing; its frame:
    import kktlab

    df = kktlab.table(tmp_path / "results" / "quickstart.zarr", vars=["c_star"], by=["d"], stat="sem")
    assert df[["d", "alpha"]].values.tolist() == [[25, 0.5], [25, 1.0], [50, 0.5], [50, 1.0]]  # alpha kept
    assert df["c_star"].tolist() == [0.0] * 4 and df["c_star_n"].tolist() == [2] * 4  # the sem over 2 equal seeds
