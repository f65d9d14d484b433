"""Both ledger stores implement the one LedgerStore protocol; only Redis pipelines a request."""

from __future__ import annotations

import pytest

from caliber_core.throttle import Throttle
from caliber_core.throttle.ledger_store import LedgerStore, PipelinedLedgerStore
from caliber_core.throttle.redis_store import RedisStore
from caliber_core.throttle.sqlite_store import SqliteStore
from caliber_core.throttle.stores import open_store


def test_both_stores_are_ledger_stores(tmp_path):
    assert issubclass(SqliteStore, LedgerStore) and issubclass(RedisStore, LedgerStore)
    assert issubclass(RedisStore, PipelinedLedgerStore) and not issubclass(SqliteStore, PipelinedLedgerStore)
    store = open_store(f"sqlite:///{tmp_path / 'ledger.db'}")
    assert isinstance(store, LedgerStore) and not hasattr(store, "begin_record")


def test_a_throttle_refuses_what_is_no_store():
    with pytest.raises(TypeError, match="store must be a store URL or a LedgerStore, got dict"):
        Throttle(None, store={})
