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
    noisy = perturber.perturb(logits, ids)
    if is_torch(noisy):
        noisy = noisy.detach().cpu().double().numpy()
    rows = np.atleast_2d(np.asarray(noisy, dtype=np.float64))
    n_classes = rows.shape[1]
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= n_classes:
        raise ValueError(f"k must be an integer in [1, n_classes={n_classes}], got {k!r}")
    logprobs = _log_softmax64(rows)
    # Stable sort of -logprob: descending logprob, ties keep ascending index.
    order = np.argsort(-logprobs, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logprobs, order, axis=1)
    result = [list(zip(o.tolist(), t.tolist())) for o, t in zip(order, top)]
    return result[0] if np.ndim(noisy) == 1 else result


def _token_ids_bytes(input_ids_row) -> bytes:
    """Default id of a generation prefix: its token ids as little-endian int64 bytes."""
    return input_ids_row.detach().cpu().numpy().astype("<i8", copy=False).tobytes()


class LogitsProcessorAdapter:
    """Calibrated noise as a Hugging Face ``LogitsProcessor``.

    Follows the ``(input_ids, scores) -> scores`` convention of
    ``transformers.LogitsProcessor`` without importing transformers.

    Parameters
    ----------
    perturber : Perturber
    id_fn : callable, optional
        ``id_fn(input_ids_row) -> str | bytes`` naming the input a row of
        scores belongs to. Default: the prefix's token ids as little-endian
        int64 bytes, so the same prompt and prefix always get the same noise
        (per-input seeding) whatever batch or position they arrive in, and
        each decoding step (a longer prefix) gets its own draw.

    Examples
    --------
    >>> from transformers import LogitsProcessorList               # doctest: +SKIP
    >>> p = Perturber(0.8, key=b"provider secret")                  # doctest: +SKIP
    >>> model.generate(**inputs, do_sample=True,                    # doctest: +SKIP
    ...                logits_processor=LogitsProcessorList([LogitsProcessorAdapter(p)]))

    Notes
    -----
    Scores of -inf (tokens masked by earlier processors) stay -inf.
    """

    def __init__(self, perturber, *, id_fn=None):
        _check_perturber(perturber)
        if id_fn is not None and not callable(id_fn):
            raise TypeError(f"id_fn must be callable, got {type(id_fn).__name__}")
        self.perturber = perturber
        self.id_fn = _token_ids_bytes if id_fn is None else id_fn

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
        ids = [self.id_fn(row) for row in input_ids]
        return self.perturber.perturb(scores, ids)

    def __repr__(self) -> str:
        return f"LogitsProcessorAdapter({self.perturber!r})"
