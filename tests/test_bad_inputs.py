"""Bad inputs stop the real CLI in seconds with exit code != 0 and one line naming the field or
option, no traceback, before any store, server or cluster exists (issue 12, items 6 and 9).

Every case is its own process running ``kktlab.cli`` as ``python -m kktlab.cli`` does (runpy,
``__main__``, uncaught exceptions printed as the interpreter prints them). The processes are
forked from one helper process (this file run as a script) that imported the experiments once:
on a busy 2-core machine the torch import costs 3-8 s, each check milliseconds. ``test_plain``
runs a few cases as plain ``python -m kktlab.cli`` subprocesses, to show the forked runs equal them.
With the bad configs of tests/test_config.py (27 parsed, 12 through the CLI, 2 file errors) these
are the bad-input tests of the suite.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

GOOD = {"experiment": "nonrobust", "grid": {"d": [10, 20], "seed": [0]}, "params": {"width": 8, "max_iters": 5},
        "runner": {"cluster": "inline", "workers": 1}}
FORGING = {"experiment": "forging", "grid": {"eps": [0.1]}, "params": {"d": 3}}
MNIST = {"experiment": "lazy_train", "grid": {"seed": [0]},
         "params": {"data": "mnist", "d": 36, "n_train": 100, "n_test": 50, "m": 8}}
CIFAR = {"experiment": "train", "grid": {"seed": [0]}, "params": {"data": "cifar_vehicles", "d": 3072, "m": 4, "width": 4}}
NAN, INF = float("nan"), float("inf")
SHARED_DATA = pathlib.Path(os.environ.get("KKTLAB_DATA") or pathlib.Path(__file__).resolve().parents[2] / "shared" / "data")
# issue 29 item 8: "billion laughs", 10^9 strings in 600 bytes (each level x10; PyYAML shares the
# nodes, anything that walks them expands them: the run hung for ~18 min)
BOMB = ("experiment: nonrobust\ngrid: {d: [10], seed: [0]}\nparams:\n  width: [&a0 [" + ",".join(["lol"] * 10) + "], "
        + ", ".join(f"&a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)) + "]\n")


def cfg(base=GOOD, grid=None, runner=None, **top):
    """A copy of ``base`` with grid axes, runner keys and top-level keys changed; ``params``
    changes go in ``top['params']`` (merged)."""
    raw = json.loads(json.dumps(base))
    raw["grid"].update(grid or {})
    raw.setdefault("params", {}).update(top.pop("params", {}))
    raw.setdefault("runner", {}).update(runner or {})
    raw.update(top)
    return raw


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is


# id -> (config: dict | bytes | str | None, extra CLI args, expected text naming the field, env).
# In args, {cfg} is the config path, {dir} the case's folder, {port} a closed port.
CASES = {
    # --- item 6: numbers -------------------------------------------------------------------
    "nan in params": (cfg(params={"lr0": NAN}), [], "'params.lr0': nan is not a finite number", {}),
    "nan in a grid": (cfg(FORGING, grid={"eps": [0.1, NAN]}), [], "'grid.eps': nan is not a finite", {}),
    "nan in a case": (cfg(grid={"d": [10, {"d": 20, "lr0": NAN}]}), [], "'grid.d[1].lr0': nan", {}),
    "alpha nan": (cfg(params={"alpha": NAN}), [], "'params.alpha': nan is not a finite", {}),
    "alpha inf": (cfg(params={"alpha": INF}), [], "'params.alpha': inf is not a finite", {}),
    "alpha 1e308": (cfg(params={"alpha": 1e308}), [], "'params.alpha': 1e+308 is out of range; allowed: float > 0 <= 4", {}),
    "alpha gives too many samples": (cfg(grid={"d": [10**6]}, params={"alpha": 4.0}), [], "'alpha': gives m", {}),
    "p0 nan": (cfg(FORGING, params={"estimator": "subset_simulation", "p0": NAN}), [], "'params.p0': nan", {}),
    "p0 -inf": (cfg(FORGING, params={"estimator": "subset_simulation", "p0": -INF}), [], "'params.p0': -inf", {}),
    "p0 1e308": (cfg(FORGING, params={"estimator": "subset_simulation", "p0": 1e308}), [], "'params.p0': 1e+308", {}),
    "eps nan": (cfg(FORGING, grid={"eps": [NAN]}), [], "'grid.eps': nan", {}),
    "eps inf": (cfg(FORGING, grid={"eps": [INF]}), [], "'grid.eps': inf", {}),
    "eps 1e308": (cfg(FORGING, grid={"eps": [1e308]}), [], "'grid.eps': 1e+308 is out of range; allowed: float > 0 <= 1e+06", {}),
    "float above 1e100": (cfg({"experiment": "forging_sgd", "grid": {"seed": [0]}}, params={"x0": 1e200}), [],
                          "'params.x0': 1e+200 is out of range: every float is at most 1e100", {}),
    "d 1e30": (cfg(grid={"d": [10**30]}), [], "'grid.d': 1000000000000000000000000000000 is out of range; allowed: int >= 2 <= 1000000", {}),
    "width 1e12": (cfg(params={"width": 10**12}), [], "'params.width': 1000000000000 is out of range", {}),
    "seed 2**64": (cfg(grid={"seed": [2**64]}), [], "'grid.seed': 18446744073709551616 is out of range; allowed: int >= 0 <= 4294967295", {}),
    "int above 2**53": (cfg(runner={"max_cells": 2**60}), [], "'runner.max_cells': 1152921504606846976 is out of range: every int is at most 2**53", {}),
    "workers 10000": (cfg(runner={"workers": 10000}), [], "'runner.workers': 10000 is out of range; allowed: int >= 1 <= 256", {}),
    "--workers 10000": (GOOD, ["--workers", "10000"], "'runner.workers': 10000 is out of range", {}),
    "1e9-cell grid": (cfg(grid={k: list(range(2, 66)) for k in ("d", "seed", "m", "lr_period", "batch_size")}), [],
                      "'grid': 1,073,741,824 cells", {}),
    "grid over --max-cells": (GOOD, ["--max-cells", "1"], "'grid': 2 cells (2 d x 1 seed) is more than the limit of 1", {}),
    "cell beyond memory": (cfg(grid={"d": [10, 1_000_000]}, params={"width": 100_000, "m": 100_000}), [],
                           "'grid.d, params.m, params.alpha, params.width': the largest cell (d=1000000", {}),
    # --- item 9: files, paths, services, keys ----------------------------------------------
    "binary config": (bytes(range(256)) * 8, [], "'<file>': {cfg} is not UTF-8 text (byte 0x80 at offset 128)", {}),
    "10 MB config": (cfg(description="x" * 10_000_000), [], "'<file>': {cfg} is 10,000,", {}),
    "config over Prefect's parameter limit": (cfg(description="x" * 250_000), [], "'<file>': the config makes", {}),
    "duplicate top-level key": ("experiment: nonrobust\ngrid: {d: [10], seed: [0]}\nparams: {width: 8}\nparams: {width: 9}\n",
                                [], "'params': given twice (lines 3 and 4)", {}),
    "duplicate nested key": ("experiment: nonrobust\ngrid: {d: [10], seed: [0]}\nparams:\n  width: 8\n  width: 9\n",
                             [], "'params.width': given twice (lines 4 and 5)", {}),
    "name ''": (cfg(name=""), [], "'name': is empty", {}),
    "store ''": (cfg(store=""), [], "'store': is empty", {}),
    "--store ''": (GOOD, ["--store", ""], "--store is empty", {}),
    "store under a regular file": (GOOD, ["--store", "{dir}/afile/s.zarr"], "--store {dir}/afile/s.zarr lies under {dir}/afile, which is a file", {}),
    "store is a regular file": (cfg(store="{dir}/afile"), [], "store {dir}/afile is a file, not a folder", {}),
    "read-only store": (GOOD, ["--store", "{dir}/ro.zarr"], "--store {dir}/ro.zarr is read-only", {}),
    "report --out onto a file": (None, ["report", "{dir}/s.zarr", "--out", "{dir}/afile"], "--out {dir}/afile is a file", {}),
    "dead PREFECT_API_URL": (GOOD, [], "PREFECT_API_URL http://127.0.0.1:{port}/api: nothing answers there",
                             {"PREFECT_API_URL": "http://127.0.0.1:{port}/api"}),
    "submit to a dead PREFECT_API_URL": (None, ["submit", "{dir}/good.yaml"], "PREFECT_API_URL http://127.0.0.1:{port}/api",
                                         {"PREFECT_API_URL": "http://127.0.0.1:{port}/api"}),
    "--dask-address to a closed port": (GOOD, ["--dask-address", "tcp://127.0.0.1:{port}"],
                                        "'runner.address' (--dask-address): no Dask scheduler at tcp://127.0.0.1:{port}", {}),
    "malformed runner.address": (cfg(runner={"cluster": "address", "address": "localhost"}), [],
                                 "'runner.address': 'localhost' is not a scheduler address", {}),
    "malformed --dask-address": (GOOD, ["--dask-address", "tcp://127.0.0.1:99999"], "'runner.address': 'tcp://127.0.0.1:99999'", {}),
    "--json into a missing folder": (GOOD, ["--json", "{dir}/missing/stats.json"], "--json {dir}/missing/stats.json: folder", {}),
    # --- issue 29 item 8: YAML that expands or nests without bound ------------------------------
    "YAML alias bomb": (BOMB, [], ("'<file>': {cfg}: YAML aliases (*name) expand the node at line 4",
                                   "to more than 1,000,000 nodes"), {}),
    "recursive YAML alias": ("experiment: nonrobust\ngrid: {d: [10], seed: [0]}\nparams: &p {width: 8, x: *p}\n", [],
                             "'<file>': {cfg}: the node at line 3 holds an alias of itself (a recursive alias)", {}),
    "YAML nested 20,000 deep": ("experiment: nonrobust\ngrid: {d: [10], seed: [0]}\nparams: {width: "
                                + "[" * 20000 + "]" * 20000 + "}\n", [],
                                "'<file>': {cfg} nests lists and mappings more than 64 deep (line 3)", {}),
    "int of 5000 digits": ("experiment: nonrobust\ngrid: {d: [10], seed: [0]}\nparams: {width: " + "9" * 5000 + "}\n",
                           [], "'<file>': {cfg} holds a value YAML cannot read", {}),
    "float given a 400-digit int": (cfg(params={"lr0": 10**400}), [],
                                    ("'params.lr0': 1000000000000000000000000000...000",
                                     "0 is out of range: every float is at most 1e100"), {}),
    # --- issue 29 item 7: data files, names, foreign stores -------------------------------------
    "MNIST file missing": (MNIST, [], "'params.data': 'mnist': MNIST file {dir}/data/mnist/t10k-labels-idx1-ubyte.gz "
                           "is missing", {"KKTLAB_DATA": "{dir}/data"}),
    "MNIST file corrupt": (MNIST, [], "'params.data': 'mnist': MNIST file {dir}/data/mnist/t10k-labels-idx1-ubyte.gz "
                           "is corrupt", {"KKTLAB_DATA": "{dir}/data"}),
    "MNIST SHA256SUMS missing": (MNIST, [], "'params.data': 'mnist': MNIST checksum list {dir}/data/mnist/SHA256SUMS "
                                 "is missing", {"KKTLAB_DATA": "{dir}/data"}),
    "data folder absent": (MNIST, [], "'params.data': 'mnist': data folder {dir}/nodata does not exist",
                           {"KKTLAB_DATA": "{dir}/nodata"}),
    "MNIST missing, chain stage grid": ({"stages": [{"name": "lazy", "experiment": "lazy_train",
                                                     "grid": {"data": ["digits", "mnist"], "seed": [0]},
                                                     "params": {k: v for k, v in MNIST["params"].items() if k != "data"}}]},
                                        [], "'stages[0].grid.data': 'mnist': MNIST file", {"KKTLAB_DATA": "{dir}/data"}),
    "CIFAR file corrupt": (CIFAR, [], "'params.data': 'cifar_vehicles': CIFAR-10 file "
                           "{dir}/data/cifar10/cifar10_batch1_test1000.npz is corrupt", {"KKTLAB_DATA": "{dir}/data"}),
    "300-character name": (cfg(name="n" * 300), [], ("'name': 'nnnnnnnn", "is 300 bytes long; a name is at most 100"), {}),
    "300-character stage name": ({"stages": [{"name": "s" * 300, "experiment": "nonrobust", "grid": GOOD["grid"]}]}, [],
                                 ("'stages[0].name': 'ssssssss", "is 300 bytes long; a name is at most 100"), {}),
    "300-character store name": (GOOD, ["--store", "{dir}/" + "s" * 300 + ".zarr"],
                                 ("--store {dir}/sss", "is 317 bytes with '.checkpoints'"), {}),
    "foreign Zarr store": (GOOD, ["--store", "{dir}/foreign.zarr"], "store path {dir}/foreign.zarr is a Zarr store that "
                           "kktlab did not write ('x' is a Zarr array without kktlab's identity)", {}),
    "Zarr v2 store": (GOOD, ["--store", "{dir}/v2.zarr"], "store path {dir}/v2.zarr is a Zarr v2 store", {}),
}
PLAIN = ["binary config", "duplicate top-level key", "--store ''", "dead PREFECT_API_URL"]
NEEDS_DATA = [name for name in CASES if CASES[name][3].get("KKTLAB_DATA", "").endswith("/data")]


def shared_data_copy(folder: pathlib.Path, drop: str = "", corrupt: str = "", wrong_sums: str = "") -> None:
    """``folder/data``: the shared data files linked, but ``drop`` left out, ``corrupt`` copied with
    one byte flipped, and ``wrong_sums``'s line of its folder's SHA256SUMS changed."""
    for sub in ("mnist", "cifar10"):
        if not (SHARED_DATA / sub).is_dir():
            continue  # the cases that need it are skipped
        (folder / "data" / sub).mkdir(parents=True)
        for f in (SHARED_DATA / sub).iterdir():
            dst = folder / "data" / sub / f.name
            if f.name == drop:
                continue
            if f.name == corrupt:
                data = bytearray(f.read_bytes())
                data[100] ^= 0xFF
                dst.write_bytes(bytes(data))
            elif f.name == "SHA256SUMS":
                dst.write_text("".join(("0" * 64 + line[64:] if wrong_sums and wrong_sums in line else line) + "\n"
                                       for line in f.read_text().splitlines()))
            else:
                dst.symlink_to(f)


def foreign_store(path: pathlib.Path, zarr_format: int) -> None:
    """Another program's Zarr store: a group holding one array."""
    import zarr

    zarr.open_group(str(path), mode="w", zarr_format=zarr_format).create_array("x", shape=(3,), dtype="f8")


