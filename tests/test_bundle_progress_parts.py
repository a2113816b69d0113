"""A reading stage's bundle of nets of several shapes runs as one part per shape
(``flows.experiments.by_shape``, issue 29 item 2), each counting its kernel's steps from 0; the
bundle's progress (issue 30 item 3) must still count on, never back, to one total."""

from __future__ import annotations

from flows import bundle_progress as rep_mod
from flows import experiments
from test_bundle_progress_wiring import cells_of, installed, toy_nets


class Written(rep_mod.Reporter):
    """A real reporter that keeps each (steps, total) it would write (``every_s=0``)."""

    def __init__(self, store: str):
        self.seen: list[tuple] = []
        super().__init__(store, "g", "k", "test bundle", 2, every_s=0.0)

    def write(self) -> None:
        self.seen.append((self.record["steps"], self.record["total"]))
        super().write()


def test_part_maps_a_parts_steps_onto_the_bundles(tmp_path):
    rep = Written(str(tmp_path / "s.zarr"))
    with rep.part(2, 3, 5):
        rep(steps=0, total=30)
        rep(steps=30, total=30)
    assert rep.seen[-2:] == [(20, 50), (50, 50)]
    rep(steps=7, total=9)  # outside a part: as given
    assert rep.seen[-1] == (7, 9)


def test_a_bundle_of_two_shapes_counts_on_across_its_parts(tmp_path):
    nets = toy_nets(E=2, d=4)
    nets.X[1, :, 3] = 0  # net 1: true d = 3 (its padded feature zero), a shape of its own
    nets.W[1, :, 3] = 0
    nets.d[1] = 3
    cells = cells_of("pgd", points="train", budget="given", R=0.3, T2=6, restarts=2, chunk=4) * 2
    with installed(Written(str(tmp_path / "s.zarr"))) as rep:
        results = experiments.get("pgd").run_bundle(cells, "cpu", inputs=nets)
    assert len(results) == 2 and all("failed" not in r for r in results)
    steps = [s for s, _ in rep.seen if s is not None]
    totals = {t for _, t in rep.seen if t is not None}
    assert totals == {2 * 2 * 2 * 6}, rep.seen  # 2 nets × restarts × chunks × T2
    assert steps == sorted(steps) and steps[-1] == 2 * 2 * 2 * 6, rep.seen
