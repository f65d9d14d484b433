"""Top-two logit margins, the margin scale S, and the normalized axes.

The paper normalizes noise by the model's margin scale, v = sigma^2 / S^2
(Eq. ``normalized-noise``), and utility by its operating range,
A~ = (A - 1/K) / (A0 - 1/K) (Eq. ``util-norm``).
"""

from __future__ import annotations

import numpy as np

from ..top_two import top_two_margins  # noqa: F401  (handed on: margins are this module's concept)
from ..validation import as_labels, as_logits

MARGIN_STATISTICS = ("median", "mean", "trimmed")
TRIM_FRACTION = 0.10  # the paper's 10%-trimmed mean


def margin_scale(logits, *, statistic: str = "median") -> float:
    """The model-level margin scale S (median by default, as in the paper).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    statistic : {"median", "mean", "trimmed"}, default "median"
        "trimmed" is the 10%-trimmed mean (10% cut from each end).

    Raises
    ------
    ValueError
        Unknown statistic, or S == 0 (most rows tie at the top), where
        v = sigma^2 / S^2 is undefined.
    """
    return scale_from_margins(top_two_margins(logits), statistic=statistic)


def scale_from_margins(margins, *, statistic: str = "median") -> float:
    """S from precomputed top-two margins; see :func:`margin_scale`.

    Parameters
    ----------
    margins : array_like of float, shape (n_samples,)
        Top-two margins z_(1) - z_(2), one per row.
    statistic : {"median", "mean", "trimmed"}, default "median"
        "trimmed" cuts int(0.1 N) margins from each end before averaging.

    Returns
    -------
    float
        The margin scale S (> 0).

    Raises
    ------
    ValueError
        Unknown statistic, or S <= 0 (most rows tie at the top logit).

    Notes
    -----
    S is the denominator of Eq. ``normalized-noise``.
    """
    m = np.asarray(margins, dtype=np.float64)
    if statistic == "median":
        s = float(np.median(m))
    elif statistic == "mean":
        s = float(np.mean(m))
    elif statistic == "trimmed":
        # As scipy.stats.trim_mean (int(0.1 N) cut from each end), without its import cost.
        cut = int(TRIM_FRACTION * m.size)
        s = float(np.mean(np.sort(m)[cut : m.size - cut]))
    else:
        raise ValueError(f"statistic must be one of {MARGIN_STATISTICS}, got {statistic!r}")
    if not s > 0:
        tied = float(np.mean(m == 0))
        raise ValueError(
            f"margin scale S={s:g} ({statistic}) is not positive: "
            f"{tied:.0%} of rows tie at the top logit"
        )
    return s


def all_scales(logits) -> dict[str, float]:
    """S under every supported statistic (the paper's margin ablation).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)

    Returns
    -------
    dict of str to float
        One entry per name in ``MARGIN_STATISTICS``; NaN where that S is not positive.

    Raises
    ------
    ValueError
        If ``logits`` is not a valid 2-D logit array (from the validation).
    """
    m = top_two_margins(logits)
    out = {}
    for stat in MARGIN_STATISTICS:
        try:
            out[stat] = scale_from_margins(m, statistic=stat)
        except ValueError:
            out[stat] = float("nan")
    return out


def clean_accuracy(logits, labels) -> float:
    """A0: top-1 accuracy of the noise-free logits (ties go to the lowest index).

    Parameters
    ----------
    logits : array_like of shape (n_samples, n_classes)
    labels : array_like of int, shape (n_samples,)
        True classes in [0, n_classes).

    Returns
    -------
    float
        Fraction of rows whose argmax equals the label.

    Raises
    ------
    ValueError
        Malformed logits, or labels of the wrong length or out of range.
    """
    z = as_logits(logits)
    y = as_labels(labels, n_samples=z.shape[0], n_classes=z.shape[1])
    return float(np.mean(np.argmax(z, axis=1) == y))


def chance_level(n_classes: int) -> float:
    """A_rand = 1/K, the accuracy of a uniform guess.

    Parameters
    ----------
    n_classes : int
        K, at least 2.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``n_classes < 2``.

    Notes
    -----
    The chance term of Eq. ``util-norm``.
    """
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes}")
    return 1.0 / n_classes


def normalized_noise(sigma, scale: float):
    """Normalized noise intensity v = sigma^2 / S^2.

    Parameters
    ----------
    sigma : float or array_like of float
        Noise standard deviations, each >= 0.
    scale : float
        The margin scale S (> 0).

    Returns
    -------
    float or ndarray
        v, shaped like ``sigma``.

    Raises
    ------
    ValueError
        If ``scale`` is not positive or any sigma is negative.

    Notes
    -----
    Eq. ``normalized-noise``.
    """
    if not scale > 0:
        raise ValueError(f"scale S must be positive, got {scale}")
    s = np.asarray(sigma, dtype=np.float64)
    if np.any(s < 0):
        raise ValueError(f"sigma must be >= 0, got {s.min()}")
    return np.square(s) / scale**2


def sigma_from_v(v, scale: float):
    """sigma = S sqrt(v), the inverse of :func:`normalized_noise`.

    Parameters
    ----------
    v : float or array_like of float
        Normalized intensities, each >= 0.
    scale : float
        The margin scale S (> 0).

    Returns
    -------
    float or ndarray
        sigma, shaped like ``v``.

    Raises
    ------
    ValueError
        If ``scale`` is not positive or any v is negative.

    Notes
    -----
    Eq. ``normalized-noise`` solved for sigma (the right half of Eq. ``inverse-v``).
    """
    if not scale > 0:
        raise ValueError(f"scale S must be positive, got {scale}")
    v = np.asarray(v, dtype=np.float64)
    if np.any(v < 0):
        raise ValueError(f"v must be >= 0, got {v.min()}")
    return scale * np.sqrt(v)


def normalized_utility(accuracy, *, clean: float, n_classes: int):
    """Normalized utility A~ = (A - 1/K) / (A0 - 1/K).

    Parameters
    ----------
    accuracy : float or array_like of float
        Accuracies A under noise.
    clean : float
        The clean accuracy A0.
    n_classes : int
        K, at least 2.

    Returns
    -------
    float or ndarray
        A~, shaped like ``accuracy`` (1 at A0, 0 at chance; not clipped).

    Raises
    ------
    ValueError
        If ``n_classes < 2`` or A0 <= 1/K (no operating range to normalize by).

    Notes
    -----
    Eq. ``util-norm``.
    """
    chance = chance_level(n_classes)
    if not clean > chance:
        raise ValueError(
            f"clean accuracy A0={clean:.4g} is not above chance 1/K={chance:.4g}; "
            "utility cannot be normalized"
        )
    return (np.asarray(accuracy, dtype=np.float64) - chance) / (clean - chance)


def accuracy_from_normalized(utility, *, clean: float, n_classes: int):
    """A = 1/K + A~ (A0 - 1/K), the inverse of :func:`normalized_utility`.

    Parameters
    ----------
    utility : float or array_like of float
        Normalized utilities A~.
    clean : float
        The clean accuracy A0.
    n_classes : int
        K, at least 2.

    Returns
    -------
    ndarray
        Accuracies, shaped like ``utility``.

    Raises
    ------
    ValueError
        If ``n_classes < 2``.

    Notes
    -----
    Eq. ``util-norm`` solved for A.
    """
    chance = chance_level(n_classes)
    return chance + np.asarray(utility, dtype=np.float64) * (clean - chance)
