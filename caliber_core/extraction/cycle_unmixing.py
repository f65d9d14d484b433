"""A thief who knows the class-cycle design: it estimates the cycle from its answers and subtracts the push.

The served class cycle (:class:`~caliber_core.serving.class_cycle_noise.ClassCycleNoise`)
adds a_c (z_c - mean z)+ to class pi(c). Its key, its amplitudes and sigma are
secret, but its shape shows in the answers: among answers whose top class is c,
class pi(c) stands out as the runner-up. A label-free thief who knows the design

1. estimates pi(c) as the most frequent runner-up of the answers topped by c;
2. estimates the push b_c = sigma a_c as the median, over those answers, of
   (u_{pi(c)} - median of the other classes) / (u_c - mean u), clipped at 0:
   on clean logits the runner-up stands near the other classes on average;
3. answers itself u - b_c (u_c - mean u)+ on class pi(c), for every c, and
   distills from that.

Nothing here uses labels or the key. Against other designs the estimate is
noise, and the thief keeps whichever of its surrogates is best.
"""

from __future__ import annotations

import numpy as np


def estimate_cycle(answers) -> tuple[np.ndarray, np.ndarray]:
    """(pi_hat, push_hat): the estimated successor of every class and its push (0 where a class never tops).

    Parameters
    ----------
    answers : ndarray of shape (n_samples, n_classes)
        The served logits the thief received.
    """
    u = np.asarray(answers, dtype=np.float64)
    if u.ndim != 2 or u.shape[1] < 3:
        raise ValueError(f"answers must be (n_samples, n_classes) with at least 3 classes, got shape {u.shape}")
    k = u.shape[1]
    centred = u - u.mean(axis=1, keepdims=True)
    order = np.argsort(u, axis=1)
    top, second = order[:, -1], order[:, -2]
    successor = np.arange(k)
    push = np.zeros(k)
    for c in range(k):
        rows = np.flatnonzero(top == c)
        if rows.size < 3:
            continue
        nxt = int(np.bincount(second[rows], minlength=k).argmax())
        others = np.delete(centred[rows], [c, nxt], axis=1)
        lift = centred[rows, nxt] - np.median(others, axis=1)
        scale = np.maximum(centred[rows, c], 1e-12)
        successor[c], push[c] = nxt, max(float(np.median(lift / scale)), 0.0)
    return successor, push


def unmixed(answers) -> np.ndarray:
    """The answers with the estimated cycle's push subtracted (see the module docstring).

    Parameters
    ----------
    answers : array_like of shape (n_queries, n_classes)
        Answers served with class-cycle noise.

    Returns
    -------
    ndarray of shape (n_queries, n_classes), float64
    """
    u = np.asarray(answers, dtype=np.float64)
    successor, push = estimate_cycle(u)
    source = np.maximum(u - u.mean(axis=1, keepdims=True), 0.0)
    out = u.copy()
    for c in range(u.shape[1]):
        if push[c] > 0:
            out[:, successor[c]] -= push[c] * source[:, c]
    return out
