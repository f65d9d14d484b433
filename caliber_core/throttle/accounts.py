"""What a provider does with accounts through a :class:`~caliber_core.throttle.throttle.Throttle`: flag, unflag, read, audit.

:class:`AccountBook` is the part of ``Throttle`` that changes or reads the
ledger for one account at an operator's request; serving (``decide``,
``grant``, ``respond``) stays in :mod:`.throttle`. It relies on what
``Throttle`` sets up: ``policy``, ``store``, ``_now()``, ``_remember()`` and
``_metrics``.
"""

from __future__ import annotations

from .ledger import AccountState, account_fingerprint, check_reason


class AccountBook:
    """Flagging, status and the appeal audit of a throttle's accounts (mixed into ``Throttle``)."""

    def flag(self, account, *, level: int = 1, reason: str = "") -> dict:
        """Flag ``account`` at ``level``; a flagged account is moved there and its counter restarts.

        Parameters
        ----------
        account : str or bytes
            The account id (the ledger keeps its fingerprint only).
        level : int, optional
            1..the policy's top level.
        reason : str, optional
            One line of at most 500 characters, kept in the history.

        Returns
        -------
        dict
            The account's entry, as :meth:`status` gives it.

        Raises
        ------
        PolicyError
            ``level`` is not a flagged level of the policy.
        TypeError, ValueError
            A bad account id or reason.
        StoreUnavailable
            The store cannot be reached.
        """
        return self._set_flag(account, flagged=True, level=self.policy.check_level(level), reason=reason)

    def unflag(self, account, *, reason: str = "") -> dict:
        """Clear the flag: the account is served clean again; its counts and history stay.

        Parameters
        ----------
        account : str or bytes
            The account id (the ledger keeps its fingerprint only).
        reason : str, optional
            One line of at most 500 characters, kept in the history.

        Returns
        -------
        dict
            The account's entry, as :meth:`status` gives it.

        Raises
        ------
        TypeError, ValueError
            A bad account id or reason.
        StoreUnavailable
            The store cannot be reached.
        """
        return self._set_flag(account, flagged=False, level=0, reason=reason)

    def _set_flag(self, account, *, flagged: bool, level: int, reason: str) -> dict:
        fp = account_fingerprint(account)
        state = self.store.set_flag(fp, flagged=flagged, level=level, reason=check_reason(reason), now=self._now(),
                                    expire_after=self.policy.expire_after)
        self._remember(fp, level)
        if self._metrics:
            self._metrics.flags.labels(action="flag" if flagged else "unflag").inc()
        return self._describe(fp, state)

    def state(self, account) -> AccountState:
        """The account's ledger entry.

        Parameters
        ----------
        account : str or bytes
            The account id (the ledger keeps its fingerprint only).

        Returns
        -------
        AccountState
            A fresh, unflagged one for an account never seen.

        Raises
        ------
        StoreUnavailable
            The store cannot be reached.
        """
        return self.store.get(account_fingerprint(account)) or AccountState()

    def status(self, account=None) -> dict:
        """One account's entry, or every flagged account's, JSON-able (accounts named by fingerprint).

        Parameters
        ----------
        account : str or bytes, optional
            The account; None: every flagged account.

        Returns
        -------
        dict
            The entry (with its sigma and whether the flag has lapsed), or
            ``{"flagged": [entry, ...]}``.

        Raises
        ------
        StoreUnavailable
            The store cannot be reached.
        """
        if account is not None:
            fp = account_fingerprint(account)
            return self._describe(fp, self.store.get(fp) or AccountState())
        fps = self.store.accounts(flagged_only=True)
        return {"flagged": [self._describe(fp, self.store.get(fp) or AccountState()) for fp in fps]}

    def _describe(self, fp: str, state: AccountState) -> dict:
        from .ledger import expired

        out = {"account": fp}
        out.update(state.to_dict(expire_after=self.policy.expire_after))
        if expired(state, self._now(), self.policy.expire_after):
            out["flag_lapsed"] = True  # lapsed; recorded as "expired" at its next request
        out["sigma"] = self.policy.levels[min(state.level, self.policy.top)].sigma if state.flagged else 0.0
        return out

    def audit(self, account) -> dict:
        """The appeal report: flag history, queries and what was received per level, the loss; JSON-able.

        Parameters
        ----------
        account : str or bytes
            The account id (the ledger keeps its fingerprint only).

        Returns
        -------
        dict
            :func:`~caliber_core.throttle.audit.audit_report`'s report.

        Raises
        ------
        StoreUnavailable
            The store cannot be reached.
        """
        from .audit import audit_report

        fp = account_fingerprint(account)
        return audit_report(self.policy, fp, self.store.get(fp) or AccountState(), now=self._now())
