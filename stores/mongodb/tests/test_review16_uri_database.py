"""Sixteenth review: the store and the CLI agree on the database a MongoDB URI names.

``MongoDBDurableTaskStore("mongodb://h/orders")`` ignored ``/orders`` and used its default
database ``agentium``, while the CLI's ``--store mongodb://h/orders`` used ``orders``: a
worker and an operator given the same URI looked at different databases, and the operator
saw no tasks. Both now resolve the database with one function, the way pymongo reads a URI
(``client.get_default_database()``): an explicit ``database=`` (``--database``) wins, else
the URI's path, else ``agentium``. A path naming one of MongoDB's own databases
(``mongodb://user:pw@h/admin``, a common way to name the authentication database) is
refused with a message that says what the path means and to use ``?authSource=admin``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner
from mongodb_helpers import create_request
from pymongo import AsyncMongoClient

from agentium_graph._store_uri import open_store_uri, parse_store_uri
from agentium_graph.cli import EXIT_USAGE, cli
from agentium_graph.errors import ConfigurationError
from agentium_graph_mongodb import MongoDBDurableTaskStore

# (URI, the database pymongo's get_default_database() names, or None for "agentium")
NAMED = [
    ("mongodb://h/orders", "orders"),
    ("mongodb://h:27017/orders?w=majority", "orders"),
    ("mongodb://u:pw@h1,h2/orders?replicaSet=rs0&authSource=admin", "orders"),
    ("mongodb+srv://cluster.example.invalid/orders", "orders"),  # no DNS at construction
    ("mongodb://h/my%2Ddb", "my-db"),  # percent-decoded
    ("mongodb://h/orders.tasks", "orders"),  # pymongo: database.collection
    ("mongodb://h", None),
    ("mongodb://h/", None),
    ("mongodb://h/?directConnection=true", None),
]


@pytest.mark.parametrize(("uri", "named"), NAMED)
def test_a_store_uses_the_database_its_uri_names(uri: str, named: str | None) -> None:
    assert MongoDBDurableTaskStore(uri).database_name == (named or "agentium")


@pytest.mark.parametrize(("uri", "named"), NAMED)
def test_the_cli_resolves_the_same_database(uri: str, named: str | None) -> None:
    expected = named or "agentium"
    assert parse_store_uri(uri).database == expected
    for must_exist, read_only in ((False, False), (True, False), (True, True)):
        store = open_store_uri(uri, must_exist=must_exist, read_only=read_only)
        assert isinstance(store, MongoDBDurableTaskStore)
        assert store.database_name == expected


@pytest.mark.parametrize(("uri", "_named"), NAMED)
def test_an_explicit_database_wins(uri: str, _named: str | None) -> None:
    assert MongoDBDurableTaskStore(uri, database="other").database_name == "other"
    assert parse_store_uri(uri, database="other").database == "other"
    store = open_store_uri(uri, database="other", must_exist=True, read_only=True)
    assert isinstance(store, MongoDBDurableTaskStore) and store.database_name == "other"


@pytest.mark.parametrize("name", ["admin", "local", "config", "Admin"])
def test_a_uri_path_naming_mongodbs_own_database_is_explained(name: str) -> None:
    uri = f"mongodb://user:s3cret@h/{name}"
    for make in (lambda: MongoDBDurableTaskStore(uri), lambda: parse_store_uri(uri),
                 lambda: open_store_uri(uri, must_exist=True, read_only=True)):
        with pytest.raises(ConfigurationError) as info:
            make()
        message = str(info.value)
        assert "s3cret" not in message and "s3cret" not in str(info.value.details)
        assert "path of a MongoDB URI names the store's database" in message, message
        assert f"?authSource={name}" in message and "database=" in message, message
        assert info.value.details["database"] == name
    # With the store's database given, the path is only the authentication database.
    assert MongoDBDurableTaskStore(uri, database="agentium").database_name == "agentium"
    assert MongoDBDurableTaskStore(f"mongodb://user:s3cret@h/agentium?authSource={name}"
                                   ).database_name == "agentium"


def test_the_cli_reports_such_a_path_as_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["--store", "mongodb://user:s3cret@127.0.0.1:1/admin",
                                      "list"])
    assert result.exit_code == EXIT_USAGE, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "?authSource=admin" in lines[0] and "s3cret" not in lines[0]


@pytest.mark.parametrize("uri", ["mongodb://h/a*b", "mongodb://h/%5Cx", "mongodb://h/" + "d" * 64])
def test_an_invalid_database_in_the_path_is_refused_alike(uri: str) -> None:
    with pytest.raises(ConfigurationError) as store_error:
        MongoDBDurableTaskStore(uri)
    with pytest.raises(ConfigurationError) as cli_error:
        parse_store_uri(uri)
    assert "path" in str(store_error.value) and "path" in str(cli_error.value)


async def test_a_given_client_uses_its_uris_default_database() -> None:
    """pymongo exposes the database a client's URI names without I/O
    (``get_default_database``), so a client behaves as its URI would."""
    named: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient("mongodb://h/orders",
                                                               connect=False)
    plain: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient("mongodb://h", connect=False)
    system: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient("mongodb://u:p@h/admin",
                                                                connect=False)
    try:
        assert MongoDBDurableTaskStore(named).database_name == "orders"
        assert MongoDBDurableTaskStore(named, database="other").database_name == "other"
        assert MongoDBDurableTaskStore(plain).database_name == "agentium"
        with pytest.raises(ConfigurationError, match=r"\?authSource=admin"):
            MongoDBDurableTaskStore(system)
        assert MongoDBDurableTaskStore(system, database="x").database_name == "x"
    finally:
        for client in (named, plain, system):
            await client.close()


def _with_path(uri: str, database: str) -> str:
    return urlunsplit(urlsplit(uri)._replace(path=f"/{database}"))


def test_a_worker_and_the_cli_given_the_same_uri_see_the_same_tasks(
        mongodb_uri: str, mongodb_database: str) -> None:
    uri = _with_path(mongodb_uri, mongodb_database)

    async def create() -> None:
        async with MongoDBDurableTaskStore(uri, server_selection_timeout_s=10.0) as store:
            assert store.database_name == mongodb_database
            await store.create_task(create_request("order-42"))

    asyncio.run(create())
    result = CliRunner().invoke(cli, ["--store", uri, "list", "--json"])
    assert result.exit_code == 0, result.output
    assert [t["key"] for t in json.loads(result.stdout)["tasks"]] == ["order-42"]
