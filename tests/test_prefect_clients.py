"""Prefect API clients as kktlab's processes make them (deploy/tls_context.py, flows/run_ui.py): every
client of a process shares one TLS context per CA file (Prefect built one per client, ~16 ms of CPU
each, on every task run of a Dask worker), with the verification Prefect sets up; a progress update
is made without retries, the settings copy made once; the settings are serialized once per context
(deploy/settings_once.py)."""

from __future__ import annotations

import ssl

import pytest


@pytest.fixture
def api_url(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # never contacted: clients are only made


def test_clients_share_one_verified_tls_context(api_url):
    import certifi
    from prefect.client.orchestration import get_client

    from deploy import tls_context

    assert tls_context.install() and tls_context.install()  # idempotent
    contexts = [get_client(sync_client=True)._client._transport._pool._ssl_context for _ in range(3)]
    contexts += [get_client()._client._transport._pool._ssl_context]
    assert all(c is contexts[0] for c in contexts)
    ctx = contexts[0]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname  # Prefect's verified context
    from prefect.settings import PREFECT_API_SSL_CERT_FILE

    prefects = ssl.create_default_context(cafile=PREFECT_API_SSL_CERT_FILE.value() or certifi.where())
    assert ctx.get_ca_certs() and ctx.get_ca_certs() == prefects.get_ca_certs()  # the CA file Prefect names
    from prefect.client import orchestration

    other = orchestration.ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # any other use: made as before
    assert other is not ctx and orchestration.ssl.create_default_context(ssl.Purpose.CLIENT_AUTH) is not other


def test_a_progress_update_is_made_without_retries_from_one_settings_copy(api_url):
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

    from flows import run_ui

    default = PREFECT_CLIENT_MAX_RETRIES.value()
    assert default > 0
    with run_ui._at_once():
        assert PREFECT_CLIENT_MAX_RETRIES.value() == 0
        first = run_ui._AT_ONCE[1]
    assert PREFECT_CLIENT_MAX_RETRIES.value() == default
    with run_ui._at_once():
        assert PREFECT_CLIENT_MAX_RETRIES.value() == 0 and run_ui._AT_ONCE[1] is first


def test_settings_are_serialized_once_per_context_and_as_prefect_serializes_them(api_url):
    """deploy/settings_once.py: the same dict as Prefect's own serialization, a copy each time (a caller
    may change it), and new settings (a new context) serialized afresh."""
    from prefect.context import SettingsContext
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from deploy import settings_once

    installed = SettingsContext.serialize
    original = getattr(installed, "__wrapped__", installed)  # Prefect's own (a run in this process installs it)
    assert settings_once.install() and settings_once.install()  # idempotent
    try:
        ctx = SettingsContext.get()
        first = ctx.serialize()
        assert first == original(ctx) and ctx.serialize(include_secrets=False) == original(ctx, include_secrets=False)
        first["settings"]["changed"] = first["profile"] = None
        assert ctx.serialize() == original(ctx)  # a copy: what a caller did to the last one is not handed out
        with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 3}):
            assert SettingsContext.get().serialize()["settings"]["client"]["max_retries"] == 3
        assert ctx.serialize() == original(ctx)
    finally:
        SettingsContext.serialize = installed


def test_a_worker_validates_each_serialized_settings_once_and_builds_what_prefect_builds(api_url):
    """deploy/settings_once.py on a worker: a SettingsContext hydrated from a serialized dict equals
    Prefect's own, a new context each time sharing the models validated from an equal dict; other
    settings are validated afresh, and contexts built from models are built as Prefect builds them."""
    from prefect.context import SettingsContext
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from deploy import settings_once

    installed = SettingsContext.__dict__.get("__init__")
    ser = SettingsContext.get().serialize()
    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 3}):
        other = SettingsContext.get().serialize()
    own = SettingsContext(**ser)
    assert settings_once.install_hydration() and settings_once.install_hydration()  # idempotent
    try:
        a, b, c = SettingsContext(**ser), SettingsContext(**ser), SettingsContext(**other)
        assert a is not b and a.settings is b.settings and a.profile is b.profile  # validated once
        assert a.settings == own.settings and a.profile == own.profile and a.serialize() == own.serialize()
        assert c.settings is not a.settings and c.settings.client.max_retries == 3
        d = SettingsContext(profile=own.profile, settings=own.settings)
        assert d.settings is own.settings
    finally:
        if installed is None:
            del SettingsContext.__init__
        else:
            SettingsContext.__init__ = installed
