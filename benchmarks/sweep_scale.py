"""Sweeps at scale (issue 33): the marginal cost of a trivially cheap cell, the files a store holds,
and how long the read-side commands take on it.

One config, ``experiment: forging``, ``estimator: exact``, d = 2 (each cell's maths takes
microseconds), grid ``model_seed: {range: [0, N]}``, one worker, run through the real CLI
(embedded Prefect server, Dask LocalCluster) for a small and a large N on fresh stores. Reported,
from the one run:

* the wall of each sweep (``kktlab run`` end to end) and the marginal cost per cell,
  (wall(N_large) - wall(N_small)) / (N_large - N_small): the fixed cost (server, cluster, store
  creation) cancels;
* the files in each store, and files per cell;
* on the large store: ``kktlab status``, ``verify``, ``show``, and ``open_results`` + a mean over
  ``model_seed`` of three variables, each timed;
* the cells' own maths, timed in this process (``compute_cells`` on the same cells, no Prefect,
  Dask or store): the marginal cost less this is what orchestration and the store cost per cell;
* with ``--kill-after S``: the large sweep is killed (SIGKILL to its process group) S seconds in
  and run again; reported: cells written by each run (their sum must be the grid: every cell
  written once) and the store's ``verify``.

    python benchmarks/sweep_scale.py [--small 100] [--large 10000] [--bundle-size 1024] [--kill-after 60]

Writes ``benchmarks/results/sweep_scale.json``. Not a test: ratios and counts of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import device_info, write  # noqa: E402


def config(n: int, bundle_size: int) -> dict:
    return {"experiment": "forging", "name": "scale", "grid": {"model_seed": {"range": [0, n]}},
            "params": {"estimator": "exact", "d": 2}, "runner": {"workers": 1, "bundle_size": bundle_size}}


def kktlab(*args, env=None, timeout=7200, kill_after=None) -> tuple[float, subprocess.CompletedProcess]:
    """Run the CLI; ``kill_after``: SIGKILL its whole process group (server, cluster) after that many s."""
    import signal

    t0, c0 = time.perf_counter(), children_cpu_s()
    proc = subprocess.Popen([sys.executable, "-m", "kktlab.cli", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=kill_after or timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL if kill_after else signal.SIGTERM)
        out, err = proc.communicate()
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    res.cpu_s = children_cpu_s() - c0  # the command and every process it ran and reaped (server, cluster)
    return time.perf_counter() - t0, res


def children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def maths_ms(n: int, bundle_size: int) -> float:
    """The cells' own maths per cell, in this process: ``compute_cells`` on ``n`` cells of the config."""
    import torch

    from flows import config as config_mod
    from flows.sweep import compute_cells

    torch.set_num_threads(1)
    cfg = config_mod.parse(config(n, bundle_size))
    cells = cfg.cells()
    compute_cells(cfg.exp, cells[:10], "cpu", None)  # warm
    t0 = time.process_time()  # CPU time, as the sweeps' (their wall times ran at another moment's load)
    for i in range(0, n, bundle_size):  # in the sweep's bundles
        compute_cells(cfg.exp, cells[i:i + bundle_size], "cpu", None)
    return 1000 * (time.process_time() - t0) / n


def killed_and_resumed(n: int, bundle_size: int, folder: pathlib.Path, env: dict, after: float) -> dict:
    """The sweep killed ``after`` s in (SIGKILL to the process group), then run again to the end."""
    import yaml

    cfg = folder / f"kill{n}.yaml"
    cfg.write_text(yaml.safe_dump(config(n, bundle_size)))
    store = folder / f"kill{n}.zarr"
    common = ("run", cfg, "--store", store, "--max-cells", max(n, 100_000))
    _, first = kktlab(*common, env=env, kill_after=after)
    from storage.query import status as store_status

    done_after_kill = store_status(str(store))[0]["done"] if (store / "zarr.json").exists() else 0
    wall, res = kktlab(*common, "--json", folder / f"kill{n}.json", env=env)
    if res.returncode != 0:
        raise SystemExit(f"the resumed run of {n} cells failed:\n{res.stderr[-3000:]}")
    stats = json.loads((folder / f"kill{n}.json").read_text())
    _, verify = kktlab("verify", store, env=env)
    return {"cells": n, "killed_after_s": after, "killed_rc": first.returncode, "done_when_killed": done_after_kill,
            "resumed_written": stats["written"], "resumed_done_before": stats["done_before"],
            "each_cell_once": stats["done_before"] + stats["written"] == n and done_after_kill == stats["done_before"],
            "resume_wall_s": round(wall, 2), "verify_rc": verify.returncode, "verify": verify.stdout.strip()[-300:]}


