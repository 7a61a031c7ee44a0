"""Bad ``BATON_*`` settings are a coded VALIDATION_ERROR naming the variable, on every way a
client is built, and nothing is opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_baton import Baton, ValidationError


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BATON_API_TIMEOUT_SECONDS", "-1"),
        ("BATON_RECEIPT_RETENTION_SECONDS", "ten"),
        ("BATON_STATE_MAX_BYTES", "1"),
        ("BATON_STATE_MAX_BYTES", str(16 * 1024 * 1024 + 1)),
        ("BATON_KEY_CACHE_SECONDS", "9999"),
    ],
)
def test_bad_environment_setting_is_validation_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match=variable) as ei:
        Baton(org="o", principal="a")
    assert ei.value.code == "VALIDATION_ERROR"
    assert not (tmp_path / ".baton").exists()


def test_bad_override_in_from_settings_is_validation_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="BATON_STATE_MAX_BYTES"):
        Baton.from_settings(state_max_bytes=3, ledger_url=f"sqlite:///{tmp_path / 'l.db'}")
    assert not (tmp_path / "l.db").exists()


def test_the_prefect_plugins_settings_follow_every_change_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Prefect plugin reads ``BATON_*`` once per distinct value of the variables: a set,
    changed or removed variable is seen by the next call (``os.environ`` and ``putenv``
    alike, as ``monkeypatch.setenv`` does)."""
    from prefect_baton.prefect._context import _settings

    monkeypatch.setenv("BATON_ORG", "org-one")
    monkeypatch.setenv("BATON_PREFECT_PRINCIPAL", "p-one")
    first = _settings()
    assert (first.org, first.prefect_principal) == ("org-one", "p-one")
    assert _settings() is first
    monkeypatch.setenv("BATON_ORG", "org-two")
    assert _settings().org == "org-two"
    monkeypatch.delenv("BATON_PREFECT_PRINCIPAL")
    assert _settings().prefect_principal is None
    monkeypatch.setenv("BATON_PREFECT_PRINCIPAL", "p-one")
    monkeypatch.setenv("BATON_ORG", "org-one")
    assert _settings() is first
