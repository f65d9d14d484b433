"""The throttle: serve a calibrated config to flagged accounts, escalate with volume, audit for appeals.

* :mod:`.policy`        ``caliber.policy/v1``: levels, escalation, expiry, shadow mode, group kinds (read, check, write)
* :mod:`.policy_schema` the policy's types, its JSON form and each field's rule
* :mod:`.groups`        group descriptors (a card, an organisation): checked, fingerprinted
* :mod:`.ledger`        an account's aggregates and the rule that moves them
* :mod:`.stores`        the store chosen by URL (``sqlite:///PATH``, ``redis://``, ``redis+sentinel://``,
                        ``redis+cluster://``)
* :mod:`.sqlite_store`, :mod:`.redis_store`  the two stores; :mod:`.sqlite_groups`, :mod:`.redis_requests`
                        a request with groups counted in each; :mod:`.sqlite_schema` the SQLite tables
* :mod:`.redis_urls`    Redis store URLs of every topology, and ``wait=N``
* :mod:`.redis_keys`    the Redis key layout (hash-tagged per account); :mod:`.redis_migrate` moves an older one
* :mod:`.levels`        serving a level with the same work at every level
* :mod:`.throttle`      :class:`Throttle`, the Python API (serving); :mod:`.response` what ``respond`` returns
* :mod:`.group_requests` a request with groups, part of :class:`Throttle`
* :mod:`.accounts`      flag, unflag, status and audit, part of :class:`Throttle`
* :mod:`.outages`       the fail-closed rule applied, and what a process owes the ledger after an outage
* :mod:`.audit`         the appeal report
* :mod:`.simulate`      synthetic accounts replayed through a policy
* :mod:`.metrics`       Prometheus counters
* ``caliber throttle ...``  :mod:`caliber_core.cli.throttle`

Importing this package loads numpy and the standard library only; redis and
prometheus_client are imported when a Redis store or the counters are used.
"""

from ..lazy_names import lazy_names

_NAMES = {
    "Policy": "policy", "PolicyError": "policy", "build_policy": "policy", "load_policy": "policy",
    "Response": "response", "Throttle": "throttle",
    "StoreURLError": "ledger_store", "StoreUnavailable": "ledger_store", "LedgerStore": "ledger_store", "open_store": "stores",
    "account_fingerprint": "ledger",
    "DescriptorError": "groups", "group_fingerprint": "groups",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
