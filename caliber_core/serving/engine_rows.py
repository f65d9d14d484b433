"""The engine-free core of in-engine serving: a batch of rows, each at its own level, noised in one pass.

An LLM engine decodes a batch of requests at once; each row of its logits is
one request's next position and each request carries its own level (from a
grant token, :mod:`caliber_core.throttle.grants`). :class:`BatchNoise` serves
such a batch through the throttle's :class:`~caliber_core.throttle.levels.LevelNoise`,
so a row at level j gets exactly ``Perturber.from_config(config, target=I_j,
key=key).perturb(row, [id])`` and every row costs the same draws whatever its
level. The engine adapters (:mod:`caliber_core.serving.vllm`) only map their
batches onto it.

:func:`position_id` names a row: a hash of every token before the position,
so the same context gives the same id (and the same noise) however it is
split between prompt and generated tokens, and a repeated request gets the
same answer (Proposition 2(ii)).

No engine is imported here; torch only when a tensor is served.
"""

from __future__ import annotations

import hashlib
import struct

from ..throttle.grants import Grant, grant_key, policy_digest, verify_grant
from ..throttle.levels import LevelNoise

__all__ = ["POSITION_DOMAIN", "BatchNoise", "PositionHasher", "position_id"]

#: Domain separation of position ids from any other id a provider serves with the same key.
POSITION_DOMAIN = b"caliber.llm-position/v1\x00"
_MAX_TOKEN_ID = (1 << 63) - 1


def _pack(token_ids) -> bytes:
    ids = [int(t) for t in token_ids]
    if any(not 0 <= t <= _MAX_TOKEN_ID for t in ids):
        bad = next(t for t in ids if not 0 <= t <= _MAX_TOKEN_ID)
        raise ValueError(f"token ids must be integers in [0, 2^63), got {bad!r}")
    return struct.pack(f"<{len(ids)}q", *ids)


def position_id(prompt_token_ids, output_token_ids) -> bytes:
    """The id of the position after ``prompt_token_ids + output_token_ids``: 32 bytes.

    SHA-256 of :data:`POSITION_DOMAIN` followed by every token id as a signed
    64-bit little-endian integer, prompt then output. Only the whole context
    counts: a prompt of ``[1, 2, 3]`` and a prompt ``[1, 2]`` that generated
    ``3`` name one position (they have the same clean logits, so they get the
    same noise, and resplitting a context gives a thief no fresh draw).

    Parameters
    ----------
    prompt_token_ids : sequence of int
        The request's prompt tokens.
    output_token_ids : sequence of int
        The tokens generated so far.

    Returns
    -------
    bytes
        The row id passed to ``Perturber.perturb(row, [id])``.

    Raises
    ------
    ValueError
        A token id is negative or beyond 2^63 - 1.
    """
    hasher = PositionHasher(prompt_token_ids)
    return hasher.id_after(output_token_ids)


class PositionHasher:
    """:func:`position_id` for one request as it grows: each generated token is hashed once.

    An engine's output list only grows (a preempted request comes back whole,
    and is then rebuilt): re-hashing a long prompt at every step would cost
    O(prompt) per token.

    Parameters
    ----------
    prompt_token_ids : sequence of int
        The request's prompt, hashed once here.
    """

    __slots__ = ("_state", "_seen", "_prompt_state")

    def __init__(self, prompt_token_ids):
        self._prompt_state = hashlib.sha256(POSITION_DOMAIN)
        self._prompt_state.update(_pack(prompt_token_ids))
        self._state = self._prompt_state.copy()
        self._seen = 0

    def id_after(self, output_token_ids, *, extra=()) -> bytes:
        """The position id after this request's prompt, ``output_token_ids`` and ``extra``.

        Parameters
        ----------
        output_token_ids : sequence of int
            The engine's live output list; only the tokens not seen before are
            hashed (a shorter list than last time restarts from the prompt).
        extra : sequence of int, default ()
            Tokens not kept (speculative drafts, say), hashed on a copy.

        Returns
        -------
        bytes
            The 32-byte id, equal to :func:`position_id` of the same tokens.
        """
        n = len(output_token_ids)
        if n < self._seen:  # the output was cut (never in vLLM today): hash it again from the prompt
            self._state, self._seen = self._prompt_state.copy(), 0
        if n > self._seen:
            self._state.update(_pack(output_token_ids[self._seen:n]))
            self._seen = n
        state = self._state.copy()
        if extra:
            state.update(_pack(extra))
        return state.digest()


