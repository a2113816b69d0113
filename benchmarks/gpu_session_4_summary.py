"""Headline lines of benchmarks/gpu_session_4.sh and gpu_session_5.sh from the JSONs they wrote (their
summary.txt): the wide step's variants with their check against kktlab's step, cold compile, paper grids,
and (session 5) the chain's stages and finding (chain_summary.json of benchmarks/chain_session.py).

    python benchmarks/gpu_session_4_summary.py DIR
"""

from __future__ import annotations

import glob
import json
import os
import sys


def load(folder: str, pattern: str):
    hits = sorted(glob.glob(os.path.join(folder, pattern)))
    if not hits:
        return None
    try:
        with open(hits[0]) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        return {"_error": str(exc)}


def f(x, spec=".3g"):
    return "n/a" if x is None else format(x, spec)


def smi(d: dict | None) -> str:
    s = (d or {}).get("smi_at_write") or (d or {}).get("smi_end") or {}
    return (f"{s.get('name', '?')}, SM {s.get('clocks.sm', '?')}/{s.get('clocks.max.sm', '?')} MHz, mem "
            f"{s.get('clocks.mem', '?')} MHz, {s.get('power.draw', '?')} W, {s.get('temperature.gpu', '?')} C")


def main(folder: str) -> None:
    out = []
    info = load(folder, "gpu_info*.json")
    if info:
        env = info.get("env", {})
        out.append(f"device: {env.get('gpu', env.get('device'))}, torch {env.get('torch')}, CUDA {env.get('cuda')}; "
                   f"{smi(info)}")
    w = load(folder, "wide_step_variants_*.json")
    if w:
        out.append(f"wide step: dense fp32 GEMM {f(w.get('gemm4096_tflops'), '.1f')} TFLOP/s, D2D copy "
                   f"{f(w.get('copy_gbps'), '.0f')} GB/s, same run; {smi(w)}; errors {len(w.get('errors', []))}, "
                   f"skipped {len(w.get('skipped', []))}")
        for key, s in w.get("shapes", {}).items():
            p = s.get("profile_a_kktlab_step")
            if p:
                fr = p.get("fraction_of_wall", {})
                out.append(f"  {key} profile of kktlab's step: {f(p.get('wall_us_per_step'), '.0f')} us/step wall, "
                           f"{f(p.get('kernels_per_step'), '.0f')} kernels; of wall "
                           + ", ".join(f"{k} {100 * v:.0f}%" for k, v in fr.items())
                           + "; top: " + "; ".join(f"{t['name'][:50]} {t['us_per_step']:.0f} us"
                                                   for t in p.get("top_kernels", [])[:3]))
            if s.get("best_gemm_layout"):
                out.append(f"  {key} GEMMs alone, best layout {s['best_gemm_layout']}: "
                           f"{f(s.get('gemm_only_fraction_of_gemm4096') and 100 * s['gemm_only_fraction_of_gemm4096'], '.0f')}"
                           f"% of the dense GEMM; floor {f((s.get('floor') or {}).get('floor_ms'), '.3f')} ms")
            if s.get("check"):
                out.append(f"  {key} check: {s['check'].get('steps')} steps at lr {s['check'].get('lr')} (the largest "
                           f"of {[t['lr'] for t in s['check'].get('lr_trials', [])]} at which (a) is stable and moves)")
            for name, r in s.get("variants", {}).items():
                chk = "" if "update_rel_diff_vs_a" not in r else (
                    f", update vs a's {f(r['update_rel_diff_vs_a'], '.1e')} ({'ok' if r.get('check_ok') else 'NOT ok'}"
                    f"{'; ' + r['check_invalid'] if r.get('check_invalid') else ''})")
                out.append(f"  {key} {name:26s} {r['ms_per_step']:8.4f} ms/step {r['tflops_nominal']:6.2f} TFLOP/s "
                           f"= {f(r.get('fraction_of_gemm4096') and 100 * r['fraction_of_gemm4096'], '.0f')}% of GEMM, "
                           f"{f(r.get('speedup_vs_a'), '.2f')}x vs a, max rel diff vs a "
                           f"{f(r.get('max_param_rel_diff_vs_a'), '.1e')}{chk}")
        for key, s in w.get("shapes", {}).items():
            if s.get("k", 0) < 100000:
                continue
            ok = {n: r for n, r in s.get("variants", {}).items()  # the check where it ran (session 5 on)
                  if n == "a_kktlab" or (r["check_ok"] if "check_ok" in r else (r.get("max_param_rel_diff_vs_a") or 0) <= 1e-5)}
            full = {n: r for n, r in ok.items() if not n.startswith(("f_gram", "e_kktlab"))}  # all 4·B·d·k FLOP
            for label, group in (("any variant", ok), ("same FLOP as kktlab's step", full)):
                if not group:
                    continue
                name, r = max(group.items(), key=lambda kv: kv[1].get("fraction_of_gemm4096") or 0)
                fr = r.get("fraction_of_gemm4096") or 0
                out.append(f"  {key} target >= 50% of the measured GEMM ({label}): {'MET' if fr >= 0.5 else 'NOT met'}"
                           f" by {name}: {100 * fr:.0f}% nominal"
                           + (f", {100 * r['actual_fraction_of_gemm4096']:.0f}% counting the GEMM FLOP it does"
                              if r.get("actual_fraction_of_gemm4096") is not None else ""))
    c = load(folder, "cold_compile_*.json")
    if c:
        runs = c.get("runs", {})
        out.append("cold compile (E=1024, n,d,k=50,50,100, fresh process each): " + "; ".join(
            f"{n}: first call {f(r.get('t_first_call_s'), '.1f')} s (process {f(r.get('process_wall_s'), '.1f')} s, "
            f"cache {r.get('cache_bytes_after', 0) / 2**20:.1f} MiB)" for n, r in runs.items())
            + (f"; skipped {c['skipped']}" if c.get("skipped") else ""))
    g = load(folder, "paper_grid_timing_*.json")
    if g:
        e2 = (g.get("paper002_fig1") or {}).get("extrapolation") or {}
        e4 = (g.get("paper004_f1") or {}).get("extrapolation") or {}
        out.append(f"paper 002 Fig. 1(a) full grid, one GPU: {f(e2.get('total_s') and e2['total_s'] / 3600, '.2f')} h "
                   f"(training {f(e2.get('train_s') and e2['train_s'] / 60, '.1f')} min at T = "
                   f"{e2.get('T_iterations_assumed')}, analysis {f(e2.get('analysis_s') and e2['analysis_s'] / 60, '.1f')}"
                   f" min), {e2.get('cells')} cells, {f(e2.get('cells_per_s'), '.3g')} cells/s; T measured at "
                   f"alpha 0.5, d 100: {e2.get('T_measured_alpha0.5_d100')}; bundles timed "
                   f"{len((g.get('paper002_fig1') or {}).get('train_bundles', []))}")
        out.append(f"paper 004 F004-1 full grid, one GPU: {f(e4.get('total_s') and e4['total_s'] / 60, '.1f')} min "
                   f"(train {f(e4.get('train_s'), '.0f')} s [{e4.get('train_source')}], attack "
                   f"{f(e4.get('attack_s'), '.0f')} s in {e4.get('attack_bundles')} bundles, constructions "
                   f"{f(e4.get('constructions_s'), '.0f')} s), {e4.get('cells')} cells")
        if g.get("errors"):
            out.append(f"paper grid errors: {g['errors']}")
    ch = load(folder, "chain_summary.json")
    if ch:
        for g, r in (ch.get("stages") or {}).items():
            out.append(f"chain {g} ({r.get('experiment')}): {r.get('done')}/{r.get('cells')} done, failed "
                       f"{r.get('failed')}, bundle compute {f(r.get('bundle_compute_s'), '.1f')} s, "
                       f"{f(r.get('cells_per_compute_s'))} cells/s, finish span {f(r.get('finish_span_s'), '.1f')} s")
        nets = ((ch.get("finding") or {}).get("nets") or {}).get("rows") or []
        if nets:
            out.append("chain nets eps_rel: " + ", ".join(f"seed {r.get('seed')}: {f(r.get('eps_rel'))}" for r in nets))
        out += [f"chain {line}" for line in ch.get("headline") or []]
    print("\n".join(out) if out else "(no JSON found)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
