"""Issue 43: ``kktlab submit`` against a server that answers 503 (SQLite's "database is locked" under
load) or not at all: the run's creation is tried again with one idempotency key (a run the server made
is never queued twice), the user sees one line per retry, and after the last one line naming the
server and the answer, no traceback. The Prefect call is the fault-injection point: the first tries
raise what Prefect's client raises for such an answer."""

from __future__ import annotations

import httpx
import pytest

from core.errors import UserError
from kktlab import served


def _answer(code: int) -> httpx.HTTPStatusError:
    req = httpx.Request("POST", "http://127.0.0.1:1/api/deployments/x/create_flow_run")
    return httpx.HTTPStatusError(f"{code}", request=req, response=httpx.Response(code, request=req))


class NotFound(Exception):
    pass


@pytest.fixture
def no_sleep(monkeypatch):
    waits = []
    monkeypatch.setattr(served.time, "sleep", waits.append)
    return waits


def test_503_twice_then_the_run_with_one_idempotency_key(no_sleep, capsys):
    keys = []

    def create(key):
        keys.append(key)
        if len(keys) <= 2:
            raise _answer(503) if len(keys) == 1 else httpx.ConnectError("refused")
        return "run"

    assert served._create_run(create, "kktlab/nonrobust", "http://127.0.0.1:1/api", NotFound) == "run"
    assert len(keys) == 3 and len(set(keys)) == 1 and keys[0].startswith("kktlab-submit-")
    assert no_sleep == list(served.BACKOFF_S[:2])
    err = capsys.readouterr().err.splitlines()
    assert err == ["kktlab: the Prefect server answered 503; trying again in 1 s",
                   "kktlab: the Prefect server did not answer (ConnectError); trying again in 2 s"]


def test_a_server_that_keeps_answering_503_ends_in_one_line(no_sleep):
    def create(key):
        raise _answer(503)

    with pytest.raises(UserError) as err:
        served._create_run(create, "kktlab/nonrobust", "http://127.0.0.1:1/api", NotFound)
    msg = str(err.value)
    assert "\n" not in msg and "answered 503 6 times" in msg and "http://127.0.0.1:1/api" in msg
    assert len(no_sleep) == len(served.BACKOFF_S)


def test_a_client_error_is_not_retried_and_a_missing_deployment_is_one_line(no_sleep):
    def bad(key):
        raise _answer(422)

    with pytest.raises(httpx.HTTPStatusError):
        served._create_run(bad, "kktlab/x", "http://127.0.0.1:1/api", NotFound)

    def missing(key):
        raise NotFound()

    with pytest.raises(UserError, match="no deployment 'kktlab/x' on http://127.0.0.1:1/api: run 'make deploy' first"):
        served._create_run(missing, "kktlab/x", "http://127.0.0.1:1/api", NotFound)
    assert no_sleep == []
