"""The chain step of benchmarks/gpu_session_5.sh (issues 46 and 39): the configs it runs, and what it
prints and keeps of the store it wrote.

    python benchmarks/chain_session.py config SRC.yaml --out DST.yaml [--upto STAGE] [--small] [--store S]
                                              [--cluster local --device cpu --workers 2]
    python benchmarks/chain_session.py summary STORE --out DIR [--stats run.json] [--limit-s N]

``config`` writes SRC with its later stages left out (``--upto``: the chain up to that stage, so a later
``kktlab run`` of the whole chain finds every upstream cell stored and cuts each reading stage's bundles
from all its cells at once), the store named in it (``--store``: two configs of one ``kktlab run`` each
name their own store), the runner changed, and ``--small``: a CPU dry run's sizes (2 nets, MNIST at
7 x 7, 10 points, width 20, 300 steps; 20 candidates, 100 attack steps).

``summary`` prints and writes (DIR/chain_summary.json, DIR/chain_<group>.csv): per stage the cells done and
failed, the bundles' compute seconds (each cell's ``wall_s`` is its bundle's wall time over its cells),
cells per second, and the span of the cells' finish times; the run's own statistics (``--stats``: the
``kktlab run --json`` file); then the finding: per net its eps_rel; per unlearning method and alpha the
unlearned nets' KKT distance; the KKT attack's and the difference attack's recovery, distance and cosine of
the forgotten vs the retained points (mean and Student's t 95 % interval over the nets, each net first
averaged over its forgotten points), beside the chance baselines (score5_init: random candidates;
chance_cos_*: the nearest other training point), and whether the attack's objective still fell at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

SMALL = {  # the CPU dry run's sizes, per experiment
    "train_kkt": {"d": 49, "m": 10, "width": 20, "epochs": 300},
    "reconstruct": {"n_candidates": 20, "steps": 100},
}

# group experiment -> (variables, --by, --over) of the finding's tables
TABLES = {
    "train_kkt": (("eps_rel", "train_acc", "log10_loss", "q_min", "n_support", "wall_s"), ("seed",), ()),
    "unlearn": (("eps_rel", "eps1_rel", "train_acc_after", "forget_acc_after", "lam_l", "tau_retrain"),
                ("method", "alpha"), ("seed", "forget")),
    "reconstruct": (("cos_forgotten", "cos_retained", "recovered_forgotten", "recovered_retained", "dist_forgotten",
                     "dist_retained", "score5", "score5_init", "objective_rel", "train_eps"),
                    ("method", "alpha"), ("seed", "forget", "radius")),
    "reconstruct_diff": (("cos_forgotten", "chance_cos_forgotten", "cos_retained", "chance_cos_retained",
                          "recovered_forgotten", "recovered_retained", "dist_forgotten", "chance_dist_forgotten",
                          "update_rel"), ("method", "alpha"), ("seed", "forget", "rho")),
}


def cmd_config(a) -> int:
    raw = yaml.safe_load(pathlib.Path(a.src).read_text())
    if a.upto:
        names = [s["name"] for s in raw["stages"]]
        if a.upto not in names:
            raise SystemExit(f"--upto {a.upto}: no such stage (the config has {', '.join(names)})")
        raw["stages"] = raw["stages"][: names.index(a.upto) + 1]
    if a.store:
        raw["store"] = a.store
    run = raw.setdefault("runner", {})
    for key in ("cluster", "device", "workers", "threads_per_worker", "bundle_size"):
        if getattr(a, key) is not None:
            run[key] = getattr(a, key)
    if a.small:
        for st in raw["stages"]:
            st.setdefault("params", {}).update(SMALL.get(st["experiment"], {}))
            if st["experiment"] == "train_kkt":
                st["grid"] = {"seed": [0, 1]}
    pathlib.Path(a.out).write_text(f"# made by benchmarks/chain_session.py config from {a.src}\n"
                                   + yaml.safe_dump(raw, sort_keys=False, width=120))
    print(f"wrote {a.out}: stages {', '.join(s['name'] for s in raw['stages'])}; runner {run}"
          + ("; small sizes" if a.small else ""))
    return 0


def _f(x, fmt=".3g") -> str:
    try:
        return "nan" if x is None or not math.isfinite(float(x)) else format(float(x), fmt)
    except (TypeError, ValueError):
        return str(x)


def timing(store: str) -> dict:
    """Per group: cells done / failed, bundle compute seconds, cells per compute second, finish span."""
    import numpy as np

    from storage.query import groups, open_results

    out = {}
    for g in groups(store):
        ds = open_results(store, g)
        done = ds["done"].values.astype(bool) if "done" in ds else np.ones(1, bool)
        row = {"experiment": ds.attrs.get("kktlab_experiment"), "cells": int(done.size), "done": int(done.sum()),
               "device": ds.attrs.get("device")}
        if "failed" in ds:
            f = ds["failed"].values
            row["failed"] = int((f.astype(str) != "").sum()) if f.dtype.kind in "USO" else int((f != 0).sum())
        if "wall_s" in ds:
            w = ds["wall_s"].values[done]
            w = w[np.isfinite(w)]
            row["bundle_compute_s"] = float(w.sum())
            row["cells_per_compute_s"] = float(w.size / w.sum()) if w.sum() > 0 else None
        if "cell_finished" in ds:
            t = ds["cell_finished"].values[done]
            t = t[~np.isnat(t)] if t.dtype.kind == "M" else t[np.isfinite(t)]
            if t.size:
                span = (t.max() - t.min()) / np.timedelta64(1, "s") if t.dtype.kind == "M" else float(t.max() - t.min())
                row["finish_span_s"] = float(span)
                row["first_finished"], row["last_finished"] = str(t.min()), str(t.max())
        out[g] = row
    return out


def finding(store: str, out_dir: pathlib.Path) -> dict:
    """The tables of :data:`TABLES`, printed, written as csv and returned as records."""
    from storage.query import groups, open_results
    from storage.table import table, write

    res = {}
    for g in groups(store):
        exp = open_results(store, g).attrs.get("kktlab_experiment")
        if exp not in TABLES:
            continue
        vars_, by, over = TABLES[exp]
        ds = open_results(store, g)
        vars_ = [v for v in vars_ if v in ds]
        by = [b for b in by if b in ds.dims]
        over = [o for o in over if o in ds.dims]
        try:
            df = table(store, g, vars=vars_, by=by, over=over)
        except Exception as err:  # noqa: BLE001 - one group's table never stops the others
            print(f"[{g}] no table: {type(err).__name__}: {err}")
            continue
        # csv, not markdown: pandas' markdown needs tabulate, which the GPU image may lack
        (out_dir / f"chain_{g}.csv").write_text(f"# {g} ({exp}): mean over nets (t 95 % interval), each net first "
                                                f"averaged over {', '.join(over) or 'nothing'}\n" + write(df, "csv", None))
        res[g] = {"experiment": exp, "rows": json.loads(df.to_json(orient="records"))}
        short = [c for c in df.columns if c in by or c in vars_ or c.endswith(("_lo", "_hi")) or c == "cells"]
        print(f"\n## {g} ({exp}), over {', '.join(over) or '-'}\n" + df[short].to_string(index=False, float_format=_f))
        if exp == "reconstruct" and "objective_trace" in ds:
            tr = ds["objective_trace"].values.reshape(-1, ds.sizes["trace"])
            ok = (tr[:, -1] > 0) & (tr[:, -2] > 0)
            drop = tr[ok, -1] / tr[ok, -2]
            if drop.size:
                import numpy as np

                res[g]["objective_last_tenth_ratio_median"] = float(np.median(drop))
                print(f"[{g}] objective at the last step over the objective a tenth of the steps earlier, median over "
                      f"{drop.size} rows: {np.median(drop):.4f} (1: converged; < 1: still falling)")
        if exp == "reconstruct" and "status" in ds:
            st = ds["status"].values
            res[g]["status_counts"] = {str(k): int((st == k).sum()) for k in sorted(set(st.ravel().tolist()))}
            from tasks.reconstruct.attack import DIVERGED, DONE

            print(f"[{g}] status counts ({DONE} done, {DIVERGED} diverged): {res[g]['status_counts']}")
    return res


def headline(res: dict) -> list[str]:
    """One line per method and alpha: cosine forgotten vs retained for each attack."""
    lines = []
    for g, r in res.items():
        if r["experiment"] not in ("reconstruct", "reconstruct_diff"):
            continue
        for row in r["rows"]:
            ci = lambda v: f"{_f(row.get(v))} [{_f(row.get(v + '_lo'))}, {_f(row.get(v + '_hi'))}]"  # noqa: E731
            extra = (f", chance {_f(row.get('chance_cos_forgotten'))}" if "chance_cos_forgotten" in row else
                     f", random-candidate score5 {_f(row.get('score5_init'))} vs {_f(row.get('score5'))}")
            lines.append(f"{g} {row.get('method')} alpha={row.get('alpha')}: cos forgotten {ci('cos_forgotten')} vs "
                         f"retained {ci('cos_retained')}; recovered within rho {_f(row.get('recovered_forgotten'))} vs "
                         f"{_f(row.get('recovered_retained'))}{extra} (n={row.get('cos_forgotten_n')})")
    return lines


def cmd_summary(a) -> int:
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"store": a.store, "limit_s": a.limit_s}
    if a.stats:
        for path in a.stats:
            try:
                payload.setdefault("runs", []).append(json.loads(pathlib.Path(path).read_text()))
            except (OSError, ValueError) as err:
                payload.setdefault("runs", []).append({"file": path, "error": str(err)})
    if not pathlib.Path(a.store, "zarr.json").exists():
        print(f"no store at {a.store}: the chain wrote nothing")
        (out / "chain_summary.json").write_text(json.dumps(payload, indent=1, default=str))
        return 1
    payload["stages"] = timing(a.store)
    print("per stage (bundle compute s = the sum of the bundles' wall times; cells/s over it; finish span = first "
          "to last cell finished):")
    for g, r in payload["stages"].items():
        print(f"  {g:10s} {r['experiment']:17s} done {r['done']}/{r['cells']}, failed {r.get('failed', '?')}, "
              f"bundle compute {_f(r.get('bundle_compute_s'), '.1f')} s, {_f(r.get('cells_per_compute_s'))} cells/s, "
              f"finish span {_f(r.get('finish_span_s'), '.1f')} s, device {r.get('device')}")
    for run in payload.get("runs", []):
        for st in run if isinstance(run, list) else [run]:
            if isinstance(st, dict) and "group" in st:
                print(f"  run stats {st['group']}: {st.get('written')}/{st.get('total')} written, bundles "
                      f"{st.get('bundles')}, failed {st.get('failed')}, flow wall {_f(st.get('wall_s'), '.1f')} s"
                      + (f"; failures: {st['failures'][:3]}" if st.get("failures") else ""))
    payload["finding"] = finding(a.store, out)
    payload["headline"] = headline(payload["finding"])
    print("\n# the finding (cosine of the best candidate: W-only nets fix a point only up to scale)")
    print("\n".join(payload["headline"]) or "(no attack group done)")
    (out / "chain_summary.json").write_text(json.dumps(payload, indent=1, default=str))
    print(f"\nwrote {out / 'chain_summary.json'} and {len(payload['finding'])} chain_<group>.csv tables")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config")
    c.add_argument("src")
    c.add_argument("--out", required=True)
    c.add_argument("--upto")
    c.add_argument("--store")
    c.add_argument("--small", action="store_true")
    c.add_argument("--cluster", choices=("local", "cuda", "inline", "address"))
    c.add_argument("--device", choices=("auto", "cpu", "cuda"))
    c.add_argument("--workers", type=int)
    c.add_argument("--threads-per-worker", dest="threads_per_worker", type=int)
    c.add_argument("--bundle-size", dest="bundle_size", type=int)
    s = sub.add_parser("summary")
    s.add_argument("store")
    s.add_argument("--out", required=True)
    s.add_argument("--stats", nargs="*")
    s.add_argument("--limit-s", type=float)
    a = ap.parse_args(argv)
    return cmd_config(a) if a.cmd == "config" else cmd_summary(a)


if __name__ == "__main__":
    sys.exit(main())
