"""What a score-returning API serves, computed from the *noisy* logits.

Every helper perturbs first (through a :class:`~caliber_core.serving.runtime.Perturber`)
and only then derives the served quantity, so probabilities, top-k
log-probabilities and LLM sampling scores all carry the calibrated noise.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..validation import is_torch
from .rows import row_shape
from .runtime import Perturber


def _check_perturber(perturber) -> None:
    if not isinstance(perturber, Perturber):
        raise TypeError(f"perturber must be a caliber_core.serving.runtime.Perturber, got {type(perturber).__name__}")


def _log_softmax64(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64; -inf entries (masked classes) stay -inf."""
    z = np.asarray(z, dtype=np.float64)
    top = np.max(z, axis=-1, keepdims=True)
    shifted = z - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def noisy_probabilities(perturber, logits, ids=None, *, temperature: float = 1.0):
    """Full score vector softmax((z + eps) / T) served for each row.

    Parameters
    ----------
    perturber : Perturber
    logits : ndarray or torch.Tensor of shape (n_samples, n_classes) or (n_classes,)
    ids : sequence of str/bytes, or one str/bytes for a single row
        Required for per-input seeding (see :meth:`Perturber.perturb`).
    temperature : float, default 1.0
        Softmax temperature T > 0, applied after the noise.

    Returns
    -------
    probabilities : same type, shape, dtype (and device) as ``logits``
        Rows sum to 1 (up to the output dtype's rounding).

    Notes
    -----
    Eq. ``logits-noise`` then the softmax of the paper's prediction rule.
    """
    _check_perturber(perturber)
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    noisy = perturber.perturb(logits, ids)
    if is_torch(noisy):
        import torch

        return torch.softmax(noisy.double() / float(temperature), dim=-1).to(noisy.dtype)
    return np.exp(_log_softmax64(np.asarray(noisy, dtype=np.float64) / float(temperature))).astype(noisy.dtype)


def noisy_top_logprobs(perturber, logits, ids=None, *, k: int = 5):
    """OpenAI-style ``top_logprobs``: the k most likely classes after the noise.

    Parameters
    ----------
    perturber : Perturber
    logits : ndarray or torch.Tensor of shape (n_samples, n_classes) or (n_classes,)
    ids : sequence of str/bytes, or one str/bytes for a single row
    k : int, default 5
        1 <= k <= n_classes.

    Returns
    -------
    top : list
        For 2-D logits, one list per row; for a single row (n_classes,), that
        row's list. Each list holds k ``(class_index, logprob)`` pairs (int,
        float) sorted by descending logprob, ties by ascending class index.
        Log-probabilities are a log-softmax over *all* K noisy logits, in
        float64, so they are the logs of :func:`noisy_probabilities`.
    """
    _check_perturber(perturber)
    _, n_classes, _ = row_shape(logits)  # k is checked before any noise is drawn
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= n_classes:
        raise ValueError(f"k must be an integer in [1, n_classes={n_classes}], got {k!r}")
    noisy = perturber.perturb(logits, ids)
    if is_torch(noisy):
        noisy = noisy.detach().cpu().double().numpy()
    rows = np.atleast_2d(np.asarray(noisy, dtype=np.float64))
    logprobs = _log_softmax64(rows)
    # Stable sort of -logprob: descending logprob, ties keep ascending index.
    order = np.argsort(-logprobs, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logprobs, order, axis=1)
    result = [list(zip(o.tolist(), t.tolist())) for o, t in zip(order, top)]
    return result[0] if np.ndim(noisy) == 1 else result


def token_ids_bytes(tokens) -> bytes:
    """Default id of a generation prefix: its token ids as little-endian int64 bytes.

    Parameters
    ----------
    tokens : array_like or torch.Tensor of shape (n_tokens,)
        Token ids (a tensor is copied to the host).

    Returns
    -------
    bytes
        8 bytes per token.
    """
    if is_torch(tokens):
        tokens = tokens.detach().cpu().numpy()
    return np.asarray(tokens).astype("<i8", copy=False).tobytes()


