"""docs/querying.md cannot rot (issue 31 item 2): every code block runs against a fresh store of
configs/chain-small.yaml (a smaller grid), from the folder that holds ``results/``; and a group is
self-describing (item 3): ``long_name`` and ``units`` on every variable and grid axis, a README.

Size: the blocks read whatever the store holds, so its two nets are trained to loss 1e-8 from lr 1e-3
(~2,600 steps) instead of the config's 1e-30 from 1e-5 (~12,000): still converged (status 1, every
point classified), which the usable-cell mask and the margins block need."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "querying.md"
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)


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


@pytest.mark.requires_services
def test_every_block_of_the_querying_doc_runs(folder, monkeypatch, cli):
    blocks = BLOCK.findall(DOC.read_text())
    assert sum(kind == "python" for kind, _ in blocks) >= 6
    monkeypatch.chdir(folder)
    namespace: dict = {}
    for i, (kind, code) in enumerate(blocks):
        if kind == "python":
            exec(compile(code, f"docs/querying.md block {i}", "exec"), namespace)  # noqa: S102 - our own doc
            continue
        for line in (ln.strip() for ln in code.splitlines()):
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
            assert ds[name].attrs.get("long_name") and units, (group, name)
        assert {"title", "references", "README", "config"} <= set(ds.attrs), group
