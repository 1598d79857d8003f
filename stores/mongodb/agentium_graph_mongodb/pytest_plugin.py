"""Pytest fixtures that give every test a MongoDB database of its own.

Use them from a ``conftest.py`` (the hook must be importable there too)::

    from agentium_graph_mongodb.pytest_plugin import (  # noqa: F401
        mongodb_database, mongodb_server, mongodb_uri, pytest_report_header)

* ``mongodb_server`` (session): the server :func:`~agentium_graph_mongodb.testing.choose_server`
  picks, started once per session (shared by every conftest that imports the fixture) and
  stopped at the end.
* ``mongodb_uri``: its URI. ``mongodb_database``: a fresh database name, dropped after the test.
* ``pytest_report_header`` prints the choice once.

When no server can be found or started, the tests that need one are skipped with the
reason, except under ``CI=true``, where they fail: CI must never pass by skipping them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from agentium_graph_mongodb.testing import (
    MongoServer,
    ServerChoice,
    ServerStartError,
    choose_server,
    in_ci,
    start_server,
)

_CHOICE = pytest.StashKey[ServerChoice]()
_HEADER_SHOWN = pytest.StashKey[bool]()
_SERVER = pytest.StashKey[MongoServer]()


def _choice(config: pytest.Config) -> ServerChoice:
    if _CHOICE not in config.stash:
        config.stash[_CHOICE] = choose_server()
    return config.stash[_CHOICE]


def pytest_report_header(config: pytest.Config) -> list[str]:
    if config.stash.get(_HEADER_SHOWN, False):
        return []  # several conftest files may import this hook: say it once
    config.stash[_HEADER_SHOWN] = True
    choice = _choice(config)
    if choice.kind == "none":
        what = "FAIL (CI=true)" if in_ci() else "skip"
        return [f"mongodb test server: none; MongoDB tests will {what}: {choice.detail}"]
    return [f"mongodb test server: {choice.kind}: {choice.detail}"]


def _unavailable(reason: str) -> None:
    message = f"no MongoDB test server: {reason}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing server is a failure, never a skip)",
                    pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def mongodb_server(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoServer]:
    config = request.config
    shared = config.stash.get(_SERVER, None)
    if shared is not None:  # started by this fixture in another conftest's scope
        yield shared
        return
    choice = _choice(config)
    if choice.kind == "none":
        _unavailable(choice.detail)
    try:
        server = start_server(choice, tmp_path_factory.mktemp("mongodb"))
    except ServerStartError as exc:
        _unavailable(str(exc))
        raise  # unreachable: _unavailable always raises
    config.stash[_SERVER] = server
    try:
        yield server
    finally:
        del config.stash[_SERVER]
        server.stop()


@pytest.fixture
def mongodb_uri(mongodb_server: MongoServer) -> str:
    return mongodb_server.uri


@pytest.fixture
def mongodb_database(mongodb_server: MongoServer) -> Iterator[str]:
    name = f"agt_{uuid.uuid4().hex[:20]}"
    try:
        yield name
    finally:
        mongodb_server.drop_database(name)


__all__ = ["mongodb_database", "mongodb_server", "mongodb_uri", "pytest_report_header"]
