"""Mutation check of the kernels in ``tasks/`` (issue 28 item 12): every mutant of the catalogue
``benchmarks/mutations.yaml`` (sign flips, scale factors, dropped terms, wrong constants) is applied
to a temporary copy of the repository (copied once; each mutant edits one file and restores it), and
its listed fast tests run against the copy; a mutant is killed when pytest exits non-zero (a timeout
counts as killed and is recorded as such). Declared equivalents (``equivalent: reason``) are listed
but left out of the score. Writes ``benchmarks/results/mutations.json`` (per-mutant outcome and
seconds, the machine, the date, the git commit).

    python benchmarks/mutations.py            # the whole catalogue, each mutant's listed tests
    python benchmarks/mutations.py --only ID  # one mutant (repeatable); updates its row in the JSON
    python benchmarks/mutations.py --list     # the catalogue, no run
    python benchmarks/mutations.py --fast     # each mutant against the whole fast suite
                                              # (-m "not slow and not requires_services"): slow,
                                              # about 1-2 h on the 2-core machine

Before anything runs, every ``old`` snippet must occur exactly once in its file (else an error
naming the mutant).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "benchmarks" / "mutations.yaml"
RESULT = ROOT / "benchmarks" / "results" / "mutations.json"
FAST = "not slow and not requires_services"
IGNORE = shutil.ignore_patterns(".venv", ".git", "results", "__pycache__", "*.pyc", ".pytest_cache", "*.egg-info",
                                "node_modules", ".mypy_cache", ".ruff_cache")


def load(path: pathlib.Path = CATALOGUE) -> list[dict]:
    """The catalogue's mutants, each checked for its fields and a unique ``old`` (ValueError naming the id)."""
    muts = yaml.safe_load(path.read_text())["mutants"]
    seen = set()
    for m in muts:
        for key in ("id", "file", "old", "new", "why", "tests"):
            if key not in m:
                raise ValueError(f"mutant {m.get('id', '?')}: missing field {key!r}")
        if m["id"] in seen:
            raise ValueError(f"mutant {m['id']}: duplicate id")
        seen.add(m["id"])
        if m["old"] == m["new"]:
            raise ValueError(f"mutant {m['id']}: new equals old")
        f = ROOT / m["file"]
        if not f.is_file():
            raise ValueError(f"mutant {m['id']}: file {m['file']} not found")
        n = f.read_text().count(m["old"])
        if n != 1:
            raise ValueError(f"mutant {m['id']}: its old snippet occurs {n} times in {m['file']} (need exactly 1)")
    return muts


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "tasks"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import cpu_name

    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu_name(),
            "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": commit, "tasks_modified_since_commit": bool(dirty)}


def run_one(copy: pathlib.Path, m: dict, fast: bool, timeout: float) -> dict:
    """Apply ``m`` in ``copy``, run its tests (or the fast suite), restore the file; the outcome row."""
    f = copy / m["file"]
    src = f.read_text()
    f.write_text(src.replace(m["old"], m["new"], 1))
    tests = ["tests"] if fast else list(m["tests"])
    # the catalogue's own checks (tests/test_mutants.py::test_catalogue_*) fail on any applied mutant: left out
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", FAST, "-k", "not test_catalogue",
           *tests]
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, timed_out = p.returncode, p.stdout + p.stderr, False
    except subprocess.TimeoutExpired as e:
        rc, out, timed_out = None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else "", True
    finally:
        f.write_text(src)
    secs = time.perf_counter() - t0
    # rc 5: no test collected (a wrong node id) is an error of the catalogue, not a kill
    if rc == 5:
        raise RuntimeError(f"mutant {m['id']}: pytest collected no test from {tests}")
    killed = timed_out or rc != 0
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return {"id": m["id"], "file": m["file"], "why": m["why"], "tests": tests, "killed": killed,
            "timed_out": timed_out, "returncode": rc, "seconds": round(secs, 2), "killed_by": failed[:3],
            "equivalent": m.get("equivalent")}


def score(rows: list[dict]) -> dict:
    scored = [r for r in rows if not r.get("equivalent")]
    k = sum(r["killed"] for r in scored)
    return {"killed": k, "total": len(scored), "score": k / len(scored) if scored else float("nan"),
            "equivalent": [r["id"] for r in rows if r.get("equivalent")],
            "survivors": [r["id"] for r in scored if not r["killed"]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="run only this mutant id (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--fast", action="store_true", help="run the whole fast suite per mutant (slow)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant (default 300)")
    ap.add_argument("--out", type=pathlib.Path, default=RESULT)
    a = ap.parse_args(argv)
    muts = load()
    if a.list:
        for m in muts:
            eq = "  [equivalent]" if m.get("equivalent") else ""
            print(f"{m['id']:40s} {m['file']:34s} {m['why']}{eq}")
        print(f"{len(muts)} mutants")
        return 0
    if a.only:
        unknown = set(a.only) - {m["id"] for m in muts}
        if unknown:
            raise SystemExit(f"--only: unknown mutant id(s) {sorted(unknown)}")
        muts = [m for m in muts if m["id"] in a.only]
    rows, earlier = [], []
    with tempfile.TemporaryDirectory(prefix="kktlab-mut-") as tmp:
        copy = pathlib.Path(tmp) / "repo"
        shutil.copytree(ROOT, copy, ignore=IGNORE, symlinks=True)
        for m in muts:
            r = run_one(copy, m, a.fast, a.timeout)
            rows.append(r)
            state = "EQUIV" if r["equivalent"] else ("timeout" if r["timed_out"] else ("killed" if r["killed"] else
                                                                                       "SURVIVED"))
            print(f"{r['id']:40s} {state:9s} {r['seconds']:7.1f}s  {', '.join(r['killed_by'])[:90]}", flush=True)
    # --only updates its rows in an existing result of the same mode; a full run replaces it
    mode = "fast_suite" if a.fast else "listed_tests"
    if a.only and a.out.is_file():
        old = json.loads(a.out.read_text())
        if old.get("mode") == mode:
            earlier = old.get("earlier_runs", []) + [old["machine"]]
            by_id = {r["id"]: r for r in old["mutants"]}
            by_id.update({r["id"]: r for r in rows})
            order = [m["id"] for m in load()]
            rows = [by_id[i] for i in order if i in by_id]
    s = score(rows)
    result = {"catalogue": str(CATALOGUE.relative_to(ROOT)), "mode": mode, "pytest_marker": FAST,
              "pytest_deselect": "-k 'not test_catalogue'", "machine": machine(), **s, "mutants": rows}
    if a.only and earlier:  # rows not rerun come from these earlier runs (machine, date, commit of each)
        result["earlier_runs"] = earlier
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"\nscore {s['killed']}/{s['total']} = {s['score']:.3f} (mode {mode}; {len(s['equivalent'])} declared "
          f"equivalent); survivors: {', '.join(s['survivors']) or 'none'}\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
