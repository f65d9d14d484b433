"""The throttle: serve a calibrated config to flagged accounts, escalate with volume, audit for appeals.

* :mod:`.policy`        ``caliber.policy/v1``: levels, escalation, expiry, shadow mode
* :mod:`.ledger`        an account's aggregates and the rule that moves them
* :mod:`.stores`        the store chosen by URL (``sqlite:///PATH``, ``redis://HOST:PORT/DB``)
* :mod:`.sqlite_store`, :mod:`.redis_store`  the two stores
* :mod:`.levels`        serving a level with the same work at every level
* :mod:`.throttle`      :class:`Throttle`, the Python API
* :mod:`.audit`         the appeal report
* :mod:`.simulate`      synthetic accounts replayed through a policy
* :mod:`.metrics`       Prometheus counters
* :mod:`.command`       ``python -m caliber_core throttle ...``

Importing this package loads numpy and the standard library only; redis and
prometheus_client are imported when a Redis store or the counters are used.
"""

from .ledger import account_fingerprint
from .policy import Policy, PolicyError, build_policy, load_policy
from .stores import StoreUnavailable, StoreURLError, open_store
from .throttle import Response, Throttle

__all__ = ["Policy", "PolicyError", "Response", "StoreURLError", "StoreUnavailable", "Throttle",
           "account_fingerprint", "build_policy", "load_policy", "open_store"]
