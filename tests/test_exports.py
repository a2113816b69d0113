"""Exports a tool can read, no traps, figures by spec ID (issue 40): every group's attributes are
netCDF-writable (no boolean or mapping attribute), its units parse in UDUNITS, it says
``Conventions``, its flags carry ``flag_values`` / ``flag_meanings``, each cell records when and where
it was written; Parquet keeps units; grid axes named like xarray's sel keywords are refused; an
upstream variable is never hidden by an own axis; the report runs in chain order on the device used."""

from __future__ import annotations

import datetime
import inspect
import json
import platform

import numpy as np
import pytest
import xarray as xr

import kktlab
from core.errors import ConfigError
from flows import config, experiments
from flows.sweep import open_store, used_device
from storage import schema
from storage.query import chain_order, stage_scalars, status
from storage.table import write

# what UDUNITS parses, of the units kktlab stores (cf_units, where installed, checks every one)
UDUNITS_OK = {"1", "s", "byte", schema.EPOCH}


def _template(name: str, params: dict | None = None) -> xr.Dataset:
    exp = experiments.get(name)
    extra = {d: 2 for v in exp.variables.values() for d in v.dims}
    return schema.template(exp, {"seed": [0, 1]}, extra, params=params)


def _attr_values(ds: xr.Dataset):
    yield "group", ds.attrs
    for name, var in ds.variables.items():
        yield name, var.attrs


@pytest.mark.parametrize("name", experiments.names())
def test_every_group_is_netcdf_writable_and_cf(name):
    """netCDF has no boolean or mapping attribute (netCDF4: TypeError on must_be_finite = True)."""
    ds = _template(name)
    assert ds.attrs["Conventions"] == "CF-1.10"
    for where, attrs in _attr_values(ds):
        for k, v in attrs.items():
            assert not isinstance(v, (bool, np.bool_, dict)), (where, k, v)
            if isinstance(v, list):
                assert all(isinstance(x, str) for x in v) or all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v), (where, k, v)
    try:
        import cf_units
    except ImportError:
        cf_units = None
    for vname, var in ds.variables.items():
        if var.dtype.kind == "U":
            continue
        units = var.attrs["units"]
        if cf_units is not None:
            cf_units.Unit(units)
        else:
            assert units in UDUNITS_OK, (vname, units)
    for vname, decl in experiments.get(name).variables.items():
        if vname not in ds:
            continue
        attrs = ds[vname].attrs
        if decl.labels or (decl.dtype == "int8" and decl.description.startswith("1 if ")):
            assert len(attrs["flag_values"]) == len(attrs["flag_meanings"].split()) >= 2, (vname, attrs)
        if decl.units in schema.UNITS:
            assert schema.UNITS[decl.units][1] in attrs["description"], (vname, attrs)
    assert ds.done.attrs["flag_meanings"] == "pending done"
    assert ds.failed.attrs["flag_values"] == [0, 1]


def test_status_labels_become_flag_meanings():
    attrs = _template("reconstruct").status.attrs
    assert attrs["flag_values"] == [1, 2] and attrs["flag_meanings"] == "done diverged"
    assert attrs[schema.FINITE] == 1
    assert _template("nonrobust").log10_loss.attrs["units"] == "1"
    assert "base-10 logarithm" in _template("nonrobust").log10_loss.attrs["description"]


@pytest.mark.parametrize("points, word", [("test", "robust test accuracy"), ("train", "robust training accuracy")])
def test_pgd_rta_names_the_points_it_attacked(points, word):
    ds = _template("pgd", {"points": points})
    assert ds.rta.attrs["description"].startswith(word) and ds.rta.attrs["long_name"].startswith(word)


