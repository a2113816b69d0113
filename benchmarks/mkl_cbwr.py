"""What ``MKL_CBWR=AVX2,STRICT`` (deploy/runtime.py QUIET_ENV; issue 29 item 2) costs: the same
float64 work in fresh processes with the setting and without it (MKL reads it once, when it loads,
so each side is its own process), interleaved ``--repeats`` times; each time the minimum.

Work: train_kkt bundles at three shapes (the paper-001 cell's GD, two matmuls a step) and a bare
(64, 50, 100) @ (64, 100, 100) float64 bmm, one torch thread. Also checks what the setting buys: a
lone odd-sized net trained alone equals it bundled, bit for bit, with it (and whether without).
Writes benchmarks/results/mkl_cbwr.json.

    python benchmarks/mkl_cbwr.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(37, 11, 13, 4), (100, 20, 50, 16), (784, 50, 100, 8)]  # d, m, width, E
EPOCHS = 400

WORK = r"""
import json, sys, time, torch
sys.path.insert(0, 'tests')
torch.set_num_threads(1)
from flows import experiments
import test_bundle_invariance_readers as inv
exp = experiments.get("train_kkt")
out = {}
for d, m, w, E in %(shapes)s:
    cells = [dict(inv.defaults("train_kkt"), epochs=%(epochs)d, d=d, m=m, width=w, seed=s) for s in range(E)]
    exp.run_bundle(cells[:2], "cpu")
    t = time.perf_counter(); exp.run_bundle(cells, "cpu"); out[f"train_kkt d{d} m{m} n{w} E{E}"] = time.perf_counter() - t
a = torch.randn(64, 50, 100, dtype=torch.float64); b = torch.randn(64, 100, 100, dtype=torch.float64)
t = time.perf_counter()
for _ in range(200): a @ b
out["bmm (64,50,100)@(64,100,100) x200"] = time.perf_counter() - t
try:
    inv.check_train_kkt_bit_identical_alone_and_bundled(); out["bit_identical"] = True
except AssertionError:
    out["bit_identical"] = False
print(json.dumps(out))
"""


def once(strict: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env["MKL_CBWR"] = "AVX2,STRICT" if strict else "AUTO"
    code = WORK % {"shapes": SHAPES, "epochs": EPOCHS}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    from benchmarks.common import write

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    runs = {True: [], False: []}
    for r in range(args.repeats):
        for strict in ((True, False) if r % 2 == 0 else (False, True)):
            runs[strict].append(once(strict))
    keys = [k for k in runs[True][0] if k != "bit_identical"]
    best = {s: {k: min(x[k] for x in runs[s]) for k in keys} for s in runs}
    rows = {k: {"strict_s": best[True][k], "auto_s": best[False][k], "strict_over_auto": best[True][k] / best[False][k]}
            for k in keys}
    for k, v in rows.items():
        print(f"{k:44s} strict {v['strict_s']:.3f} s  auto {v['auto_s']:.3f} s  ratio {v['strict_over_auto']:.3f}")
    payload = {"rows": rows, "repeats": args.repeats, "epochs": EPOCHS,
               "bit_identical_alone_vs_bundled": {"strict": all(x["bit_identical"] for x in runs[True]),
                                                  "auto": all(x["bit_identical"] for x in runs[False])},
               "load_before": os.getloadavg()[0]}
    print("bit-identical alone vs bundled:", payload["bit_identical_alone_vs_bundled"])
    write("mkl_cbwr", payload)
    return payload


if __name__ == "__main__":
    main()
