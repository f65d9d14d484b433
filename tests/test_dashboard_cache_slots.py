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


def test_prefetch_fills_the_whole_readout_of_a_neighbour(monkeypatch):
    """served, the sigma range and (off the point) the one-sided bound: a step then computes nothing."""
    from caliber_dashboard.common import state

    data = next(d for d in state.demo_models() if d.has_labels)
    cal = cache.calibration(data)
    for side, value in (("point", 0.77), ("at-least", 0.76)):
        cache.prefetch(data, cal, "retention", [value], side=side)
        cache._prefetcher.submit(lambda: None).result(timeout=120)  # one worker: runs after the prefetch

    def computed_again(*args, **kwargs):
        raise AssertionError("the readout of a prefetched target was computed on the step")

    monkeypatch.setattr(cache.readouts, "sigma_range", computed_again)
    monkeypatch.setattr(cache, "with_interval", computed_again)
    monkeypatch.setattr(cache, "estimator", computed_again)  # the one-sided bound's computation
    assert cache.sigma_range(data, cal, "retention", 0.77) is not None
    assert cache.sigma_range(data, cal, "retention", 0.76, side="at-least") is not None
    assert 0.0 < cache.side_bound(data, cal, "retention", 0.76, side="at-least") < 1.0
