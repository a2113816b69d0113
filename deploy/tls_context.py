"""One TLS context per CA file for Prefect's API clients in a process, instead of one per client.

Why: Prefect 3.9 builds a fresh ``ssl.create_default_context(cafile=certifi.where())`` in every
``PrefectClient`` / ``SyncPrefectClient.__init__`` (prefect/client/orchestration/__init__.py), even
for an ``http://`` API where no TLS is spoken, and its engine makes fresh clients all along a run:
every task run on a Dask worker makes its own. Loading the CA bundle costs ~16 ms of CPU each time
(measured here); on a worker it was a quarter of the Prefect set-up of every bundle (py-spy of a
26-bundle chain run).

What: :func:`install` makes that module's ``create_default_context`` return one context per
(``cafile``) argument set, made on first use. An ``ssl.SSLContext`` is meant to be shared by
connections; every client of the process gets the same verification settings as before (the CA
file Prefect names, or ``PREFECT_API_TLS_INSECURE_SKIP_VERIFY``'s unverified context, which Prefect
sets up the same way each time). A CA file edited while the process runs is read again only by a
new process. Installed with deploy/api_retry.py (the Dask workers' preload, served flow runs) and
by ``kktlab run``. Drop this module when Prefect reuses its clients' TLS context.
"""

from __future__ import annotations

import functools
import ssl
import types


def install() -> bool:
    """Share the TLS contexts of Prefect's API clients in this process; idempotent. False where
    Prefect's client module no longer builds its contexts this way (nothing done)."""
    from prefect.client import orchestration

    here = getattr(orchestration, "ssl", None)
    if getattr(here, "_kktlab_shared", False):
        return True
    if here is not ssl:
        return False
    made = functools.lru_cache(maxsize=8)(lambda cafile=None: ssl.create_default_context(cafile=cafile))
    shim = types.SimpleNamespace(**{k: getattr(ssl, k) for k in dir(ssl) if not k.startswith("__")})
    shim.create_default_context = lambda purpose=ssl.Purpose.SERVER_AUTH, *, cafile=None, capath=None, cadata=None: (
        made(cafile) if purpose == ssl.Purpose.SERVER_AUTH and capath is None and cadata is None
        else ssl.create_default_context(purpose, cafile=cafile, capath=capath, cadata=cadata))
    shim._kktlab_shared = True
    orchestration.ssl = shim
    return True
