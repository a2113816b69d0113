"""How long the paper grids take on one GPU (issue 46): paper 002 Fig. 1(a) (configs/paper-002-fig1.yaml,
width k = 1000: 250 nets, then their robustness analysis) and paper 004 F004-1
(configs/paper-004-f1.yaml: 2 nets trained to loss 1e-7, 70 KKT reconstruction attacks of 50,000
steps, 2 F004-3 constructions), timed on a representative slice and extrapolated to the full grid.

Every timing calls an experiment's real ``run_bundle`` (flows/experiments/*.py) on cells taken
from the real config, bundled as the sweep bundles them (one true shape per training bundle; a
reading stage's bundle is one stacked problem over its rows), one torch thread as a sweep worker
has. What is capped to fit the slot, and how it is scaled back:

* training bundles run ``max_iters`` = N steps (a few seconds each): the seconds per step are the
  slope of (wall, step) at the training loop's sync points (read through the bundle-progress hook,
  flows/bundle_progress.py), the rest of the bundle's wall (data, transfer, packing) is fixed; a
  full bundle is fixed + T · slope, T = the iterations a cell takes (paper 002 with the paper's
  schedule: ~75,000, spec 002 §7 and its appendix's 71,388-75,216; paper 004 F004-1: measured when
  the real bundle finishes within its deadline, else bounded). Shapes not timed take the least
  squares fit of seconds per step against the step's FLOP (and fixed seconds against E·m·d·k).
* reconstruction bundles run ``steps`` = S1 and S2: per step = the difference over S2 - S1, the
  rest fixed; a full bundle is fixed + 50,000 · per step.
* the robustness analysis (float64, on the CPU) runs on the capped nets with their labels replaced
  by the nets' own signs, so every net separates its data and the KKT fit runs as on converged
  nets (its FISTA may stop at another iteration: indicative).

    python benchmarks/paper_grid_timing.py --out DIR                      # on the GPU machine
    python benchmarks/paper_grid_timing.py --out /tmp/pg --device cpu --small  # smoke test, tiny sizes
"""

from __future__ import annotations

import argparse
import itertools
import os
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.bundle_timing import nets_from, nnls_fit, predict, run_timed, slope  # noqa: E402
from benchmarks.gpu_probe import nvidia_smi, write_json  # noqa: E402
from benchmarks.paper004_timing import Paper004Timing  # noqa: E402
from flows import config as config_mod  # noqa: E402
from flows.bundles import make_bundles  # noqa: E402
from flows.experiments import get as get_exp  # noqa: E402
from tasks.cells.nonrobust import n_samples  # noqa: E402

T_PAPER002 = 75_000  # iterations per run with the paper's schedule (spec 002 §7; appendix: 71,388-75,216)
# paper 002 shapes (alpha, d) in the order they are timed (cheap and telling first); the rest is fitted
SHAPES_002 = [(1.0, 500), (0.5, 100), (1.5, 1000), (1.2, 1000), (1.0, 1000), (0.8, 500), (1.5, 300), (0.5, 1000),
              (1.2, 500), (1.5, 600)]


