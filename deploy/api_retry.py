"""Prefect API clients made while the Prefect server restarts wait for it instead of failing the run
(issue 30: a served run rides out a restart of ``prefect server start``).

Why: Prefect 3.9 retries ``httpx.ConnectError`` only on a client instance that has already had a
response from the server (``prefect/client/base.py``, ``PrefectHttpxAsyncClient.send`` and
``PrefectHttpxSyncClient.send``: "Only retry ConnectError after we've successfully connected once",
the ``_has_connected`` flag of PrefectHQ/prefect#20276), so that a wrong URL fails at once. But
Prefect's engine makes fresh clients all along a run: the task run that tracks a subflow
(``Task.create_run`` -> ``get_client()`` on its own event loop, flow_engine.py ``create_flow_run``),
every task run on a Dask worker, ``prefect.runtime``'s look-ups. One of them made while the server
was down raised ``ConnectError: All connection attempts failed`` on its first request and the run
ended Failed, whatever ``PREFECT_CLIENT_MAX_RETRIES`` said. Prefect has no setting for it (a
``PREFECT_CLIENT_CONNECTION_ATTEMPTS`` is proposed in PrefectHQ/prefect#20462, not in 3.9).

What: :func:`install` makes each Prefect HTTP client made afterwards in this process *for the API
this process is known to have reached* start as one that has connected; a ``ConnectError`` then
gets Prefect's own retries, the same as a client that had connected: ``PREFECT_CLIENT_MAX_RETRIES``
(default 5) with exponential backoff (2, 4, 8, 16, 32 s, +-20% jitter: about a minute), after which
it raises as before. Clients for any other URL keep Prefect's fail-fast behaviour. Installed only
where the URL is known good: in a served flow run (``flows/served.py``: the worker fetched the run
from that server and the engine has started it) and on the Dask workers a flow starts or kktlab
launches (``dask_setup``, a ``--preload``: deploy/dask.py, deploy/launch.py). Drop this module
when Prefect can retry a fresh client's ConnectError by a setting.
"""

from __future__ import annotations

import functools

_APIS: set[str] = set()  # API URLs (no trailing slash) whose fresh clients retry ConnectError


def _norm(url) -> str:
    return str(url).rstrip("/")


def install(api_url: str | None = None) -> bool:
    """Let fresh Prefect clients of ``api_url`` (default: ``PREFECT_API_URL``) retry ConnectError;
    idempotent. False (nothing done) without an HTTP API URL (an in-process ephemeral API)."""
    if api_url is None:
        from prefect.settings import PREFECT_API_URL

        api_url = PREFECT_API_URL.value()
    if not api_url or not str(api_url).startswith(("http://", "https://")):
        return False
    _APIS.add(_norm(api_url))
    from prefect.client import base

    for cls in (base.PrefectHttpxAsyncClient, base.PrefectHttpxSyncClient):
        if cls.__dict__.get("_kktlab_api_retry"):
            continue
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, __init=init, **kwargs):
            __init(self, *args, **kwargs)
            if _norm(self.base_url) in _APIS and hasattr(self, "_has_connected"):
                self._has_connected = True  # as after a first response: send() retries ConnectError

        cls.__init__ = __init__
        cls._kktlab_api_retry = True
    return True


def dask_setup(worker) -> None:
    """Dask worker preload (``--preload deploy.api_retry``): the worker's task runs ride out a restart
    of the server at ``PREFECT_API_URL`` (the one the flow that started the worker, or its
    environment, names), their Prefect clients share one TLS context (deploy/tls_context.py) and
    their settings are validated once (deploy/settings_once.py). Each step apart: one failing leaves
    the others in place."""
    from deploy import settings_once, tls_context

    for step in (install, tls_context.install, settings_once.install_hydration):
        try:
            step()
        except Exception:  # noqa: BLE001 - never stop a worker from starting; Prefect's own behaviour then
            pass
