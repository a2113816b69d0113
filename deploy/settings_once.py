"""Prefect's settings serialized once per settings context in a process, instead of once per task run.

Why: prefect-dask sends each task run the flow's context (``prefect.context.serialize_context``),
and that serializes the whole Prefect settings model every time: a pydantic ``model_dump`` of some
300 fields, secrets rendered, paths turned into strings: 24 ms of CPU per bundle submitted on a quiet
machine here, 45 ms in a chain run under load (py-spy: a tenth of the flow process's time in
``kktlab run`` of a 18-bundle chain; the same share of the test processes' time in ``make test``).

What: :func:`install` makes ``SettingsContext.serialize`` remember its result per context object
(and ``include_secrets``) and hand out deep copies (0.2 ms). A settings context does not change
once made: Prefect makes a new one for new settings (``temporary_settings``, a profile), and that
one is serialized afresh. Installed by ``kktlab run`` (flows/sweep.py :func:`run`), the process
that submits. Drop this module when Prefect serializes a context's settings once.
"""

from __future__ import annotations

import copy


def install() -> bool:
    """Serialize each Prefect settings context once in this process; idempotent. False where
    Prefect's ``SettingsContext`` no longer has its ``serialize`` (nothing done)."""
    from prefect.context import SettingsContext

    serialize = SettingsContext.__dict__.get("serialize")
    if getattr(serialize, "_kktlab_once", False):
        return True
    if serialize is None:
        return False
    made: dict[tuple[int, bool], tuple[SettingsContext, dict]] = {}

    def once(self, include_secrets: bool = True) -> dict:
        key = (id(self), bool(include_secrets))
        held = made.get(key)
        if held is None or held[0] is not self:  # the context is kept with its result: its id is not reused
            held = made[key] = (self, serialize(self, include_secrets=include_secrets))
        return copy.deepcopy(held[1])

    once._kktlab_once = True
    once.__doc__, once.__wrapped__ = serialize.__doc__, serialize
    SettingsContext.serialize = once
    return True