SETUP = {  # case -> what its folder holds besides the config
    "MNIST file missing": lambda d: shared_data_copy(d, drop="t10k-labels-idx1-ubyte.gz"),
    "MNIST file corrupt": lambda d: shared_data_copy(d, corrupt="t10k-labels-idx1-ubyte.gz"),
    "MNIST SHA256SUMS missing": lambda d: shared_data_copy(d, drop="SHA256SUMS"),
    "MNIST missing, chain stage grid": lambda d: shared_data_copy(d, drop="train-images-idx3-ubyte.gz"),
    "CIFAR file corrupt": lambda d: shared_data_copy(d, wrong_sums="cifar10_batch1_test1000.npz"),
    "foreign Zarr store": lambda d: foreign_store(d / "foreign.zarr", 3),
    "Zarr v2 store": lambda d: foreign_store(d / "v2.zarr", 2),
}


def write_case(folder: pathlib.Path, name: str, port: int) -> dict:
    """The case's files in ``folder`` and what the helper process runs: argv, env, uid."""
    config, args, _, env = CASES[name]
    folder.mkdir(mode=0o755)
    (folder / "afile").write_text("a regular file\n")
    (folder / "good.yaml").write_text(yaml.safe_dump(GOOD))
    SETUP.get(name, lambda d: None)(folder)
    path = folder / "cfg.yaml"
    if isinstance(config, bytes):
        path.write_bytes(config)
    elif isinstance(config, str):
        path.write_text(config)
    elif config is not None:
        path.write_text(yaml.safe_dump(json.loads(json.dumps(config).replace("{dir}", str(folder)))))
    fill = lambda s: s.format(cfg=path, dir=folder, port=port)  # noqa: E731
    argv = [fill(a) for a in args]
    if config is not None:
        has_store = "--store" in args or isinstance(config, dict) and "store" in config
        argv = ["run", str(path), *argv] + ([] if has_store else ["--store", str(folder / "s.zarr")])
    job = {"name": name, "argv": argv, "env": {k: fill(v) for k, v in env.items()}, "uid": None, "store": None}
    if name == "read-only store":  # a real store, made read-only by the helper before the case runs
        job["store"] = str(folder / "ro.zarr")
        job["uid"] = 65534 if os.geteuid() == 0 else None  # root writes anywhere: run this case as nobody
    return job


