"""The dashboard's cache tables (``cache._slots``): one table per kind of result, keyed by value, bounded."""

from __future__ import annotations

import threading

from caliber_dashboard.common import cache

TABLES = (cache._calibration_slot, cache._curves_slot, cache._target_slot, cache._estimator_slot,
          cache._served_slot, cache._bands_slot, cache._figure_slot, cache._config_slot,
          cache._margins_slot, cache._model_row_slot, cache._attack_slot, cache._fleet_slot)


def test_a_key_has_one_slot_per_table_and_tables_do_not_share():
    key = ("digest-of-a-file", "median", 0, None)
    slots = [table(key) for table in TABLES]
    assert all(table(key) is slot for table, slot in zip(TABLES, slots))  # same key, same slot
    assert len({id(slot) for slot in slots}) == len(TABLES)  # one Streamlit cache each
    assert all(slot.value is cache._EMPTY for slot in slots)
    assert cache._served_slot(key + ("other",)) is not cache._served_slot(key)


def test_a_slot_is_filled_once_and_the_lock_table_holds_locks():
    key = ("digest-filled-once",)
    calls = []
    slot = cache._target_slot(key)
    assert cache._fill(slot, lambda _: calls.append(1) or "value") == "value"
    assert cache._fill(cache._target_slot(key), lambda _: calls.append(1) or "other") == "value"
    assert calls == [1]
    lock = cache._model_lock(key)
    assert isinstance(lock, type(threading.Lock())) and cache._model_lock(key) is lock


def test_a_table_keeps_at_most_max_entries():
    table = cache._slots("eviction_check", max_entries=2)
    first, _, last = table(("a",)), table(("b",)), table(("c",))
    assert table(("c",)) is last
    assert table(("a",)) is not first  # the oldest went when the third came
