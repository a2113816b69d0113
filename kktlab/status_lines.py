"""Lines that ``kktlab run`` and ``kktlab status`` print about a group's cells."""

from __future__ import annotations


def left_out(store: str, group: str, experiment: str) -> str:
    """'8 diverged, 1 max_iters': done cells left out by their status (storage.query.left_out_by_status),
    named by the experiment's declared status labels; '' when none."""
    from flows import experiments
    from storage.query import left_out_by_status

    counts = left_out_by_status(store, group)
    if not counts:
        return ""
    var = experiments.get(experiment).variables.get("status") if experiment in experiments.names() else None
    names = dict(var.labels) if var is not None else {}
    return ", ".join(f"{n} {names.get(v, f'status {v}')}" for v, n in sorted(counts.items()))