class LogitsProcessorAdapter:
    """Calibrated noise as a Hugging Face ``LogitsProcessor``.

    Follows the ``(input_ids, scores) -> scores`` convention of
    ``transformers.LogitsProcessor`` without importing transformers.

    Parameters
    ----------
    perturber : Perturber
    pad_token_id : int, optional
        The tokenizer's pad id. Leading pad tokens (left padding, what
        ``generate`` needs for decoder-only models) are not part of a row's
        id, so a prompt gets the same noise however its batch was padded.
    attention_mask : tensor (batch, prompt_len), optional
        The prompt's attention mask, as passed to ``generate``: positions it
        masks are left out of the id (any padding side). Its rows must match
        the score rows (no beams or several return sequences). Use one of
        ``pad_token_id`` and ``attention_mask``; without either, a padded
        batch gives its rows ids that depend on the padding.
    id_fn : callable, optional
        ``id_fn(unpadded_row) -> str | bytes`` naming the input a row of
        scores belongs to, given the row's token ids with the padding removed
        (a 1-D CPU tensor). Default: the tokens as little-endian int64 bytes,
        so the same prompt and prefix get the same noise (per-input seeding)
        in any batch or position, and each decoding step (a longer prefix)
        gets its own draw.

    Examples
    --------
    >>> adapter = LogitsProcessorAdapter(p, pad_token_id=tokenizer.pad_token_id)  # doctest: +SKIP
    >>> model.generate(**inputs, do_sample=True,                                  # doctest: +SKIP
    ...                logits_processor=LogitsProcessorList([adapter]))

    Notes
    -----
    Scores of -inf (tokens masked by earlier processors) stay -inf. The
    token ids come to the host once a step (the ids are hashed there); the
    scores and their noise stay on their device.
    """

    def __init__(self, perturber, *, pad_token_id: int | None = None, attention_mask=None, id_fn=None):
        _check_perturber(perturber)
        if id_fn is not None and not callable(id_fn):
            raise TypeError(f"id_fn must be callable, got {type(id_fn).__name__}")
        if pad_token_id is not None and (isinstance(pad_token_id, bool)
                                         or not isinstance(pad_token_id, numbers.Integral)):
            raise TypeError(f"pad_token_id must be an integer token id or None, got {pad_token_id!r}")
        if pad_token_id is not None and attention_mask is not None:
            raise ValueError("give pad_token_id or attention_mask, not both")
        mask = None
        if attention_mask is not None:
            mask = np.asarray(attention_mask.detach().cpu().numpy() if is_torch(attention_mask) else attention_mask)
            if mask.ndim != 2:
                raise ValueError(f"attention_mask must be (batch, prompt_len), got shape {mask.shape}")
            mask = mask.astype(bool)
        self.perturber = perturber
        self.pad_token_id = None if pad_token_id is None else int(pad_token_id)
        self.attention_mask = mask
        self.id_fn = id_fn

    def unpadded_rows(self, input_ids) -> list[np.ndarray]:
        """Each row's token ids without its padding (int64, on the host).

        Parameters
        ----------
        input_ids : torch.Tensor of shape (n_rows, length)
            What ``generate`` passes a logits processor.

        Returns
        -------
        list of ndarray, int64
            One per row: with an attention mask, the prompt's kept positions and
            every generated token; else, with a pad token, the row from its first
            non-pad position; else the row as is.

        Raises
        ------
        ValueError
            An attention mask that does not cover ``input_ids`` (other rows, or longer).
        """
        tokens = input_ids.detach().cpu().numpy().astype(np.int64, copy=False)
        if self.attention_mask is not None:
            mask = self.attention_mask
            if mask.shape[0] != tokens.shape[0] or mask.shape[1] > tokens.shape[1]:
                raise ValueError(f"attention_mask of shape {mask.shape} does not cover input_ids of shape "
                                 f"{tokens.shape}: give the prompt's mask, one row per score row")
            prompt_len = mask.shape[1]
            return [np.concatenate([row[:prompt_len][keep], row[prompt_len:]]) for row, keep in zip(tokens, mask)]
        if self.pad_token_id is not None:
            # The first non-pad position of each row (a row of only pads keeps nothing).
            not_pad = tokens != self.pad_token_id
            starts = np.where(not_pad.any(axis=1), not_pad.argmax(axis=1), tokens.shape[1])
            return [row[start:] for row, start in zip(tokens, starts.tolist())]
        return list(tokens)

    def __call__(self, input_ids, scores):
        if not (is_torch(input_ids) and is_torch(scores)):
            raise TypeError(
                f"input_ids and scores must be torch tensors, got "
                f"{type(input_ids).__name__} and {type(scores).__name__}"
            )
        if input_ids.dim() != 2 or scores.dim() != 2 or input_ids.shape[0] != scores.shape[0]:
            raise ValueError(
                f"expected input_ids (batch, seq_len) and scores (batch, vocab) with the same batch, "
                f"got {tuple(input_ids.shape)} and {tuple(scores.shape)}"
            )
        rows = self.unpadded_rows(input_ids)
        if self.id_fn is None:
            ids = [token_ids_bytes(row) for row in rows]
        else:
            import torch

            ids = [self.id_fn(torch.from_numpy(row)) for row in rows]
        return self.perturber.perturb(scores, ids)

    def __repr__(self) -> str:
        return f"LogitsProcessorAdapter({self.perturber!r}, pad_token_id={self.pad_token_id!r})"