class Timing(Paper004Timing):
    def __init__(self, a):
        self.a, self.dev = a, torch.device(a.device)
        self.t0 = time.perf_counter()
        self.path = pathlib.Path(a.out) / f"paper_grid_timing_{self.dev.type}.json"
        self.payload = {"args": vars(a), "errors": [], "skipped": [], "torch_threads": torch.get_num_threads(),
                        "paper002_fig1": {"config": "configs/paper-002-fig1.yaml", "train_bundles": [],
                                          "analysis_bundles": []},
                        "paper004_f1": {"config": "configs/paper-004-f1.yaml"}}
        if self.dev.type == "cuda":
            self.payload["smi_start"] = nvidia_smi()
            self.payload["gpu"] = torch.cuda.get_device_name()
        if self.dev.type == "cuda":  # context, cuBLAS handles and the fp32/fp64 GEMM kernels before any timing
            t = time.perf_counter()
            for dt in (torch.float32, torch.float64):
                x = torch.randn(512, 512, dtype=dt, device=self.dev)
                (x @ x).sum().item()
            self.payload["cuda_warmup_s"] = time.perf_counter() - t
        self.c002 = config_mod.load(ROOT / "configs/paper-002-fig1.yaml")
        self.c004 = config_mod.load(ROOT / "configs/paper-004-f1.yaml")

    def left(self):
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def save(self):
        self.payload["elapsed_s"] = time.perf_counter() - self.t0
        write_json(self.path, "paper_grid_timing", self.payload, str(self.dev))

    def guard(self, label, need_s, fn):
        if self.left() < need_s:
            self.payload["skipped"].append(f"{label}: {self.left():.0f} s left, needs ~{need_s:.0f} s")
            print(f"[skip] {label}: {self.left():.0f} s left, needs ~{need_s:.0f}", flush=True)
            return None
        t = time.perf_counter()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - one part's failure never stops the others
            traceback.print_exc()
            self.payload["errors"].append(f"{label}: {type(exc).__name__}: {str(exc)[:400]}")
            return None
        finally:
            print(f"[{label}] {time.perf_counter() - t:.1f} s (left {self.left():.0f} s)", flush=True)
            self.save()

    # ------------------------------------------------------------------------ the grids' structure
    def structure(self):
        """Cells and bundles of every stage of both configs, as the sweep cuts them (make_bundles)."""
        out = {}
        for tag, chain in (("paper002_fig1", self.c002), ("paper004_f1", self.c004)):
            stages = {}
            for s in chain.stages:
                cells = s.store_cells()
                if s.source:  # a reading stage: this stage's cells once per upstream cell, with its parameters
                    up = chain.stage(s.source)
                    ups = up.cells()
                    cells = [s.exp.with_inherited(c, u) for u in ups for c in s.cells()]
                bundles = make_bundles(s.exp, list(enumerate(cells)), s.runner["bundle_size"],
                                       workers=s.runner.get("workers", 1))
                stages[s.name] = {"experiment": s.experiment, "cells": len(cells), "bundles": len(bundles),
                                  "bundle_sizes": sorted({len(b) for b in bundles}), "reads": s.source}
            out[tag] = {"stages": stages, "cells": sum(v["cells"] for v in stages.values()),
                        "runner": chain.runner}
            self.payload[tag]["structure"] = out[tag]
        print("grid structure: " + "; ".join(f"{t}: " + ", ".join(f"{n} {v['cells']} cells/{v['bundles']} bundles"
                                                                 for n, v in o["stages"].items()) for t, o in out.items()))

    # ------------------------------------------------------------------------------- paper 002
    def small(self, c: dict) -> dict:
        if self.a.small:
            c = dict(c, width=min(c["width"], 40))
            if "d" in c:
                c["d"] = min(c["d"], 20)
        return c

    def p002_cells(self, alpha, d):
        return [self.small(c) for c in self.c002.stages[0].cells() if c["alpha"] == alpha and c["d"] == d]

    @staticmethod
    def p002_row(cells):
        c = cells[0]
        m = n_samples(c)
        B = min(m, c["batch_size"])
        return {"alpha": c["alpha"], "d": c["d"], "m": m, "E": len(cells), "B": B, "k": c["width"],
                "minibatch": m > c["batch_size"], "flop_per_step": 4.0 * len(cells) * B * c["d"] * c["width"],
                "emdk": float(len(cells) * m * c["d"] * c["width"]), "em2d": float(len(cells) * m * m * c["d"]),
                "em2_kkt": float(len(cells) * m * m * (m <= c.get("kkt_max_m", 4000)))}

    def p002_train(self, alpha, d):
        cells = self.p002_cells(alpha, d)
        row = self.p002_row(cells)
        prior = 2e-4 + row["flop_per_step"] / 30e12  # s/step guess: launches + GEMM at 30 TFLOP/s
        n = int(min(self.a.max_steps, max(300, self.a.step_seconds / prior)) // 100 * 100)
        if self.a.small:
            n = 200
        capped = [dict(c, max_iters=n) for c in cells]
        exp = get_exp("train")
        res, info, marks = run_timed(lambda: exp.run_bundle(capped, self.a.device), self.a.train_deadline_s, self.dev)
        sec, last = slope(marks)
        row.update(info, steps_run=last, max_iters_cap=n, s_per_step=sec)
        if sec is not None:
            row["fixed_s"] = max(info["wall_s"] - last * sec, 0.0) if not info["aborted_at_deadline"] else None
            row["achieved_tflops"] = row["flop_per_step"] / sec / 1e12
        self.payload["paper002_fig1"]["train_bundles"].append(row)
        fixed = row.get("fixed_s")
        print(f"  002 alpha={alpha} d={d} (m={row['m']}, E={row['E']}): {n} steps in {info['wall_s']:.2f} s, "
              f"{(sec or float('nan')) * 1e3:.3f} ms/step, fixed {float('nan') if fixed is None else fixed:.2f} s",
              flush=True)
        return res, cells

    def p002_analysis(self, res, cells):
        if res is None:
            return
        row = self.p002_row(cells)
        if row["m"] > self.a.analysis_max_m:  # Thm 3.1's robust net forms the (E, m, m) Gram matrix in float64
            note = (f"not timed: m = {row['m']} > {self.a.analysis_max_m}; the analysis forms (E, m, m) float64 "
                    f"matrices ({row['E'] * row['m'] ** 2 * 8 / 2**30:.1f} GiB each)")
            self.payload["paper002_fig1"].setdefault("analysis_not_timed", []).append({**row, "note": note})
            print(f"  002 analysis alpha={row['alpha']} d={row['d']}: {note}", flush=True)
            return
        nets = nets_from(res, cells, relabel=True)
        exp = get_exp("universal_attack")
        own = self.c002.stages[1].cells()[0]
        rcells = [exp.with_inherited(dict(own), c) for c in cells]
        _, info, _ = run_timed(lambda: exp.run_bundle(rcells, self.a.device, inputs=nets), self.a.analysis_deadline_s,
                               self.dev)
        row.update(info, analysis_s=info.get("wall_s_extrapolated_from_progress") if info["aborted_at_deadline"]
                   else info["wall_s"])
        self.payload["paper002_fig1"]["analysis_bundles"].append(row)
        print(f"  002 analysis alpha={row['alpha']} d={row['d']} (m={row['m']}): {info['wall_s']:.2f} s"
              + (" (deadline)" if info["aborted_at_deadline"] else ""), flush=True)

    def p002_full_small(self):
        """The cheapest bundle (alpha 0.5, d 100) trained for real to loss 1e-30: T as it is."""
        cells = self.p002_cells(0.5, 100)
        if self.a.small:
            cells = [dict(c, max_iters=3000) for c in cells]
        exp = get_exp("train")
        res, info, marks = run_timed(lambda: exp.run_bundle(cells, self.a.device), self.a.full_deadline_s, self.dev)
        sec, last = slope(marks)
        row = {**self.p002_row(cells), **info, "steps_reached": last, "s_per_step": sec}
        if res is not None:
            row["iters"] = [int(r["iters"]) for r in res]
            row["status"] = [int(r["status"]) for r in res]
        self.payload["paper002_fig1"]["full_run_alpha0.5_d100"] = row
        print(f"  002 full bundle alpha=0.5 d=100: {info['wall_s']:.1f} s, iters {row.get('iters', 'not finished')}",
              flush=True)

    def p002_extrapolate(self):
        P = self.payload["paper002_fig1"]
        train_rows = [r for r in P["train_bundles"] if r.get("s_per_step")]
        f_step = [lambda r: 1.0, lambda r: r["flop_per_step"]]
        f_fixed = [lambda r: 1.0, lambda r: r["emdk"]]
        f_an = [lambda r: 1.0, lambda r: r["emdk"], lambda r: r["em2d"], lambda r: r["em2_kkt"]]
        fit_step = nnls_fit(train_rows, f_step, "s_per_step")
        fit_fixed = nnls_fit([r for r in train_rows if r.get("fixed_s") is not None], f_fixed, "fixed_s")
        fit_an = nnls_fit(P["analysis_bundles"], f_an, "analysis_s")
        full = P.get("full_run_alpha0.5_d100", {})
        T_meas = max(full["iters"]) if full.get("iters") else None
        measured = {(r["alpha"], r["d"]): r for r in train_rows}
        measured_an = {(r["alpha"], r["d"]): r for r in P["analysis_bundles"] if r.get("analysis_s") is not None}
        bundles = []
        tot = {"train_s": 0.0, "analysis_s": 0.0}
        grid = self.c002.stages[0].grid
        for alpha, d in itertools.product(grid["alpha"], grid["d"]):
            cells = [c for c in self.c002.stages[0].cells() if c["alpha"] == alpha and c["d"] == d]
            row = self.p002_row(cells)
            mr = measured.get((alpha, d))
            step = mr["s_per_step"] if mr else predict(fit_step, f_step, row)
            fixed = mr["fixed_s"] if mr and mr.get("fixed_s") is not None else predict(fit_fixed, f_fixed, row)
            an = measured_an[(alpha, d)]["analysis_s"] if (alpha, d) in measured_an else predict(fit_an, f_an, row)
            if step is None:
                continue
            train_s = (fixed or 0.0) + self.a.T002 * step
            tot["train_s"] += train_s
            tot["analysis_s"] += an or 0.0
            bundles.append({"alpha": alpha, "d": d, "m": row["m"], "s_per_step": step, "fixed_s": fixed,
                            "train_s": train_s, "analysis_s": an, "measured": bool(mr)})
        cells = P.get("structure", {}).get("cells") or 500
        ex = {"T_iterations_assumed": self.a.T002, "T_source": "spec 002 §7 (appendix runs: 71,388-75,216)",
              "T_measured_alpha0.5_d100": T_meas, "fit_s_per_step": fit_step, "fit_fixed_s": fit_fixed,
              "fit_analysis_s": fit_an, "bundles": bundles, "train_s": tot["train_s"], "analysis_s": tot["analysis_s"],
              "total_s": tot["train_s"] + tot["analysis_s"], "total_h": (tot["train_s"] + tot["analysis_s"]) / 3600,
              "cells": cells, "cells_per_s": cells / max(tot["train_s"] + tot["analysis_s"], 1e-9),
              "bundles_estimated": len(bundles),
              "note": "one GPU, workers 1, bundles in turn; analysis is float64 on one CPU thread (it could overlap "
                      "the training of later bundles); shapes not timed are fitted"}
        if T_meas:
            ex["total_s_at_T_measured"] = sum((b["fixed_s"] or 0.0) + T_meas * b["s_per_step"] + (b["analysis_s"] or 0.0)
                                              for b in bundles)
        P["extrapolation"] = ex
        print(f"paper 002 Fig. 1(a) full grid on this GPU: ~{ex['total_s'] / 60:.1f} min ({ex['train_s'] / 60:.1f} min "
              f"training at T = {self.a.T002}, {ex['analysis_s'] / 60:.1f} min analysis), {cells} cells, "
              f"{ex['cells_per_s']:.3f} cells/s", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for everything (default: $STEP_LIMIT_S - 12, which gpu_session_4.sh sets to the step's timeout, else 130.0)")
    ap.add_argument("--small", action="store_true", help="tiny widths and dims (a smoke test of every path)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a sweep worker has 1)")
    ap.add_argument("--T002", type=int, default=T_PAPER002, help="iterations per paper-002 cell (paper's schedule)")
    ap.add_argument("--step-seconds", type=float, default=1.5, help="seconds of capped training per paper-002 shape")
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--shapes", type=int, default=len(SHAPES_002), help="paper-002 shapes to time (in SHAPES_002 order)")
    ap.add_argument("--train-deadline-s", type=float, default=20.0)
    ap.add_argument("--analysis-deadline-s", type=float, default=12.0)
    ap.add_argument("--analysis-max-m", type=int, default=6000, help="time the analysis of shapes up to this m")
    ap.add_argument("--full-deadline-s", type=float, default=20.0)
    ap.add_argument("--f1-train-deadline-s", type=float, default=30.0)
    ap.add_argument("--attack-steps1", type=int, default=20)
    ap.add_argument("--attack-steps2", type=int, default=220)
    ap.add_argument("--attack-deadline-s", type=float, default=25.0)
    ap.add_argument("--constructions-deadline-s", type=float, default=15.0)
    a = ap.parse_args(argv)
    if a.budget_s is None:
        a.budget_s = float(os.environ["STEP_LIMIT_S"]) - 12 if os.environ.get("STEP_LIMIT_S") else 130.0
    torch.set_num_threads(a.threads)
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
    tm = Timing(a)
    tm.guard("structure", 0, tm.structure)
    shapes = SHAPES_002[: a.shapes] if not a.small else [(0.5, 100), (1.0, 100), (1.5, 100)]
    first = shapes[:3]
    tm.guard("004 attack", 15, tm.p004_attack)  # the largest part of F004-1: first
    for alpha, d in first:  # the core paper-002 shapes, each with its analysis
        out = tm.guard(f"002 train alpha={alpha} d={d}", 8, lambda alpha=alpha, d=d: tm.p002_train(alpha, d))
        if out and out[0] is not None:
            tm.guard(f"002 analysis alpha={alpha} d={d}", 6, lambda out=out: tm.p002_analysis(*out))
    tm.guard("004 train", 20, tm.p004_train)
    tm.guard("004 constructions", 12, tm.p004_constructions)
    for alpha, d in shapes[3:]:
        out = tm.guard(f"002 train alpha={alpha} d={d}", 10, lambda alpha=alpha, d=d: tm.p002_train(alpha, d))
        if out and out[0] is not None:
            tm.guard(f"002 analysis alpha={alpha} d={d}", 8, lambda out=out: tm.p002_analysis(*out))
    tm.guard("002 full bundle alpha=0.5 d=100", 15, tm.p002_full_small)
    tm.guard("002 extrapolation", 0, tm.p002_extrapolate)
    tm.guard("004 extrapolation", 0, tm.p004_extrapolate)
    if tm.dev.type == "cuda":
        tm.payload["smi_end"] = nvidia_smi()
    tm.save()
    print("wrote", tm.path, f"in {time.perf_counter() - tm.t0:.0f} s")


if __name__ == "__main__":
    main()