def make_read_only_store(path: str) -> None:
    from flows import config
    from storage.store import Store

    c = config.parse(GOOD)
    Store(path, c.name).open_or_create(c.exp, c.grid, c.params, config_text="", device="cpu",
                                       extra_sizes=c.exp.extra_dims(c.cells()))
    subprocess.run(["chmod", "-R", "a-w", path], check=True)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case run once, by one helper process that forks a process per case."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="kktlab-bad-"))  # world-readable: one case runs as nobody
    base.chmod(0o755)
    port = closed_port()
    jobs = [write_case(base / f"case{i}", name, port) for i, name in enumerate(CASES)]
    t0 = time.monotonic()
    # one JSON line per case as it ends; each case has its own time limit (_run_case), so a slow machine
    # fails at most the case that ran out of time, never the cases after it
    proc = subprocess.run([sys.executable, __file__], input=json.dumps(jobs), capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).resolve().parents[1], timeout=CASE_TIMEOUT_S * len(jobs) + 120)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    print(f"{len(results)} of {len(jobs)} cases in {time.monotonic() - t0:.1f} s")
    stopped = {"rc": None, "output": f"the helper process stopped before this case: {proc.stderr[-2000:]}"}
    yield {name: dict(results[i] if i < len(results) else stopped, dir=base / f"case{i}", port=port)
           for i, name in enumerate(CASES)}
    subprocess.run(["chmod", "-R", "u+w", str(base)])
    shutil.rmtree(base, ignore_errors=True)


