"""Prometheus counters for the throttle (``prometheus_client``, imported only when a Throttle counts).

* ``caliber_throttle_requests_total{level}``     requests by the highest level decided for their rows
* ``caliber_throttle_rows_total{level}``         rows (queries) by level
* ``caliber_throttle_shadow_decisions_total{level}``  flagged requests served clean by shadow mode
* ``caliber_throttle_flags_total{action}``       flag, unflag, escalate, expire
* ``caliber_throttle_store_errors_total``         requests the store could not count

No label names an account: the counts are per level, never per account.
"""

from __future__ import annotations

import threading

_LOCK = threading.Lock()
_BY_REGISTRY: dict = {}


class ThrottleMetrics:
    """The throttle's Prometheus counters: requests and rows per level, shadow decisions, flag changes,
    store errors (labels are levels and actions only, never accounts).

    Parameters
    ----------
    registry : prometheus_client.CollectorRegistry
        Where the counters are registered (once: use :func:`throttle_metrics`).
    """

    def __init__(self, registry):
        from prometheus_client import Counter

        self.requests = Counter("caliber_throttle_requests", "Requests served, by the highest level decided.",
                                ["level"], registry=registry)
        self.rows = Counter("caliber_throttle_rows", "Rows (queries) served, by level.", ["level"],
                            registry=registry)
        self.shadow = Counter("caliber_throttle_shadow_decisions",
                              "Flagged requests decided at a level but served clean (shadow mode).",
                              ["level"], registry=registry)
        self.flags = Counter("caliber_throttle_flags", "Flag changes: flag, unflag, escalate, expire.",
                             ["action"], registry=registry)
        self.store_errors = Counter("caliber_throttle_store_errors",
                                    "Requests the ledger store could not count.", registry=registry)

        self._children: dict = {}

    def _child(self, counter, label: str, value) -> object:
        # labels() takes a lock and builds a key on every call; the request path reuses the children.
        key = (id(counter), value)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(**{label: str(value)})
        return child

    def observe(self, segments, decision, *, shadow: bool) -> None:
        """Count one served request.

        Parameters
        ----------
        segments : tuple of (int, int)
            The request's ((level, rows), ...).
        decision : Decision or None
            The store's decision (its flag events are counted); None when the store was down.
        shadow : bool
            Whether the policy serves clean (a flagged request is then a shadow decision).
        """
        level = max(lv for lv, _ in segments)
        self._child(self.requests, "level", level).inc()
        for lv, n in segments:
            self._child(self.rows, "level", lv).inc(n)
        if shadow and level > 0:
            self._child(self.shadow, "level", level).inc()
        if decision is not None:
            for event in decision.events:
                self._child(self.flags, "action", {"escalated": "escalate", "expired": "expire"}[event.event]).inc()


def throttle_metrics(registry=None) -> ThrottleMetrics:
    """The throttle's counters on ``registry``, created once per registry.

    Parameters
    ----------
    registry : prometheus_client.CollectorRegistry, optional
        Default: prometheus_client's global registry.

    Returns
    -------
    ThrottleMetrics
        The same object for every call with the same registry.

    Raises
    ------
    ImportError
        prometheus_client is not installed (the ``metrics`` extra).
    """
    if registry is None:
        from prometheus_client import REGISTRY as registry
    with _LOCK:
        found = _BY_REGISTRY.get(id(registry))
        if found is None or found[0] is not registry:
            found = (registry, ThrottleMetrics(registry))
            _BY_REGISTRY[id(registry)] = found
        return found[1]
