"""Store URIs whose SQLite path cannot be looked at: typed errors, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentium_graph._store_uri import open_store_uri, parse_store_uri
from agentium_graph.errors import ConfigurationError, StoreError


def test_a_home_directory_of_an_unknown_user_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="'~no-such-user-zz': no such user's home"):
        parse_store_uri("sqlite:///~no-such-user-zz/tasks.db")
    assert parse_store_uri("sqlite:///~/tasks.db").path == Path.home() / "tasks.db"


def test_a_path_this_user_may_not_look_at_is_a_store_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root may look everywhere, so the denial (a directory without search permission on
    # the way) is simulated where the URI's file is first looked at.
    def denied(self: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_file", denied)
    with pytest.raises(StoreError, match="Permission denied; check the path and the "
                                         "permissions"):
        open_store_uri(f"sqlite:///{tmp_path}/secret/t.db", must_exist=True)


def test_secret_uri_options_are_masked_in_messages_and_reprs() -> None:
    # (review 53) Only user:password@ was masked: an option such as
    # tlsCertificateKeyFilePassword was shown in errors, the CLI's paging hint and repr().
    from agentium_graph._store_uri import parse_store_uri, redact

    uri = ("mongodb://user:s3cr3t@db.example:27017/db?tls=true"
           "&tlsCertificateKeyFilePassword=KEYPW99&authMechanismProperties=AWS_SESSION_TOKEN:t")
    shown = redact(uri)
    assert "s3cr3t" not in shown and "KEYPW99" not in shown and "AWS_SESSION" not in shown
    assert "tls=true" in shown and "tlsCertificateKeyFilePassword=***" in shown
    assert "KEYPW99" not in repr(parse_store_uri(uri)) and "s3cr3t" not in repr(
        parse_store_uri(uri))
    assert redact("sqlite:///runs/a?b@c:d.db") == "sqlite:///runs/a?b@c:d.db"
