"""Is anything there? Quick probes of a Prefect API and a Dask scheduler before a sweep makes its
store, so a dead or mistyped address is one line in seconds, not a traceback after retries."""

from __future__ import annotations

import os
import pathlib
import socket
import urllib.error
import urllib.parse
import urllib.request

from core.errors import UserError

TIMEOUT_S = 3.0


def api_url() -> str | None:
    """The Prefect API every kktlab command uses: ``$PREFECT_API_URL``, else the URL set in the
    active Prefect profile (``prefect config set PREFECT_API_URL=...``, as the server's banner says),
    read the way the Prefect CLI reads it; None when neither is set (an embedded server is used).
    A URL found in the profile is exported, so Dask workers started later see it too."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    url = profile_api_url()
    if url:
        os.environ["PREFECT_API_URL"] = str(url)
        return str(url)
    return None


def profile_api_url() -> str | None:
    """PREFECT_API_URL of the active Prefect profile, as the Prefect CLI finds it: the profiles file
    ``$PREFECT_PROFILES_PATH`` (default ``$PREFECT_HOME/profiles.toml``, ``~/.prefect``), the
    profile ``$PREFECT_PROFILE`` or the file's ``active`` one. Read as plain TOML: building
    Prefect's settings object before ``kktlab run`` starts its embedded server would bind its log
    shipping to no server (a 70 s hang at exit, measured)."""
    import tomllib

    home = pathlib.Path(os.environ.get("PREFECT_HOME") or pathlib.Path.home() / ".prefect").expanduser()
    path = pathlib.Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or data.get("active")
    url = data.get("profiles", {}).get(active or "", {}).get("PREFECT_API_URL")
    return str(url) if url else None


def check_prefect_api(url: str, timeout: float = TIMEOUT_S) -> None:
    """``url`` (``$PREFECT_API_URL``) answers ``GET /health`` within ``timeout`` seconds."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"PREFECT_API_URL {url!r} is not an http(s) URL (e.g. http://127.0.0.1:4200/api)")
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as resp:
            if resp.status == 200:
                return
            reason = f"it answered {resp.status} to /health"
    except urllib.error.HTTPError as err:
        raise UserError(f"PREFECT_API_URL {url}: it answered {err.code} to /health; a Prefect API URL ends in "
                        "/api (e.g. http://127.0.0.1:4200/api)") from None
    except (urllib.error.URLError, OSError) as err:
        cause = getattr(err, "reason", err)
        reason = f"nothing answers there ({getattr(cause, 'strerror', None) or cause})"
    raise UserError(f"PREFECT_API_URL {url}: {reason}; start the server (make server) or unset "
                    "PREFECT_API_URL to use an embedded one")


def check_scheduler(address: str, timeout: float = TIMEOUT_S) -> None:
    """A Dask scheduler at ``protocol://host:port`` accepts a TCP connection within ``timeout`` s
    (``ucx://`` is not probed). The address itself was checked by ``flows.config``."""
    parts = urllib.parse.urlsplit(address)
    if parts.scheme == "ucx" or parts.hostname is None or parts.port is None:
        return
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout):
            return
    except OSError as err:
        reason = err.strerror or type(err).__name__
        if isinstance(err, socket.timeout):
            reason = f"no answer within {timeout:g} s"
    raise UserError(f"config field 'runner.address' (--dask-address): no Dask scheduler at {address} ({reason}); "
                    "start one (make dask-scheduler) or use runner.cluster 'local'")