@pytest.mark.parametrize("points, word", [("test", "test"), ("train", "training")])
def test_single_step_names_the_points_it_attacked(points, word):
    ds = _template("single_step", {"points": points})
    assert ds.test_acc.attrs["long_name"] == f"clean {word} accuracy"
    assert ds.flip_frac.attrs["description"].startswith(f"fraction of {word} points")
    assert ds.med_delta_rel.attrs["description"].startswith(f"median over {word} points")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A nonrobust group with one cell written and one failed; its tests only read it (made once)."""
    path = tmp_path_factory.mktemp("exports") / "s.zarr"
    cfg = config.parse({"experiment": "nonrobust", "grid": {"d": [10, 20], "seed": [0]}, "params": {"width": 8}})
    st = open_store(cfg, path, "auto")
    before = datetime.datetime.now(datetime.timezone.utc)
    vals = {n: (np.zeros(4, v.dtype) if v.dims else np.asarray(1, v.dtype)) for n, v in cfg.exp.variables.items()}
    assert st.write_cell((0, 0), dict(vals, c_star=np.float64(2.5)))
    assert st.write_failed((1, 0), "LinAlgError: singular")
    return path, before


def test_cells_record_finish_time_and_export_to_netcdf(store, tmp_path):
    path, before = store
    ds = xr.open_zarr(path, group="nonrobust")
    when = ds.cell_finished.values  # CF time: decoded to dates by plain xarray
    assert when.dtype.kind == "M" and not np.isnat(when).any()
    t0 = np.datetime64(before.replace(tzinfo=None), "ns")
    assert (when >= t0).all() and (when <= t0 + np.timedelta64(60, "s")).all()
    assert ds.attrs["host"] == platform.node()  # the group's maker; each cell's writer (a Dask worker's host):
    assert ds.cell_host.values.tolist() == [[platform.node()], [platform.node()]]  # the failed cell's too
    assert isinstance(ds.attrs[schema.FAILURES], str)  # JSON text, not a mapping
    assert status(path)[0]["failures"] == {"d=20, seed=0": "LinAlgError: singular"}
    assert ds.attrs["device"] in ("cpu (requested: auto)",) or ds.attrs["device"].startswith("cuda (")
    netCDF4 = pytest.importorskip("netCDF4")  # not a dependency: the attribute checks above stand in
    ds.to_netcdf(tmp_path / "s.nc", engine="netcdf4")
    with netCDF4.Dataset(tmp_path / "s.nc") as nc:
        assert nc.Conventions == "CF-1.10" and nc["iters"].must_be_finite == 1


def test_old_failures_mapping_still_read():
    assert schema.failures({schema.FAILURES: {"seed=0": "x"}}) == {"seed=0": "x"}
    assert schema.failures({schema.FAILURES: '{"seed=0": "x"}'}) == {"seed=0": "x"}
    assert schema.failures({}) == {}


def test_used_device_is_never_auto(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert used_device("auto") == "cpu (requested: auto)" and used_device("cpu") == "cpu"


def test_parquet_keeps_units(store, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path, _ = store
    df = kktlab.table(path, vars="c_star,log10_loss", by="d")
    write(df, "parquet", str(tmp_path / "t.parquet"))
    sch = pq.read_schema(tmp_path / "t.parquet")
    meta = {f.name: {k.decode(): v.decode() for k, v in (f.metadata or {}).items()} for f in sch}
    assert meta["c_star"]["units"] == "1" and meta["c_star_lo"]["units"] == "1"
    assert meta["c_star"]["long_name"] == xr.open_zarr(path, group="nonrobust").c_star.attrs["long_name"]
    assert meta["c_star_n"]["units"] == "1" and meta["cells"]["units"] == "1"


def test_sel_keywords_are_xarray_s():
    got = set()
    for fn in (xr.Dataset.sel, xr.Dataset.isel, xr.DataArray.sel, xr.DataArray.isel):
        got |= {p.name for p in inspect.signature(fn).parameters.values()
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
    assert got == set(config.SEL_KEYWORDS)


def test_no_code_selects_a_keyword_axis_by_keyword():
    """``ds.sel(method="ga")`` is xarray's inexact-match rule, not a selection on a ``method`` axis: no
    code of the package selects a keyword-named axis by keyword (none is left: issue 40's renames)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    pattern = re.compile(r"\.i?sel\((?:[^()]*,\s*)?(" + "|".join(config.SEL_KEYWORDS) + r")\s*=\s*[\"'0-9]")
    found = [f"{path.relative_to(root)}:{i}" for folder in ("analysis", "storage", "kktlab", "flows", "tasks")
             for path in sorted((root / folder).rglob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line.split("#")[0])]
    assert found == [], found