class BatchNoise:
    """A policy's levels over a batch whose rows each carry their own level.

    Parameters
    ----------
    policy : caliber_core.throttle.policy.Policy
        The policy the gateway's throttle decides with (the same file).
    key : bytes
        The seeding key (the key file's contents).

    Attributes
    ----------
    n_classes : int
        The config's K: the engine's vocabulary size must equal it.
    digest : str
        :func:`caliber_core.throttle.grants.policy_digest` of the policy.
    """

    def __init__(self, policy, *, key: bytes):
        self.policy = policy
        self.levels = LevelNoise(policy, key=key)
        self.n_classes = self.levels.n_classes
        self.digest = policy_digest(policy)
        self._signing_key = grant_key(key)
        self.levels.warm_up()  # the kernel was built with the Perturbers; this warms torch's first ops

    def warm_up(self, device) -> None:
        """Serve a throwaway two-row batch on ``device`` (the engine's), so no request pays a first call there.

        Parameters
        ----------
        device : str or torch.device or None
            The engine's device; None or the CPU was warmed when this was built.
        """
        if device is not None and str(device) != "cpu":
            self.levels.warm_up(device)

    def verify(self, token, *, now: float | None = None) -> Grant:
        """The grant a request's token carries.

        Parameters
        ----------
        token : str
            The grant token from the request's ``extra_args``.
        now : float, optional
            The time to check expiry against (default: the clock).

        Returns
        -------
        Grant
            The account's level and what the token was signed for.

        Raises
        ------
        GrantError
            A ValueError, one line: the token is malformed, forged, expired, or
            signed for another policy or level range.
        """
        return verify_grant(token, signing_key=self._signing_key, digest=self.digest, top=self.policy.top, now=now)

    def serve(self, logits, row_levels, row_ids, *, out=None):
        """``logits`` (n_rows, K) with row r at level ``row_levels[r]`` for id ``row_ids[r]``.

        Parameters
        ----------
        logits : torch.Tensor or ndarray, shape (n_rows, K)
            The engine's logits (any floating dtype, any device).
        row_levels : sequence of int
            Each row's level (0: clean).
        row_ids : sequence of bytes
            Each row's id (:func:`position_id`).
        out : ndarray or torch.Tensor, optional
            Where the served logits go: ``logits`` itself serves in place (what an
            engine's processor does), or an array of its type, shape and dtype that
            does not overlap it. Default: a new one.

        Returns
        -------
        The served logits: ``out``, or a new array/tensor of the input's type, dtype and
        device. Rows at level 0 are bit-identical copies; a row at level j
        equals its level's Perturber on that row and id. Every row makes the
        draws of the policy's top level (the level changes which are added,
        not how many are made).

        Raises
        ------
        ValueError
            Wrong K, NaN, a value the noise could overflow, a level out of range,
            a row count other than the levels' or ids' (before any draw).
        """
        n_rows = int(logits.shape[0]) if len(logits.shape) == 2 else -1
        if n_rows < 0 or len(row_levels) != n_rows or len(row_ids) != n_rows:
            raise ValueError(f"need one level and one id per row: {len(row_levels)} levels and {len(row_ids)} ids "
                             f"for logits of shape {tuple(logits.shape)}")
        top = self.policy.top
        levels = [int(level) for level in row_levels]
        if any(not 0 <= level <= top for level in levels):
            raise ValueError(f"row levels must be in 0..{top}, got {sorted(set(levels))}")
        # LevelNoise serves runs of rows at one level, in row order: one pass over the batch as it is
        # (the fused kernel takes a level count per row), no reordering.
        segments, start = [], 0
        while start < n_rows:
            end = start + 1
            while end < n_rows and levels[end] == levels[start]:
                end += 1
            segments.append((levels[start], end - start))
            start = end
        return self.levels.serve(logits, list(row_ids), tuple(segments), shadow=False, out=out)