def check_one_line(rc: int, output: str, expected: str | tuple[str, ...]) -> None:
    lines = output.strip().splitlines()
    assert rc != 0 and "Traceback" not in output, output[-3000:]
    assert len(lines) == 1 and lines[0].startswith("kktlab: error: "), output[-3000:]
    for part in expected if isinstance(expected, tuple) else (expected,):
        assert part in lines[0], lines[0]


def expected_text(name: str, folder: pathlib.Path, port: int) -> str | tuple[str, ...]:
    fill = lambda s: s.format(cfg=folder / "cfg.yaml", dir=folder, port=port)  # noqa: E731
    expected = CASES[name][2]
    return tuple(map(fill, expected)) if isinstance(expected, tuple) else fill(expected)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line(name, outcomes):
    """(How long each takes is no test's business: each case has 60 s before it is killed.)"""
    if name in NEEDS_DATA and not (SHARED_DATA / "mnist").is_dir():
        pytest.skip(f"needs the shared data folder {SHARED_DATA}")
    r = outcomes[name]
    assert r["rc"] is not None, r["output"]
    check_one_line(r["rc"], r["output"], expected_text(name, r["dir"], r["port"]))
    assert not (r["dir"] / "s.zarr").exists()  # no store was made


@pytest.mark.parametrize("name", ["foreign Zarr store", "Zarr v2 store"])
def test_a_foreign_store_gets_no_group(name, outcomes):
    """Issue 29 item 7: kktlab refuses another program's Zarr store and leaves it as it was."""
    store = outcomes[name]["dir"] / ("foreign.zarr" if name == "foreign Zarr store" else "v2.zarr")
    assert sorted(p.name for p in store.iterdir()) in (["x", "zarr.json"], [".zattrs", ".zgroup", "x"]), \
        sorted(p.name for p in store.iterdir())


