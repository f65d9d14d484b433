"""SYNTHETIC logits for scale tests and benchmarks: no classifier, no data set.

Real calibration data are cached logits of real models (``data/digits_*.npz``).
This module only fakes their *geometry* at sizes the bundled models do not
reach (ImageNet-like: tens of thousands of rows, a thousand classes), so that
sweeps, fits and the dashboard can be timed and stress-tested. Never report
numbers computed on it as properties of a model.
"""

from __future__ import annotations

import numpy as np

#: Rows generated per chunk. Each chunk draws from its own child generator
#: (``rng.spawn``), so a row depends only on ``seed`` and its index: the first
#: rows of a large request equal a smaller request with the same seed.
CHUNK_ROWS = 1024

#: Fraction of misclassified rows whose true label is the runner-up logit.
NEAR_MISS_FRACTION = 0.5

# Margin law, in units of the row's background scale. Correct rows get larger,
# more spread top-two margins than misclassified ones, as in trained models.
_CORRECT_MARGIN_SHAPE, _CORRECT_MARGIN_SCALE = 1.5, 1.5  # Gamma: median ~1.8
_WRONG_MARGIN_SHAPE, _WRONG_MARGIN_SCALE = 1.0, 0.6  # exponential: median ~0.4
_ROW_SCALE_LOG_SD = 0.25  # background std varies ~25% between rows
_ROW_OFFSET_SD = 1.0  # logits are shift invariant; real rows still have offsets
_MIN_MARGIN = 1e-3  # keeps the intended argmax strict after casting to float32


def make_synthetic_logits(
    n_samples: int,
    n_classes: int,
    *,
    clean_accuracy: float = 0.75,
    seed: int = 0,
    dtype=np.float32,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw SYNTHETIC logits with ImageNet-like top-two geometry.

    Each row ``i`` gets a true label ``y_i`` (uniform over classes) and is
    correct with probability ``clean_accuracy``. Its logits are a Gaussian
    background ``offset_i + s_i * N(0, 1)`` with a per-row scale ``s_i``
    (log-normal around 1); the predicted class ``c_i`` (``y_i`` if correct,
    otherwise uniform over the other classes) is then set to the largest other
    logit plus a margin ``s_i * g_i``, where ``g_i`` is Gamma-distributed
    (median about 1.8 for correct rows, about 0.4 for misclassified rows). For
    half of the misclassified rows the true label is lifted to runner-up.

    Parameters
    ----------
    n_samples : int
        Number of rows, >= 1.
    n_classes : int
        Number of classes K, >= 2.
    clean_accuracy : float, default 0.75
        Expected fraction of rows whose argmax equals the label, in (0, 1].
        The realized accuracy is Binomial(n_samples, clean_accuracy) / n_samples.
    seed : int, default 0
        Seed for ``np.random.default_rng``; the output is a deterministic
        function of ``(seed, row index)``.
    dtype : floating dtype, default np.float32
        dtype of the returned logits. The generation is float64 per chunk;
        only one chunk of ``CHUNK_ROWS x n_classes`` temporaries exists at a time.

    Returns
    -------
    logits : ndarray of shape (n_samples, n_classes), dtype ``dtype``
        Synthetic logits; the top-two margin is exactly the drawn margin (up to
        rounding) and never below about 1e-3, so argmax is unambiguous in float32.
    labels : ndarray of shape (n_samples,), int64
        The synthetic true labels, in [0, n_classes).

    Raises
    ------
    ValueError
        ``n_samples < 1``, ``n_classes < 2``, ``clean_accuracy`` outside (0, 1],
        or a non-floating ``dtype``.

    Notes
    -----
    SYNTHETIC: no model produced these numbers. They exercise the margin
    normalization v = sigma^2 / S^2 (Eq. ``normalized-noise``) on a spread
    margin distribution, not any real classifier's behaviour.
    """
    n_samples = _as_count(n_samples, "n_samples", minimum=1)
    n_classes = _as_count(n_classes, "n_classes", minimum=2)
    try:
        accuracy = float(clean_accuracy)
    except (TypeError, ValueError):
        raise ValueError(
            f"clean_accuracy must be a number in (0, 1], got {clean_accuracy!r}"
        ) from None
    if not 0.0 < accuracy <= 1.0:  # also rejects NaN
        raise ValueError(f"clean_accuracy must be in (0, 1], got {clean_accuracy!r}")
    out_dtype = np.dtype(dtype)
    if not np.issubdtype(out_dtype, np.floating):
        raise ValueError(f"dtype must be a floating dtype, got {out_dtype}")

    logits = np.empty((n_samples, n_classes), dtype=out_dtype)
    labels = np.empty(n_samples, dtype=np.int64)
    n_chunks = -(-n_samples // CHUNK_ROWS)
    children = np.random.default_rng(seed).spawn(n_chunks)
    for k, rng in enumerate(children):
        start = k * CHUNK_ROWS
        stop = min(start + CHUNK_ROWS, n_samples)
        # Always draw a full chunk so a row never depends on n_samples.
        z, y = _draw_chunk(rng, CHUNK_ROWS, n_classes, accuracy)
        logits[start:stop] = z[: stop - start]
        labels[start:stop] = y[: stop - start]
    return logits, labels


def _as_count(value, name: str, *, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _draw_chunk(
    rng: np.random.Generator, n_rows: int, n_classes: int, accuracy: float
) -> tuple[np.ndarray, np.ndarray]:
    """One chunk of rows, float64; see :func:`make_synthetic_logits` for the model."""
    rows = np.arange(n_rows)
    labels = rng.integers(0, n_classes, size=n_rows, dtype=np.int64)
    correct = rng.random(n_rows) < accuracy
    # A wrong prediction is uniform over the K - 1 other classes.
    shift = rng.integers(1, n_classes, size=n_rows)
    predicted = np.where(correct, labels, (labels + shift) % n_classes)
    near_miss = ~correct & (rng.random(n_rows) < NEAR_MISS_FRACTION)
    row_scale = np.exp(_ROW_SCALE_LOG_SD * rng.standard_normal(n_rows))
    row_offset = _ROW_OFFSET_SD * rng.standard_normal(n_rows)
    gap = np.where(
        correct,
        rng.gamma(_CORRECT_MARGIN_SHAPE, _CORRECT_MARGIN_SCALE, size=n_rows),
        rng.gamma(_WRONG_MARGIN_SHAPE, _WRONG_MARGIN_SCALE, size=n_rows),
    )
    margin = np.maximum(row_scale * gap, _MIN_MARGIN)
    runner_up_gap = row_scale * rng.exponential(0.1, size=n_rows)

    z = rng.standard_normal((n_rows, n_classes))
    z *= row_scale[:, None]
    # Near misses: the true label just above every class but the prediction.
    z[rows, predicted] = -np.inf
    others_max = z.max(axis=1)
    z[rows[near_miss], labels[near_miss]] = others_max[near_miss] + runner_up_gap[near_miss]
    others_max = z.max(axis=1)
    z[rows, predicted] = others_max + margin
    z += row_offset[:, None]
    return z, labels
