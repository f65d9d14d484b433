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

    def _set_flag(self, account, *, flagged: bool, level: int, reason: str, group=None) -> dict:
        fp, expire_after = (account_fingerprint(account), self.policy.expire_after) if group is None else (
            group[1], group[0].expire_after)
        state = self.store.set_flag(fp, flagged=flagged, level=level, reason=check_reason(reason), now=self._now(),
                                    expire_after=expire_after)
        self._remember(fp, level)
        if self._metrics:
            self._metrics.flags.labels(action="flag" if flagged else "unflag").inc()
        return self._describe(fp, state, group=group)

    # ------------------------------------------------------------------ groups
    def _group(self, kind, value) -> tuple:
        from .groups import check_groups

        return check_groups(self.policy, {kind: value})[0]

    def flag_group(self, kind, value, *, level: int = 1, reason: str = "") -> dict:
        """Flag the group (``kind``, ``value``): every member is served at least ``level``; it escalates by its kind's rule.

        Parameters
        ----------
        kind : str
            A kind the policy declares (``card``).
        value : str
            The group's value (kept as a fingerprint only, never echoed).
        level : int, optional
            1..the policy's top level.
        reason : str, optional
            One line of at most 500 characters, kept in the group's history.

        Returns
        -------
        dict
            The group's entry, as :meth:`group_status` gives it.

        Raises
        ------
        PolicyError
            ``level`` is not a flagged level of the policy.
        DescriptorError
            An undeclared kind or a bad value (one line, never the value).
        TypeError, ValueError
            A bad reason.
        StoreUnavailable
            The store cannot be reached.
        """
        group = self._group(kind, value)
        return self._set_flag(None, flagged=True, level=self.policy.check_level(level), reason=reason, group=group)

    def unflag_group(self, kind, value, *, reason: str = "") -> dict:
        """Clear the group's flag: its members return to their own levels; its counts and history stay.

        Parameters
        ----------
        kind, value : str
            The group, as :meth:`flag_group` takes it.
        reason : str, optional
            One line, kept in the history.

        Returns
        -------
        dict
            The group's entry.

        Raises
        ------
        DescriptorError, TypeError, ValueError, StoreUnavailable
            As :meth:`flag_group`.
        """
        return self._set_flag(None, flagged=False, level=0, reason=reason, group=self._group(kind, value))

    def group_state(self, kind, value) -> AccountState:
        """The group's ledger entry (an :class:`AccountState`, as :meth:`state` gives an account's).

        Returns
        -------
        AccountState
            A fresh, unflagged one for a group never seen.

        Raises
        ------
        DescriptorError
            An undeclared kind or a bad value.
        StoreUnavailable
            The store cannot be reached.
        """
        return self.store.get(self._group(kind, value)[1]) or AccountState()

    def group_status(self, kind=None, value=None) -> dict:
        """One group's entry, or every flagged group's, JSON-able (groups named by fingerprint).

        Parameters
        ----------
        kind, value : str, optional
            The group; both None: every flagged group.

        Returns
        -------
        dict
            The entry, or ``{"flagged": [entry, ...]}``.

        Raises
        ------
        DescriptorError, StoreUnavailable
            As :meth:`group_state`.
        """
        from .groups import group_kind_of

        if kind is not None or value is not None:
            group = self._group(kind, value)
            return self._describe(group[1], self.store.get(group[1]) or AccountState(), group=group)
        out = []
        for name in self.store.groups(flagged_only=True):
            declared = self.policy.group_kind(group_kind_of(name))
            if declared is not None:  # a kind the policy no longer declares is not served
                out.append(self._describe(name, self.store.get(name) or AccountState(), group=(declared, name)))
        return {"flagged": out}

    def group_audit(self, kind, value) -> dict:
        """The group's report: its flag history, queries per level, and the members seen (by fingerprint).

        Returns
        -------
        dict
            :func:`~caliber_core.throttle.audit.audit_report`'s report for the group (its
            ``account`` is the group's ledger name), with ``kind`` and ``members``:
            ``{fingerprint: {"queries", "first_seen", "last_seen"}}``.

        Raises
        ------
        DescriptorError, StoreUnavailable
            As :meth:`group_state`.
        """
        from .audit import audit_report

        declared, name = self._group(kind, value)
        report = audit_report(self.policy, name, self.store.get(name) or AccountState(), now=self._now(),
                              expire_after=declared.expire_after)
        report["kind"] = declared.name
        report["members"] = self.store.members(name)
        return report

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

    def _describe(self, fp: str, state: AccountState, *, group=None) -> dict:
        from .ledger import expired

        expire_after = self.policy.expire_after if group is None else group[0].expire_after
        out = {"account": fp} if group is None else {"group": fp, "kind": group[0].name}
        out.update(state.to_dict(expire_after=expire_after))
        if expired(state, self._now(), expire_after):
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
