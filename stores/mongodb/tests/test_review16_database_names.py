"""Sixteenth review: database names that are legal but wrong for a store.

* ``admin``, ``local`` and ``config`` are MongoDB's own databases: ``local`` is never
  replicated (a failover loses every task written there, whatever the write concern),
  ``config`` holds a sharded cluster's metadata and ``admin`` its users. The store took
  them silently; it refuses them at construction now, before any I/O (failed before).
* MongoDB refuses a database whose name differs from an existing one only in case
  (``Agentium`` next to ``agentium``: DatabaseDifferCase, 13297). The store reported
  "the operation did not complete. Check the server's logs"; it now says to use the
  existing database's exact name (failed before). SecantusDB does not enforce this rule,
  so the mapping is tested on the driver's error.
"""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from agentium_graph.errors import ConfigurationError, StoreError, StoreUnavailableError
from agentium_graph_mongodb import MongoDBDurableTaskStore
from agentium_graph_mongodb._errors import map_mongo_error


@pytest.mark.parametrize("name", ["admin", "local", "config", "Local", "ADMIN"])
def test_mongodbs_own_databases_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        MongoDBDurableTaskStore("mongodb://localhost", database=name)
    assert info.value.details["argument"] == "database"
    assert "MongoDB's own" in str(info.value) and "database=" in str(info.value)


@pytest.mark.parametrize("name", ["administration", "locally", "configs", "agentium"])
def test_names_that_only_start_like_them_are_fine(name: str) -> None:
    assert MongoDBDurableTaskStore("mongodb://localhost",
                                   database=name).database_name == name


def test_a_name_differing_only_in_case_says_to_use_the_exact_name() -> None:
    failure = OperationFailure("db already exists with different case already have: "
                               "[agentium] trying to create [Agentium]", code=13297)
    error = map_mongo_error(failure, "create_task", "database 'Agentium'")
    assert isinstance(error, StoreError) and not isinstance(error, StoreUnavailableError)
    assert error.details["reason"] == "database_differs_in_case"
    assert "only in case" in str(error) and "database=" in str(error)
