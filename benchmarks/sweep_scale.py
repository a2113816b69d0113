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
  ``model_seed`` of three variables, each timed.

    python benchmarks/sweep_scale.py [--small 100] [--large 2000] [--bundle-size 64]

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


def kktlab(*args, env=None, timeout=7200) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "kktlab.cli", *map(str, args)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - t0, res


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
    return {"cells": n, "wall_s": round(wall, 2), "files": files(store), "files_per_cell": round(files(store) / n, 3),
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
    ap.add_argument("--large", type=int, default=2000)
    ap.add_argument("--bundle-size", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kktlab-scale-") as tmp:
        folder = pathlib.Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env["PREFECT_HOME"] = str(folder / "prefect-home")
        small = sweep(args.small, args.bundle_size, folder, env)
        large = sweep(args.large, args.bundle_size, folder, env)
        read = reads(large["store"], env)
    marginal_ms = 1000 * (large["wall_s"] - small["wall_s"]) / (large["cells"] - small["cells"])
    fixed_s = small["wall_s"] - small["cells"] * marginal_ms / 1000
    for r in (small, large):
        r.pop("store")
    payload = {"small": small, "large": large, "marginal_ms_per_cell": round(marginal_ms, 2),
               "fixed_s": round(fixed_s, 2), "reads_on_large": read, "bundle_size": args.bundle_size,
               "machine": device_info("cpu")}
    print(f"marginal cost per cell: {marginal_ms:.2f} ms (fixed cost of a sweep: {fixed_s:.1f} s)")
    print(f"files: {small['files']} for {small['cells']} cells, {large['files']} for {large['cells']} cells "
          f"({large['files_per_cell']} per cell)")
    print("reads on the large store:", ", ".join(f"{k} {v}" for k, v in read.items()))
    print("written:", write("sweep_scale", payload))


if __name__ == "__main__":
    main()