def files(path: pathlib.Path) -> int:
    return sum(len(f) for _, _, f in os.walk(path))


def sweep(n: int, bundle_size: int, folder: pathlib.Path, env: dict) -> dict:
    import yaml

    cfg = folder / f"scale{n}.yaml"
    cfg.write_text(yaml.safe_dump(config(n, bundle_size)))
    store = folder / f"scale{n}.zarr"
    wall, res = kktlab("run", cfg, "--store", store, "--max-cells", max(n, 100_000), "--json",
                       folder / f"stats{n}.json", env=env)
    if res.returncode != 0:
        raise SystemExit(f"kktlab run of {n} cells failed:\n{res.stderr[-3000:]}")
    stats = json.loads((folder / f"stats{n}.json").read_text())
    return {"cells": n, "wall_s": round(wall, 2), "cpu_s": round(res.cpu_s, 2), "files": files(store), "files_per_cell": round(files(store) / n, 3),
            "written": stats["written"], "bundles": stats["bundles"], "store": store}


def reads(store: pathlib.Path, env: dict) -> dict:
    out = {}
    for name, args in (("status", ("status", store)), ("verify", ("verify", store)), ("show", ("show", store))):
        wall, res = kktlab(*args, env=env, timeout=3600)
        out[f"{name}_s"] = round(wall, 2) if res.returncode == 0 else f"exit {res.returncode}"
    code = ("import time, sys; t = time.perf_counter(); from storage.query import open_results; "
            f"ds = open_results({str(store)!r}); "
            "m = ds[['log_volume', 'log_volume_exact', 'done']].astype(float).mean('model_seed').compute(); "
            "print(time.perf_counter() - t)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    out["open_results_mean_s"] = round(float(res.stdout.split()[-1]), 2) if res.returncode == 0 else res.stderr[-300:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--large", type=int, default=10_000)
    ap.add_argument("--bundle-size", type=int, default=1024)
    ap.add_argument("--kill-after", type=float, default=0, help="also kill the large sweep this many s in, and resume")
    ap.add_argument("--out", default="sweep_scale", help="name of the JSON in benchmarks/results/")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kktlab-scale-") as tmp:
        folder = pathlib.Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env["PREFECT_HOME"] = str(folder / "prefect-home")
        small = sweep(args.small, args.bundle_size, folder, env)
        large = sweep(args.large, args.bundle_size, folder, env)
        read = reads(large["store"], env)
        killed = killed_and_resumed(args.large, args.bundle_size, folder, env, args.kill_after) if args.kill_after else None
    maths = maths_ms(min(args.large, 2000), args.bundle_size)
    marginal_ms = 1000 * (large["wall_s"] - small["wall_s"]) / (large["cells"] - small["cells"])
    fixed_s = small["wall_s"] - small["cells"] * marginal_ms / 1000
    # the split in CPU time, both sides (a wall-time marginal minus maths timed at another moment went negative)
    marginal_cpu_ms = 1000 * (large["cpu_s"] - small["cpu_s"]) / (large["cells"] - small["cells"])
    for r in (small, large):
        r.pop("store")
    payload = {"small": small, "large": large, "marginal_ms_per_cell": round(marginal_ms, 2),
               "fixed_s": round(fixed_s, 2), "reads_on_large": read, "bundle_size": args.bundle_size,
               "marginal_cpu_ms_per_cell": round(marginal_cpu_ms, 2), "maths_cpu_ms_per_cell": round(maths, 2),
               "overhead_cpu_ms_per_cell": round(marginal_cpu_ms - maths, 2),
               "killed_and_resumed": killed, "machine": device_info("cpu")}
    print(f"marginal cost per cell: {marginal_ms:.2f} ms (fixed cost of a sweep: {fixed_s:.1f} s)")
    print(f"files: {small['files']} for {small['cells']} cells, {large['files']} for {large['cells']} cells "
          f"({large['files_per_cell']} per cell)")
    print("reads on the large store:", ", ".join(f"{k} {v}" for k, v in read.items()))
    if marginal_cpu_ms <= maths:  # e.g. 550 cells: -1.7 ms, the fixed cost's spread (server, cluster) is larger
        print(f"in CPU time: not resolved at these sizes ({marginal_cpu_ms:.2f} ms per cell at the margin, below the "
              f"cells' own maths, {maths:.2f} ms: the fixed cost varies more between runs); use --large 10000 or more")
    else:
        print(f"in CPU time: {marginal_cpu_ms:.2f} ms per cell at the margin (every process of the run), of which the "
              f"cells' own maths {maths:.2f} ms, orchestration and store {marginal_cpu_ms - maths:.2f} ms")
    if killed:
        print("killed and resumed:", killed)
    print("written:", write(args.out, payload))


if __name__ == "__main__":
    main()