@pytest.mark.parametrize("name", PLAIN)
def test_plain(name, cli, tmp_path):
    """The same cases as plain ``python -m kktlab.cli`` processes."""
    port = closed_port()
    job = write_case(tmp_path / "case", name, port)
    proc = cli.run(*job["argv"], env=job["env"], timeout=120)
    check_one_line(proc.returncode, proc.stdout + proc.stderr, expected_text(name, tmp_path / "case", port))


CASE_TIMEOUT_S = 60.0  # each case's limit, then it is killed (and reported as exit 124)


def _run_case(job: dict, out: str, timeout: float = CASE_TIMEOUT_S) -> dict:
    """Fork one process that runs ``kktlab.cli`` as ``python -m`` does, with the job's argv, env and uid."""
    import runpy
    import signal
    import traceback

    if job["store"]:
        make_read_only_store(job["store"])
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ.update(job["env"])
            sys.argv = ["kktlab", *job["argv"]]
            try:
                if job["uid"] is not None:  # nobody may not read the checkout (CI clones into a 0700 dir):
                    import importlib  # import every module of the project first, then drop to nobody
                    import pkgutil

                    root = pathlib.Path(__file__).resolve().parents[1]
                    for room in ("core", "storage", "deploy", "tasks", "flows", "kktlab"):
                        importlib.import_module(room)
                        for mod in pkgutil.walk_packages([str(root / room)], prefix=f"{room}."):
                            importlib.import_module(mod.name)
                    os.setgid(job["uid"])
                    os.setuid(job["uid"])
                    sys.exit(sys.modules["kktlab.cli"].main(job["argv"]))
                runpy.run_module("kktlab.cli", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - printed as the interpreter would
                traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - t0 > timeout:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = 124 << 8
            break
        time.sleep(0.02)
    return {"rc": os.waitstatus_to_exitcode(status) if status != 124 << 8 else 124,
            "output": pathlib.Path(out).read_text(errors="replace"), "wall_s": time.monotonic() - t0}


if __name__ == "__main__":  # the helper process: import once, then one forked process per case
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import flows.config  # noqa: F401
    import flows.experiments
    import kktlab.preflight  # noqa: F401
    import deploy.probe  # noqa: F401
    import kktlab.served  # noqa: F401 - what kktlab.cli imports (itself is run by runpy, as python -m does)
    import kktlab.tables  # noqa: F401
    import storage.store  # noqa: F401 - zarr and xarray (Prefect is not: cases set its environment)
    import storage.verify  # noqa: F401

    flows.experiments.names()  # every experiment (and torch) imported before the forks
    with tempfile.TemporaryDirectory() as tmp:
        for i, job in enumerate(json.load(sys.stdin)):
            print(json.dumps(_run_case(job, os.path.join(tmp, f"{i}.out"))), flush=True)


TROUBLESHOOTING = pathlib.Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"


def troubleshooting_lines() -> dict[str, str]:
    """docs/troubleshooting.md's shown line of each case it tags (``<!-- case: NAME -->`` then a
    ```text block holding the one line)."""
    import re

    text = TROUBLESHOOTING.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- case: (.+?) -->\n```text\n(.+?)\n```", text)}


def test_the_troubleshooting_page_shows_what_kktlab_prints(outcomes):
    """Issue 45: every line docs/troubleshooting.md shows is the line kktlab prints for that case,
    its folder as {dir}, its closed port as {port} and what depends on the machine as '…'."""
    shown = troubleshooting_lines()
    assert len(shown) >= 30 and set(shown) <= set(CASES), set(shown) - set(CASES)
    for name, line in shown.items():
        if name in NEEDS_DATA and not (SHARED_DATA / "mnist").is_dir():
            continue
        r = outcomes[name]
        printed = r["output"].strip().replace(str(r["dir"]), "{dir}").replace(str(r["port"]), "{port}")
        at = 0
        for part in line.split("…"):  # each piece in order; '…' stands for what depends on the machine
            found = printed.find(part, at)
            assert found >= 0 and (at > 0 or found == 0), f"{name}: the page shows\n{line}\nkktlab prints\n{printed}"
            at = found + len(part)
        assert at == len(printed), f"{name}: kktlab prints more than the page shows\n{line}\n{printed}"


def test_an_embedded_server_that_does_not_start_in_time_is_one_line(cli, tmp_path):
    """Issue 44: on a machine too busy to start the embedded Prefect server within its limit, the run
    ends in one line saying which limit and what to do (it was Prefect's RuntimeError traceback), and
    leaves no server process behind."""
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0")  # never migrated
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(GOOD))
    proc = subprocess.run([*cli.argv, "run", str(tmp_path / "good.yaml"), "--store", str(tmp_path / "s.zarr")],
                          cwd=cli.root, env=env, capture_output=True, text=True, timeout=300)
    check_one_line(proc.returncode, proc.stdout + proc.stderr, (
        "the embedded Prefect server did not answer within 0 s (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)",
        "start a server once (make server) and export PREFECT_API_URL"))
    home = env["PREFECT_HOME"]
    left = [p for p in psutil.process_iter(["cmdline", "environ"])
            if "uvicorn" in " ".join(p.info["cmdline"] or []) and (p.info["environ"] or {}).get("PREFECT_HOME") == home]
    assert not left, left
