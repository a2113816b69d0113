"""Trust nothing a file says without checking (issue 40): a reader of stored nets refuses, in one line
naming the cell (or the attribute and the group) and `kktlab verify`, an upstream cell whose values
were edited or whose chunk is corrupt, and a ``kktlab_nets_arrays`` attribute that is damaged or
says otherwise than its producer's declaration; `kktlab verify` names a damaged attribute like a
damaged chunk and a rerun's repair restores it. Fast: a train_kkt -> unlearn chain written directly
with made-up nets (no Prefect, no Dask)."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest
import zarr

import kktlab
from core.errors import StoreError
from flows import config
from flows.sweep import nets_at, open_store
from kktlab.cli import main as kktlab_main
from storage import schema
from storage.query import damaged, load_nets
from storage.verify import verify_group

CHAIN = {"name": "c", "stages": [
    {"name": "nets", "experiment": "train_kkt", "grid": {"seed": [0, 1]},
     "params": {"d": 8, "m": 4, "width": 4, "epochs": 20}},
    {"name": "gone", "experiment": "unlearn", "from": "nets", "grid": {"alpha": [1.0]}, "params": {"forget": 0}}]}
D, M, K = 8, 4, 4


def _cell(exp, rng) -> dict:
    """Made-up values of one cell: a net of the declared sizes, every other variable 0."""
    vals = {n: (np.zeros([1] * len(v.dims), v.dtype) if v.dims else np.asarray(0, v.dtype))
            for n, v in exp.variables.items()}
    vals.update(W=rng.normal(size=(K, D)), b=np.zeros(K), v=rng.choice([-0.5, 0.5], K), X=rng.normal(size=(M, D)),
                y=np.array([1.0, -1.0, 1.0, -1.0]), d_used=np.int64(D), m_used=np.int64(M), width_used=np.int64(K),
                nets_stored=np.int8(1), batch_rng_state=np.zeros(16, np.uint8), data_index=np.full(M, -1))
    if "forgotten" in exp.variables:
        vals["forgotten"] = np.array([1, 0, 0, 0], np.int8)  # forget: 0
        vals["feasible"] = np.int8(1)
        vals[schema.UPSTREAM_HASH] = np.int64(1)  # what a worker records beside the values it read
    return {n: v for n, v in vals.items() if n in exp.variables or n == schema.UPSTREAM_HASH}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("trust") / "c.zarr"
    rng = np.random.default_rng(0)
    for stage in config.parse(CHAIN).stages:
        st = open_store(stage, path, "cpu")
        for idx in st.cell_indices():
            assert st.write_cell(idx, _cell(stage.exp, rng))
    return path


@pytest.fixture
def store(pristine, tmp_path) -> pathlib.Path:
    shutil.copytree(pristine, tmp_path / "c.zarr")
    return tmp_path / "c.zarr"


def test_the_made_up_chain_reads_back(store):
    nets = kktlab.load_nets(store, "gone")
    assert nets.forgotten().tolist() == [[True, False, False, False]] * 2
    assert verify_group(store, "nets").ok and verify_group(store, "gone").ok


# --- 1. damaged upstream cells are refused, never handed on as they read ---------------------------------

def _edit_w(g: pathlib.Path):
    arr = zarr.open_array(str(g / "W"), mode="r+", zarr_format=3)  # a valid chunk (checksum rewritten)
    arr[1] = np.asarray(arr[1]) + 1e-9


def _flip_w(g: pathlib.Path):
    f = g / "W" / "c" / "1" / "0" / "0"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x10
    f.write_bytes(b)


@pytest.mark.parametrize("damage, why", [(_edit_w, "cell_hash"), (_flip_w, "checksum mismatch")], ids=["edited", "flipped"])
def test_load_nets_refuses_a_damaged_cell_naming_it_and_verify(store, damage, why):
    """The issue's case: after editing one net's W, load_nets returned it without a word."""
    damage(store / "nets")
    for load in (kktlab.load_nets, load_nets):
        with pytest.raises(StoreError) as err:
            load(store, "nets")
        msg = str(err.value)
        assert "seed=1" in msg and why in msg and "kktlab verify" in msg and "\n" not in msg, msg
    assert kktlab.load_nets(store, "nets", seed=0).W.shape == (1, K, D)  # the sound cell still reads
    nets = nets_at(str(store), "nets", [(0,), (1,)])  # a reading stage's worker: that cell failed, named
    assert not nets.problems[0] and "damaged" in nets.problems[1] and why in nets.problems[1]


# --- 2. the kktlab_nets_arrays attribute a reader acts on -----------------------------------------------

def _set_attr(store: pathlib.Path, group: str, value, crc: bool | None = None):
    g = zarr.open_group(str(store / group), mode="r+", zarr_format=3)
    attrs = dict(g.attrs)
    attrs[schema.NETS_ARRAYS] = value
    if crc is None:
        attrs.pop(schema.NETS_ARRAYS_CRC, None)  # as in a group made before the checksum
    elif crc:
        attrs[schema.NETS_ARRAYS_CRC] = schema.crc32c(value)  # a consistent edit: only the declaration tells
    g.attrs.clear()
    g.attrs.update(attrs)


BAD_ATTRS = {
    "without_forgotten": ("{}", "edited since"),
    "a_path": (json.dumps({"../nets/W": ["hidden", "feature"]}), "'../nets/W'"),
    "invalid_json": ('{"forgotten": ["sample"', "not valid JSON"),
    "not_a_mapping": ('["forgotten"]', "not a JSON object"),
    "wrong_dims": (json.dumps({"forgotten": ["hidden"]}), "the array has ['sample']"),
}


@pytest.mark.parametrize("name", list(BAD_ATTRS))
def test_a_damaged_nets_arrays_attribute_is_one_line_naming_it(store, name, capsys):
    """Every reader (kktlab.load_nets, storage.query.load_nets, a reading stage's worker) and `kktlab
    verify` name the attribute and the group; no traceback, no nets loaded without the forgotten point."""
    value, why = BAD_ATTRS[name]
    _set_attr(store, "gone", value, crc=False)  # the written checksum kept: the edit is damage
    for load in (lambda: kktlab.load_nets(store, "gone"), lambda: load_nets(store, "gone"),
                 lambda: nets_at(str(store), "gone", [(0, 0)])):
        with pytest.raises(StoreError) as err:
            load()
        msg = str(err.value)
        assert "kktlab_nets_arrays" in msg and "'gone'" in msg and why in msg and "\n" not in msg, msg
    report = verify_group(store, "gone")
    assert not report.ok and any("kktlab_nets_arrays" in p and why in p for p in report.problems), report.problems
    assert not bool(damaged(store, "gone").any())  # the group's own values are sound: its tables keep them
    capsys.readouterr()
    assert kktlab_main(["verify", str(store)]) == 1  # `kktlab verify` names it and exits 1, as for a chunk
    out = capsys.readouterr().out
    assert "gone (unlearn)" in out and "  damaged: attribute kktlab_nets_arrays" in out and why in out, out


def _keep_crc(store, group):
    g = zarr.open_group(str(store / group), mode="r", zarr_format=3)
    return g.attrs.get(schema.NETS_ARRAYS_CRC)


@pytest.mark.parametrize("crc", [None, True], ids=["no_checksum", "checksum_rewritten"])
def test_an_attribute_that_is_not_the_producers_declaration_is_refused(store, crc):
    """Without a checksum to catch it (a group made before it, or one edited with it), the reader checks
    the attribute against the producing experiment's declaration: unlearn keeps ``forgotten``."""
    _set_attr(store, "gone", "{}", crc=crc)
    assert load_nets(store, "gone").forgotten().sum() == 0  # storage alone cannot tell: what the issue saw
    for load in (lambda: kktlab.load_nets(store, "gone"), lambda: nets_at(str(store), "gone", [(0, 0)])):
        with pytest.raises(StoreError, match=r"attribute kktlab_nets_arrays \{\} is not what its producer 'unlearn' "
                                             r"declares \(\{\"forgotten\": \[\"sample\"\]\}\)"):
            load()


def test_a_rerun_restores_the_attribute_from_the_declaration(store):
    from storage.store import Store

    _set_attr(store, "gone", "{}", crc=None)
    stage = config.parse(CHAIN).stages[1]
    assert Store(store, "gone").restore_arrays(stage.exp, stage.store_grid, stage.extra_sizes()) == [schema.NETS_ARRAYS]
    assert verify_group(store, "gone").ok and _keep_crc(store, "gone") is not None
    assert kktlab.load_nets(store, "gone").forgotten().tolist() == [[True, False, False, False]] * 2
    assert Store(store, "gone").restore_arrays(stage.exp, stage.store_grid, stage.extra_sizes()) == []


def test_an_attribute_readers_act_on_that_is_not_the_declaration_is_named_and_restored(store, capsys):
    """``must_be_finite`` dropped from unlearn's ``feasible`` and W's pad value changed: `kktlab verify`
    names each, against the experiment's declaration, and exits 1; a rerun's repair restores both."""
    from storage.store import Store

    g = zarr.open_group(str(store / "gone"), mode="r+", zarr_format=3)
    g["feasible"].attrs[schema.FINITE] = 0
    g["W"].attrs[schema.PAD] = 1.0
    capsys.readouterr()
    assert kktlab_main(["verify", str(store)]) == 1
    out = capsys.readouterr().out
    assert "variable feasible: attribute must_be_finite is 0, declared 1" in out, out
    assert "variable W: attribute pad_value is 1.0, declared 0.0" in out, out
    stage = config.parse(CHAIN).stages[1]
    restored = Store(store, "gone").restore_arrays(stage.exp, stage.store_grid, stage.extra_sizes())
    assert sorted(restored) == ["W attributes", "feasible attributes"]
    assert kktlab_main(["verify", str(store)]) == 0