@pytest.mark.parametrize("key", ["tolerance", "drop", "method"])
def test_a_grid_axis_named_like_a_sel_keyword_is_refused(monkeypatch, key):
    """One line naming the field and the alternative."""
    exp = experiments.get("nonrobust")
    monkeypatch.setitem(exp.params, key, config.Param(float, 1.0, "a test parameter"))
    with pytest.raises(ConfigError) as err:
        config.parse({"experiment": "nonrobust", "grid": {key: [1.0, 2.0], "seed": [0]}})
    msg = str(err.value)
    assert f"grid.{key}" in msg and f"'nonrobust_{key}'" in msg and "\n" not in msg
    config.parse({"experiment": "nonrobust", "grid": {"seed": [0]}, "params": {key: 2.0}})  # fixed: no dim



@pytest.mark.parametrize("experiment, where, new", [("unlearn", "grid", "unlearn_method"),
                                                    ("unlearn", "params", "unlearn_method"),
                                                    ("single_step", "grid", "single_step_method")])
def test_a_renamed_parameter_is_refused_with_its_new_name(experiment, where, new):
    """Issue 40: unlearn's and single_step's ``method`` (an axis ds.sel(method=...) cannot select) are
    ``unlearn_method`` / ``single_step_method``; an old config is told the new name, in one line."""
    stage = {"name": "s", "experiment": experiment, "from": "t",
             where: {"method": ["ga"] if where == "grid" else "ga"}}
    if where == "params":
        stage["grid"] = {"alpha": [1.0]}
    raw = {"name": "c", "stages": [{"name": "t", "experiment": "train_kkt", "grid": {"seed": [0]}}, stage]}
    with pytest.raises(ConfigError) as err:
        config.parse(raw)
    msg = str(err.value)
    assert f"stages[1].{where}.method" in msg and f"renamed '{new}'" in msg and "\n" not in msg


@pytest.mark.parametrize("values, new", [(["identity", "ga"], "unlearn_method"),
                                         (["single_step_exact"], "single_step_method")])
def test_a_store_made_before_the_rename_reads_with_the_new_name(tmp_path, values, new):
    """A group written with a ``method`` dim (stores before issue 40) opens with its new name, which
    ``load_nets``' selection (storage.nets.select_indices) takes too; by the values it holds."""
    from storage import nets, schema, store

    ds = xr.Dataset({schema.DONE: (("seed", "method"), np.ones((2, len(values)), bool))},
                    coords={"seed": [0, 1], "method": values})
    ds.to_zarr(tmp_path / "old.zarr", group="g", zarr_format=3, consolidated=False)
    got = store.open_dataset(tmp_path / "old.zarr", "g")
    assert list(got[schema.DONE].dims) == ["seed", new] and list(got[new].values) == values
    assert got.sel({new: values[-1]})[schema.DONE].shape == (2,)
    assert nets.select_indices(tmp_path / "old.zarr", "g", {new: values[-1], "seed": 1}) == [(1, len(values) - 1)]


