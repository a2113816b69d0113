"""Prefect's settings serialized once per settings context in the process that submits task runs,
and validated once per serialized settings in the Dask worker that runs them, instead of once per
task run on both sides.

Why: prefect-dask sends each task run the flow's context (``prefect.context.serialize_context``),
and that serializes the whole Prefect settings model every time: a pydantic ``model_dump`` of some
300 fields, secrets rendered, paths turned into strings: 24 ms of CPU per bundle submitted on a quiet
machine here, 45 ms in a chain run under load (py-spy: a tenth of the flow process's time in
``kktlab run`` of a 18-bundle chain; the same share of the test processes' time in ``make test``).

What: :func:`install` makes ``SettingsContext.serialize`` remember its result per context object
(and ``include_secrets``) and hand out deep copies (0.2 ms). A settings context does not change
once made: Prefect makes a new one for new settings (``temporary_settings``, a profile), and that
one is serialized afresh. Installed by ``kktlab run`` (flows/sweep.py :func:`run`), the process
that submits.

On the worker, each task run rebuilds a ``SettingsContext`` from that dict
(``prefect.context.hydrated_context``): pydantic-settings validates the 300 fields and reads its
sources again, 52 ms of CPU per bundle (measured here; 8 % of a worker's time in ``make test``,
py-spy). :func:`install_hydration` makes a ``SettingsContext`` built from a serialized dict reuse the
profile and settings models validated from an equal dict before (0.1 ms): the context itself is new
each time, as Prefect enters and leaves it. Installed by the workers' preload (deploy/api_retry.py).
Drop both when Prefect does this itself.
"""

from __future__ import annotations

import copy
import json

KEPT = 16  # settings remembered per process (a run has one; a served worker or the test suite sees a few)


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
            if len(made) >= KEPT:
                made.clear()
            held = made[key] = (self, serialize(self, include_secrets=include_secrets))
        return copy.deepcopy(held[1])

    once._kktlab_once = True
    once.__doc__, once.__wrapped__ = serialize.__doc__, serialize
    SettingsContext.serialize = once
    return True


def install_hydration() -> bool:
    """Validate each serialized Prefect settings once in this process (a Dask worker); idempotent.
    False where ``SettingsContext`` no longer takes ``profile`` and ``settings`` (nothing done)."""
    from prefect.context import SettingsContext

    if getattr(SettingsContext.__dict__.get("__init__"), "_kktlab_once", False):
        return True
    if set(SettingsContext.model_fields) != {"profile", "settings"}:
        return False
    init = SettingsContext.__init__
    made: dict[str, tuple] = {}

    def once(self, **data) -> None:
        if not all(isinstance(data.get(k), dict) for k in ("profile", "settings")) or len(data) != 2:
            return init(self, **data)  # models, or more than a serialized context: as Prefect builds it
        key = json.dumps(data, sort_keys=True, default=repr)
        if key in made:
            return init(self, **dict(zip(("profile", "settings"), made[key])))  # validated models pass as they are
        init(self, **data)
        if len(made) >= KEPT:
            made.clear()
        made[key] = (self.profile, self.settings)

    once._kktlab_once = True
    once.__wrapped__ = init
    SettingsContext.__init__ = once
    return True
