"""The throttle: route each account's logits through its level, count it, escalate it.

>>> t = Throttle.from_files("policy.json", key=key, store="sqlite:///ledger.db")   # doctest: +SKIP
>>> t.flag("acct-7", level=1, reason="detector 0.93")                               # doctest: +SKIP
>>> r = t.respond("acct-7", logits, ids)    # r.logits, r.level, r.sigma, r.shadow   # doctest: +SKIP

Only ``r.logits`` goes back to the client: the response's type, dtype, shape
and the work spent on it are the same at every level.

Fail closed, by one rule (the policy's ``on_store_error``):

* a Throttle whose store cannot be reached when it is built refuses to
  start (``StoreUnavailable``) unless ``start`` is ``"degraded"``;
* during an outage, ``serve: "refuse"`` refuses every request;
  ``"last-known"`` serves an account the level this process last saw for it,
  and an account it has not seen ``unseen`` (refused by default, or a flagged
  level >= 1) -- never clean;
* every degraded decision logs one warning on the ``caliber_core.throttle``
  logger (the store's error and the level, never the account or the key).

Counted means counted: a request is counted if and only if an answer was
produced for it. Rows served while the store was unreachable are tallied per
account by this process and written to the ledger's ``uncounted`` record
(process, first and last time, rows per level) once the store answers
again; a request that fails after it was counted (here, or in the caller,
through :meth:`Throttle.void`) has its rows moved from ``queries`` to
``failed``; a Redis request whose reply was lost is settled the same way.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from ..validation import is_torch
from .accounts import AccountBook
from .group_requests import GroupRequests
from .ledger import account_fingerprint, check_time
from .outages import Outages, log
from .policy import load_policy
from .ledger_store import LedgerStore, PipelinedLedgerStore, StoreUnavailable
from .response import Response
from .stores import open_store

LAST_KNOWN_CAPACITY = 100_000


class Throttle(AccountBook, GroupRequests):
    """A policy, its level Perturbers and a ledger store.

    Parameters
    ----------
    policy : Policy
        From :func:`caliber_core.throttle.policy.load_policy`.
    key : bytes, optional
        The seeding secret: for a consistent-seeding config, the key it was
        calibrated with (another is refused here, naming both fingerprints).
        Needed by ``respond`` and ``grant`` only; flagging, status and audit
        work without it.
    store : str or store object
        ``sqlite:///PATH``, ``redis://``, ``redis+sentinel://`` or ``redis+cluster://`` (:func:`.stores.open_store`).
    clock : callable, default time.time
        Seconds since the epoch (tests and simulations pass their own).
    metrics : bool, default True
        Count requests, shadow decisions and flags in Prometheus counters.
    registry : prometheus_client.CollectorRegistry, optional
        Where the counters live (default: prometheus_client's global registry).

    Raises
    ------
    StoreUnavailable
        The store cannot be reached and the policy's ``on_store_error.start`` is "refuse" (the default).
    ValueError
        A key the policy's config cannot be served with.
    """

    def __init__(self, policy, *, key=None, store, clock=time.time, metrics: bool = True, registry=None):
        self.policy = policy
        self.store: LedgerStore = open_store(store) if isinstance(store, str) else store
        if not isinstance(self.store, LedgerStore):
            raise TypeError(f"store must be a store URL or a LedgerStore, got {type(store).__name__}")
        self._clock = clock
        self._pipelined_for = self._pipelined = None  # _is_pipelined's cache
        self._levels = None
        if key is not None:
            from .levels import LevelNoise

            from .grants import grant_key, policy_digest

            self._levels = LevelNoise(policy, key=key)
            self._levels.warm_up()  # with torch loaded: its first ops and the fused kernel's first call, now
            self._grant_key, self._policy_digest = grant_key(key), policy_digest(policy)
        self._last_known = OrderedDict()
        self._outages = Outages(policy, now=self._now)
        self._metrics = None
        if metrics:
            from .metrics import throttle_metrics

            self._metrics = throttle_metrics(registry)
        try:
            self.store.ping()
        except StoreUnavailable as exc:
            if not policy.start_degraded:
                raise StoreUnavailable(f"{exc}; refusing to start: the policy's on_store_error.start is "
                                       "\"refuse\" (set it to \"degraded\" to serve by the outage rule)") from None
            log.warning("ledger store unreachable at start (%s): serving degraded, as on_store_error.start allows",
                        exc)

    @classmethod
    def from_files(cls, policy, *, key=None, store, **options) -> "Throttle":
        """A Throttle from a policy file (which names its config).

        Parameters
        ----------
        policy : str, os.PathLike or Mapping
            The policy file, its JSON text or its dict (:func:`~caliber_core.throttle.policy.load_policy`).
        key : bytes, optional
            The seeding key; see the class.
        store : LedgerStore or str
            The ledger store, or its URL (:func:`~caliber_core.throttle.stores.open_store`).
        **options
            The class's other keyword options.

        Returns
        -------
        Throttle

        Raises
        ------
        PolicyError
            The policy or its config does not load.
        StoreUnavailable
            The store cannot be reached and the policy does not start degraded.
        ValueError
            A key the policy's config cannot be served with.
        """
        return cls(load_policy(policy), key=key, store=store, **options)

    def __repr__(self) -> str:
        return f"Throttle(levels={len(self.policy.levels) - 1}, store={self.store!r})"  # never the key

    def close(self) -> None:
        """Close the store's connections (the Throttle is also a context manager that does it)."""
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _now(self) -> float:
        return check_time(self._clock())

    # ------------------------------------------------------------------ outages
    def _degraded(self, fp: str, rows: int, error: StoreUnavailable, groups: tuple = ()) -> tuple:
        """Segments for a request the store could not count (:meth:`.outages.Outages.decide`)."""
        if self._metrics:
            self._metrics.store_errors.inc()
        return self._outages.decide(fp, rows, error, self._last_known, groups=groups)

    def _after_contact(self) -> None:
        if self._outages.pending():
            try:
                self._outages.settle(self.store)
            except StoreUnavailable:
                pass  # still down for these writes: kept for the next request

    def pending_uncounted(self) -> dict:
        """Rows this process served uncounted that the ledger does not hold yet.

        Returns
        -------
        dict
            ``{fingerprint: {level: rows}}``; empty once the store has them.
        """
        return {fp: dict(q) for fp, (_, _, q) in self._outages.uncounted.items()}

    def void(self, response: Response) -> None:
        """The caller could not deliver ``response``: un-count it (its rows move from queries to failed).

        A response served uncounted is taken out of the outage tally instead.
        Voiding twice does nothing the second time.

        Parameters
        ----------
        response : Response
            What :meth:`respond` returned.

        Notes
        -----
        Never raises for the store: a void the store cannot take is settled
        later (a Redis request) or logged as a failed request left counted.
        """
        ticket = response._ticket
        if ticket is None or ticket.get("voided"):
            return
        ticket["voided"] = True
        decision = ticket["decision"]
        if decision is not None:
            # The account's own decision and each group's (a request with groups counted each).
            own = decision if not decision.groups else decision.own
            if decision.groups and not self.policy.shadow:
                self._take_back_raised(ticket["fp"], own, decision)
            for name, counted in ((ticket["fp"], own),) + decision.groups:
                try:
                    self.store.void(name, counted)
                except StoreUnavailable as exc:
                    if counted.token is not None:  # settled with the other requests in doubt
                        self._outages.in_doubt.append((name, counted.token, False, None))
                    else:
                        log.warning("ledger store unreachable (%s): a failed request stays counted", exc)
        else:
            for name in (ticket["fp"],) + ticket.get("groups", ()):
                self._outages.tally(name, response.segments, sign=-1)

    # ------------------------------------------------------------------ serving
    def _remember(self, fp: str, level: int) -> None:
        cache = self._last_known
        cache[fp] = level
        cache.move_to_end(fp)
        if len(cache) > LAST_KNOWN_CAPACITY:
            cache.popitem(last=False)

    def _decide(self, fp: str, rows: int, kinds: tuple = ()):
        decision = self._begin(fp, rows, kinds)()
        self._after_contact()
        return decision

    def _begin(self, fp: str, rows: int, kinds: tuple):
        """Send the request's count to the store now; ``finish()`` reads its Decision.

        ``kinds`` are the checked descriptors (:func:`.groups.check_groups`). Without
        groups this is the account's one record; with them, one per account and group
        (one SQLite transaction, one pipelined Redis round trip), the level of each row
        the highest of them.
        """
        policy = self.policy
        store = self.store
        if not kinds:
            request = dict(rows=rows, now=self._now(), escalate_after=policy.escalate_after, top=policy.top,
                           expire_after=policy.expire_after, shadow=policy.shadow)
            if self._is_pipelined():  # the round trip overlaps the draws
                finish = store.begin_record(fp, **request)
            else:
                counted = store.record(fp, **request)
                finish = lambda: counted  # noqa: E731
        else:
            finish = self._begin_with_groups(fp, rows, kinds)

        def decided():
            result = finish()
            if not kinds:
                self._remember(fp, result.state.level if result.state.flagged else 0)
                return result
            return self._merge(fp, kinds, result)

        return decided

    def _is_pipelined(self) -> bool:
        """Whether the store is a PipelinedLedgerStore, checked once per store object (a runtime
        Protocol check walks every method name on each call)."""
        store = self.store
        if self._pipelined_for is not store:
            self._pipelined_for, self._pipelined = store, isinstance(store, PipelinedLedgerStore)
        return self._pipelined

    def decide(self, account, rows: int = 1, *, groups=None):
        """Count ``rows`` queries for ``account`` (and its groups) and return the Decision, without serving anything.

        What ``respond`` does before adding noise; simulations and gateways
        that apply the noise elsewhere call it directly.

        Parameters
        ----------
        account : str or bytes
            The account id (the ledger keeps its fingerprint only).
        rows : int, optional
            Rows (queries) in the request, 1..10**9.
        groups : Mapping of str to str, optional
            Group descriptors ``{kind: value}`` of kinds the policy declares
            (:mod:`.groups`); each group is counted and escalated too.

        Returns
        -------
        Decision
            The level of each of the request's rows (the highest of its account's and
            its groups'), the flag events and the account's new state; ``groups`` holds
            each group's own decision.

        Raises
        ------
        TypeError, ValueError
            A bad account id or row count, or descriptors refused (``DescriptorError``:
            nothing is counted).
        StoreUnavailable
            The store cannot be reached (the outage rule does not apply here).
        """
        from .ledger import check_rows

        fp, rows, kinds = account_fingerprint(account), check_rows(rows), self._kinds(groups)
        return self._decide(fp, rows, kinds)

    def grant(self, account, *, rows: int, valid_minutes: float | None = None, groups=None) -> str:
        """Count ``rows`` for ``account``, escalate as :meth:`respond` does, and return a signed grant token.

        Parameters
        ----------
        account : str or bytes
        rows : int
            The positions the request may generate.
        valid_minutes : float, optional
            How long the engine honours the token (default ``grants.DEFAULT_VALID_MINUTES``).
        groups : Mapping of str to str, optional
            Group descriptors, as :meth:`decide` takes them: the grant carries the highest
            level of the account and its groups.

        Returns
        -------
        str
            The token (:mod:`.grants`): the level (the highest any row got; 0 under shadow mode),
            the policy's digest, an expiry and a nonce, under an HMAC keyed from the seeding key.

        Raises
        ------
        ValueError
            No key, bad ``rows`` or ``valid_minutes``, or refused descriptors (nothing is counted).
        StoreUnavailable
            As for :meth:`respond`.
        """
        from .grants import check_valid_minutes, sign_grant
        from .ledger import check_rows

        if self._levels is None:
            raise ValueError("grant needs the seeding key: build the Throttle with key=<secret bytes>")
        rows, minutes = check_rows(rows), check_valid_minutes(valid_minutes)
        fp, decision, kinds = account_fingerprint(account), None, self._kinds(groups)
        try:
            decision = self._decide(fp, rows, kinds)
            segments = decision.segments
        except StoreUnavailable as exc:
            segments = self._degraded(fp, rows, exc, tuple(name for _, name in kinds))
        if self._metrics:
            self._metrics.observe(segments, decision, shadow=self.policy.shadow)
        level = 0 if self.policy.shadow else max(level for level, _ in segments)
        return sign_grant(level=level, digest=self._policy_digest, rows=rows, signing_key=self._grant_key,
                          now=self._now(), valid_minutes=minutes)

    def respond(self, account, logits, ids=None, *, groups=None) -> Response:
        """Serve ``logits`` for ``account``: count the rows, escalate if due, add the level's noise.

        Parameters
        ----------
        account : str or bytes
            The account id (stored only as a fingerprint). Unknown accounts are unflagged.
        logits : ndarray or torch.Tensor of shape (n_samples, K) or (K,)
            K must be the config's n_classes.
        ids : sequence of str/bytes, or one for a single row
            Per-input seeding ids (required with per-input seeding).
        groups : Mapping of str to str, optional
            Group descriptors ``{kind: value}`` (kinds the policy declares; values are
            kept as fingerprints only). Every row is served the highest level of its
            account and its groups, and each group is counted and escalated.

        Raises
        ------
        ValueError, TypeError
            Bad logits, ids or descriptors (``DescriptorError``, one line): nothing is counted.
        StoreUnavailable
            The store is unreachable and the policy's outage rule refuses the request
            (``on_store_error.serve`` "refuse", or an account this process has not seen and
            ``unseen`` "refuse").
        """
        if self._levels is None:
            raise ValueError("respond needs the seeding key: build the Throttle with key=<secret bytes>")
        rows = self._rows(logits, ids)
        checked = self._levels.check(logits, ids)  # every check before anything is counted
        fp = account_fingerprint(account)
        kinds = self._kinds(groups)
        policy = self.policy
        finish = error = None
        try:
            finish = self._begin(fp, rows, kinds)  # a Redis round trip overlaps the draws below
        except StoreUnavailable as exc:
            error = exc
        prepared = self._levels.prepare(checked)  # while the store works, if it can
        decision = None
        if finish is not None:
            try:
                decision = finish()
            except StoreUnavailable as exc:
                error = exc
        names = tuple(name for _, name in kinds)
        if decision is not None:
            segments = decision.segments
        else:
            segments = self._degraded(fp, rows, error, names)
        ticket = {"fp": fp, "decision": decision, "voided": False, "groups": names}
        try:
            served = self._levels.assemble(prepared, segments, shadow=policy.shadow)
        except BaseException:
            # No answer was produced: un-count it (counted means an answer went out).
            self.void(Response(None, 0, 0.0, policy.shadow, segments, decision is not None, ticket))
            raise
        level = max(level for level, _ in segments)
        if self._metrics:
            self._metrics.observe(segments, decision, shadow=policy.shadow)
        if decision is not None:
            self._after_contact()
        return Response(logits=served, level=level, sigma=policy.levels[level].sigma, shadow=policy.shadow,
                        segments=segments, counted=decision is not None, _ticket=ticket)

    def _rows(self, logits, ids) -> int:
        """Check the shape against the config's K and the ids before anything is counted."""
        shape = tuple(logits.shape) if (is_torch(logits) or hasattr(logits, "shape")) else None
        if shape is None:
            raise TypeError(f"logits must be a numpy array or torch tensor, got {type(logits).__name__}")
        k = self.policy.config["n_classes"]
        if len(shape) not in (1, 2) or shape[-1] != k or (len(shape) == 2 and shape[0] < 1):
            raise ValueError(f"logits must be (n_samples, {k}) or ({k},) for this policy's config, got {shape}")
        rows = 1 if len(shape) == 1 else shape[0]
        if ids is None and self.policy.seeding == "per-input":
            raise ValueError("per-input seeding needs ids (one str/bytes per row), got ids=None")
        if ids is not None and len(shape) == 2:
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or len(ids) != rows:
                n = len(ids) if hasattr(ids, "__len__") and not isinstance(ids, (str, bytes)) else 1
                raise ValueError(f"need one id per row: got {n} ids for {rows} rows")
        return rows