CHAIN = {"name": "c", "stages": [
    {"name": "zz_nets", "experiment": "train_kkt", "grid": {"seed": [0]},
     "params": {"d": 8, "m": 4, "width": 4, "epochs": 20}},
    {"name": "mid_unlearn", "experiment": "unlearn", "from": "zz_nets", "grid": {"alpha": [1.0]},
     "params": {"forget": 0}},
    {"name": "aa_forge", "experiment": "forge_net", "from": "mid_unlearn", "grid": {"eps": [0.1, 0.2]}},
]}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The three-stage chain's groups, every cell written (no flow run); its tests only read it (made once)."""
    path = tmp_path_factory.mktemp("chain") / "c.zarr"
    for stage in config.parse(CHAIN).stages:
        st = open_store(stage, path, "cpu")
        vals = {n: (np.zeros([2] * len(v.dims), v.dtype) if v.dims else np.asarray(0, v.dtype))
                for n, v in stage.exp.variables.items() if "sample" not in v.dims}
        if stage.exp.name == "unlearn":
            vals["eps"] = np.float64(0.75)
        for idx in st.cell_indices():
            st.write_values(idx, vals)
    return path


def test_upstream_variable_named_like_an_own_axis_is_namespaced(chain):
    ds = stage_scalars(chain, "aa_forge")
    assert list(ds.eps.values) == [0.1, 0.2]  # the own axis
    assert float(ds["mid_unlearn.eps"].max()) == 0.75  # the upstream's ε, beside it
    assert "mid_unlearn.eps" in json.loads(json.dumps(ds.attrs["kktlab_upstream_variables"]))


def test_report_groups_in_chain_order(chain):
    assert chain_order(chain) == ["zz_nets", "mid_unlearn", "aa_forge"]


def _unlearn_ds(**dims):
    shape = tuple(len(v) for v in dims.values())
    one = np.ones(shape)
    return xr.Dataset({"eps": (tuple(dims), one), "eps_mean": (tuple(dims), one), "bound_eps": (tuple(dims), one * np.inf),
                       "done": (tuple(dims), one.astype(bool)), "failed": (tuple(dims), ~one.astype(bool))},
                      coords=dims)


def test_unlearn_figures_titled_with_their_spec_ids(tmp_path):
    from analysis import common, unlearn

    base = {"seed": [0, 1, 2], "alpha": [0.0, 1.0]}
    assert unlearn.spec_figure(_unlearn_ds(**base)) == "F001-1"
    assert unlearn.spec_figure(_unlearn_ds(k=[1, 2], **base)) == "F001-4"
    assert unlearn.spec_figure(_unlearn_ds(unlearn_method=["k_ga"], **base)) == "F001-4"
    dmg = _unlearn_ds(**base).assign(test_acc_after=lambda d: d.eps * 0.9)
    assert unlearn.spec_figure(dmg) == "F001-6"
    common.take_records()
    unlearn.figures(_unlearn_ds(k=[2], **base), tmp_path, "kga_")
    _, captions = common.take_records()
    assert captions["kga_F001-4_eps.png"].startswith("F001-4: KKT ε")


def test_no_figure_of_all_inf_data(tmp_path):
    """bound_eps +inf in every cell: the bound figure is not drawn, and the report says why."""
    from analysis import common, unlearn

    common.take_records()
    paths = unlearn.figures(_unlearn_ds(seed=[0, 1, 2], alpha=[0.0, 1.0]), tmp_path, "u_")
    not_drawn, _ = common.take_records()
    assert not (tmp_path / "u_F001-1_bound.png").exists() and tmp_path / "u_F001-1_bound.png" in paths
    assert [why for name, why in not_drawn if name == "u_F001-1_bound.png"][0].startswith("all values ±inf")
    fig, ax = common.plt.subplots() if hasattr(common, "plt") else __import__("matplotlib.pyplot").pyplot.subplots()
    ax.plot([0, 1], [np.inf, -np.inf])
    common.save(fig, tmp_path / "inf.png")
    assert common.take_records()[0] == [("inf.png", "all values ±inf")]


def test_report_walks_the_chain_upstream_first(chain, monkeypatch, tmp_path):
    from kktlab import report

    seen = []

    def first(store, g):
        seen.append(g)
        raise LookupError("stop")
    monkeypatch.setattr(report, "stage_scalars", first)
    with pytest.raises(LookupError):
        report.report(chain, tmp_path / "out")
    assert seen == ["zz_nets"]  # alphabetically aa_forge would come first
