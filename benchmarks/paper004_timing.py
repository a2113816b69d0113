"""Paper 004 F004-1 (configs/paper-004-f1.yaml) parts of benchmarks/paper_grid_timing.py (issue 46):
its training bundle, the KKT reconstruction attack at two step counts, the F004-3 constructions,
and their extrapolation to the full grid. A mixin of paper_grid_timing.Timing (self.a, self.dev,
self.c004 and self.payload are Timing's).
"""

from __future__ import annotations

from benchmarks.bundle_timing import nets_from, run_timed, slope, untrained_nets
from flows.experiments import get as get_exp


class Paper004Timing:
    # ------------------------------------------------------------------------------- paper 004
    def small4(self, c: dict) -> dict:
        if self.a.small:
            c = dict(c)
            for key, val in (("d", 24), ("m", 16), ("width", 30), ("n_candidates", 8)):
                if key in c:
                    c[key] = min(c[key], val)
        return c

    def p004_train(self):
        cells = [self.small4(c) for c in self.c004.stages[0].cells()]
        exp = get_exp("train")
        res, info, marks = run_timed(lambda: exp.run_bundle(cells, self.a.device), self.a.f1_train_deadline_s, self.dev)
        sec, last = slope(marks)
        row = {**info, "E": len(cells), "steps_reached": last, "s_per_step": sec, "max_iters": cells[0]["max_iters"],
               "log_points": cells[0]["log_points"]}
        if res is not None:
            row["iters"] = [int(r["iters"]) for r in res]
            row["status"] = [int(r["status"]) for r in res]
            row["log10_loss"] = [float(r["log10_loss"]) for r in res]
            self.f1_nets = nets_from(res, cells)
        self.payload["paper004_f1"]["train"] = row
        print(f"  004 F004-1 train: {info['wall_s']:.1f} s, steps {last:.0f}, iters {row.get('iters', 'not finished')}",
              flush=True)

    def f1_inputs(self):
        if getattr(self, "f1_nets", None) is None:
            self.f1_nets = untrained_nets([self.small4(c) for c in self.c004.stages[0].cells()])
            self.payload["paper004_f1"]["attack_nets"] = "untrained (the attack's cost does not depend on training)"
        return self.f1_nets

    def p004_attack(self):
        nets = self.f1_inputs()
        exp = get_exp("reconstruct")
        own = [self.small4(c) for c in self.c004.stages[1].cells()]  # 35: one bundle reads one net
        up = self.c004.stages[0].cells()[0]
        rows = []
        for S in (self.a.attack_steps1, self.a.attack_steps2):
            cells = [exp.with_inherited(dict(c, steps=S), up) for c in own]
            inputs = nets.select([0] * len(cells))
            _, info, _ = run_timed(lambda: exp.run_bundle(cells, self.a.device, inputs=inputs),
                                   self.a.attack_deadline_s, self.dev)
            rows.append({"steps": S, "rows": len(cells), **info})
            print(f"  004 attack bundle ({len(cells)} rows x {cells[0]['n_candidates']} candidates), {S} steps: "
                  f"{info['wall_s']:.2f} s", flush=True)
            if info["aborted_at_deadline"]:
                break
        P = self.payload["paper004_f1"]
        P["attack_runs"] = rows
        if len(rows) == 2 and not any(r["aborted_at_deadline"] for r in rows):
            per = (rows[1]["wall_s"] - rows[0]["wall_s"]) / (rows[1]["steps"] - rows[0]["steps"])
            if per <= 0:  # the fixed part varied more than the steps cost: bound by the longer run
                per, P["attack_note"] = rows[1]["wall_s"] / rows[1]["steps"], "per step bounded by wall/steps of the longer run"
            P["attack_s_per_step"] = per
            P["attack_fixed_s"] = max(rows[0]["wall_s"] - rows[0]["steps"] * per, 0.0)

    def p004_constructions(self):
        nets = self.f1_inputs()
        exp = get_exp("kkt_constructions")
        own = self.c004.stages[2].cells()[0]
        cells = [exp.with_inherited(dict(own), c) for c in self.c004.stages[0].cells()]
        _, info, _ = run_timed(lambda: exp.run_bundle(cells, self.a.device, inputs=nets.select(list(range(len(cells))))),
                               self.a.constructions_deadline_s, self.dev)
        self.payload["paper004_f1"]["constructions"] = {"cells": len(cells), **info}
        print(f"  004 constructions ({len(cells)} nets): {info['wall_s']:.1f} s", flush=True)

    def p004_extrapolate(self):
        P = self.payload["paper004_f1"]
        st = P.get("structure", {}).get("stages", {})
        steps_full = self.c004.stages[1].cells()[0]["steps"]
        ex = {"attack_steps_full": steps_full}
        tr = P.get("train", {})
        if tr.get("iters") is not None:
            ex["train_s"] = tr["wall_s"]
            ex["train_source"] = "measured: the real bundle ran to its end"
        elif tr.get("s_per_step"):
            ex["train_s_lower_bound"] = tr["wall_s"]
            ex["train_s_per_1000_steps"] = 1000 * tr["s_per_step"]
            ex["train_s_at_max_iters"] = tr["wall_s"] + (tr["max_iters"] - tr["steps_reached"]) * tr["s_per_step"]
            ex["train_s"] = ex["train_s_at_max_iters"]
            ex["train_source"] = "not finished within its deadline: bounded by max_iters (500,000 steps)"
        nb = st.get("attack", {}).get("bundles", 2)
        if P.get("attack_s_per_step") is not None:
            ex["attack_bundle_s"] = P["attack_fixed_s"] + steps_full * P["attack_s_per_step"]
            ex["attack_bundles"] = nb
            ex["attack_s"] = nb * ex["attack_bundle_s"]
        c = P.get("constructions")
        if c:  # every net of the stage in the one timed call
            ex["constructions_s"] = c.get("wall_s_extrapolated_from_progress") if c["aborted_at_deadline"] else c["wall_s"]
        parts = [ex.get(k) for k in ("train_s", "attack_s", "constructions_s")]
        if all(p is not None for p in parts):
            ex["total_s"] = sum(parts)
            ex["total_h"] = ex["total_s"] / 3600
            cells = P.get("structure", {}).get("cells") or 74
            ex["cells"], ex["cells_per_s"] = cells, cells / ex["total_s"]
            print(f"paper 004 F004-1 full grid on this GPU: ~{ex['total_s'] / 60:.1f} min (train "
                  f"{ex['train_s'] / 60:.1f}, attack {ex['attack_s'] / 60:.1f}, constructions "
                  f"{ex['constructions_s'] / 60:.2f} min), {cells} cells", flush=True)
        P["extrapolation"] = ex
