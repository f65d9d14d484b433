"""Prior correction: the thief shifts its surrogate's class biases until its class frequencies match a prior.

Noise that is a fixed function of the logits can carry a class bias on the
data (one class pushed up on average). A thief who knows the classes are
balanced removes it after training, with no labels: it estimates the
surrogate's class frequencies on its own query pool and moves each class's
bias until they match the prior. This is the EM prior adjustment of
Saerens, Latinne and Decaestecker (Neural Computation 14(1), 2002), run to
the fixed point

    b_k <- b_k + log(prior_k) - log(mean_i softmax(f(x_i) + b)_k),

on the pool's surrogate logits. The corrected surrogate predicts
argmax(f(x) + b).
"""

from __future__ import annotations

import numpy as np

DEFAULT_ITERATIONS = 200


def prior_matching_bias(logits, *, prior=None, iterations: int = DEFAULT_ITERATIONS,
                        tolerance: float = 1e-6) -> np.ndarray:
    """The class biases b that make mean_i softmax(logits_i + b) equal ``prior``.

    Parameters
    ----------
    logits : ndarray of shape (n_samples, n_classes), or (n_students, n_samples, n_classes)
        The surrogate's logits on the thief's (unlabelled) query pool; a
        leading axis solves several surrogates at once.
    prior : ndarray of shape (n_classes,), optional
        Target class frequencies (default: uniform).
    iterations : int
        Fixed-point steps at most.
    tolerance : float
        Stop once no class frequency is off by more than this.

    Returns
    -------
    bias : ndarray of shape (n_classes,) (or (n_students, n_classes)), float64, mean zero.
    """
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim not in (2, 3) or z.shape[-1] < 2 or z.shape[-2] < 1:
        raise ValueError(f"logits must be (n_samples, n_classes) with 2+ classes, got shape {z.shape}")
    batch = z if z.ndim == 3 else z[None]
    k = z.shape[-1]
    p = np.full(k, 1.0 / k) if prior is None else np.asarray(prior, dtype=np.float64)
    if p.shape != (k,) or (p <= 0).any() or not np.isclose(p.sum(), 1.0):
        raise ValueError(f"prior must be {k} positive frequencies summing to 1, got {p!r}")
    bias = np.zeros((batch.shape[0], 1, k))
    log_p = np.log(p)
    shifted = batch - batch.max(axis=2, keepdims=True)
    for _ in range(int(iterations)):
        s = shifted + bias
        s -= s.max(axis=2, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=2, keepdims=True)
        freq = s.mean(axis=1, keepdims=True)
        if np.max(np.abs(freq - p)) < tolerance:
            break
        bias += log_p - np.log(np.maximum(freq, 1e-300))
        bias -= bias.mean(axis=2, keepdims=True)
    out = bias[:, 0, :]
    return out if z.ndim == 3 else out[0]


def corrected_predictions(pool_logits, eval_logits, *, prior=None) -> np.ndarray:
    """argmax of the evaluation logits after the bias fitted on the pool (a batch of students: leading axis).

    Parameters
    ----------
    pool_logits : array_like of shape (n_pool, K) or (n_students, n_pool, K)
        The surrogate's logits on the pool, where the bias is fitted.
    eval_logits : array_like of shape (n_eval, K) or (n_students, n_eval, K)
        The surrogate's logits on the evaluation split.
    prior : array_like of shape (K,), optional
        The class prior to match (default: :func:`prior_matching_bias`'s).

    Returns
    -------
    ndarray of int, shape (n_eval,) or (n_students, n_eval)
    """
    pool = np.asarray(pool_logits, dtype=np.float64)
    ev = np.asarray(eval_logits, dtype=np.float64)
    bias = prior_matching_bias(pool, prior=prior)
    if pool.ndim == 2:
        return np.argmax(ev + bias, axis=1)
    return np.argmax(ev + bias[:, None, :], axis=2)
