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
        leading axis solves several surrogates at once, in lockstep
        (:func:`lockstep_biases`).
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
    z = np.asarray(logits)
    if z.ndim not in (2, 3) or z.shape[-1] < 2 or z.shape[-2] < 1:
        raise ValueError(f"logits must be (n_samples, n_classes) with 2+ classes, got shape {z.shape}")
    batch = z if z.ndim == 3 else z[None]
    out = lockstep_biases(lambda j: batch[j], batch.shape[0], prior=prior, iterations=iterations,
                          tolerance=tolerance)
    return out if z.ndim == 3 else out[0]


def lockstep_biases(pool_logits_of, n_students: int, *, prior=None, iterations: int = DEFAULT_ITERATIONS,
                    tolerance: float = 1e-6) -> np.ndarray:
    """:func:`prior_matching_bias` of several surrogates, one surrogate's pool logits in memory at a time.

    The surrogates step in lockstep: every one takes the same number of
    fixed-point steps, the first step count at which *all* of them are within
    ``tolerance`` of the prior (or ``iterations``). Each surrogate's path is
    computed on its own and its biases kept at every step, so only one
    (n_pool, K) float64 matrix is held; a surrogate whose path must go further
    than first computed has its logits asked for again.

    Parameters
    ----------
    pool_logits_of : callable
        ``pool_logits_of(j)``: surrogate j's logits on the pool, shape (n_pool, K);
        equal values on every call.
    n_students : int
    prior, iterations, tolerance
        As :func:`prior_matching_bias`.

    Returns
    -------
    ndarray of shape (n_students, K), float64, each row of mean zero.
    """
    paths = [_Path(pool_logits_of, j) for j in range(int(n_students))]
    if not paths:
        raise ValueError("need at least one surrogate, got none")
    k = paths[0].load()
    p = np.full(k, 1.0 / k) if prior is None else np.asarray(prior, dtype=np.float64)
    if p.shape != (k,) or (p <= 0).any() or not np.isclose(p.sum(), 1.0):
        raise ValueError(f"prior must be {k} positive frequencies summing to 1, got {p!r}")
    log_p = np.log(p)
    limit = int(iterations)
    steps = 0
    moved = True
    while moved and steps < limit:
        moved = False
        for path in paths:
            first = path.first_within(steps, p, log_p, tolerance, limit)
            if first > steps:
                steps, moved = first, True
        # A pass that moved no surrogate's stop found every one within tolerance at `steps`.
    for path in paths:
        path.extend_to(steps, p, log_p, limit)
    return np.stack([path.biases[steps][0] for path in paths])


#: Rows of one block of a fixed-point step: its float64 softmax holds about 4 MiB, not (n_pool, K).
BLOCK_BYTES = 4 << 20


class _Path:
    """One surrogate's fixed-point path: its bias after t steps and its error before step t.

    The pool logits are held as given (float32 from a student); each step makes the
    float64 softmax a block of rows at a time and adds the blocks' column sums in row
    order, so it matches the whole-matrix computation bit for bit (numpy sums a column
    over rows one row after another).
    """

    def __init__(self, pool_logits_of, j: int):
        self._of, self._j = pool_logits_of, j
        self._logits: np.ndarray | None = None
        self.biases: list[np.ndarray] = []
        self.errors: list[float] = []

    def load(self) -> int:
        """Hold this surrogate's pool logits; return K."""
        z = np.asarray(self._of(self._j))
        if z.ndim != 2 or z.shape[-1] < 2 or z.shape[0] < 1:
            raise ValueError(f"logits must be (n_samples, n_classes) with 2+ classes, got shape {z.shape}")
        self._logits = z
        if not self.biases:
            self.biases.append(np.zeros((1, z.shape[1])))
        return z.shape[1]

    def _step(self, p, log_p) -> None:
        """The error at the last bias, and the next bias (kept for later)."""
        if self._logits is None:
            self.load()
        z, bias = self._logits, self.biases[-1]
        n, k = z.shape
        rows = max(1, BLOCK_BYTES // (8 * k))
        # Row 0 of the buffer carries the running column sums, so that summing the buffer over rows
        # continues the one sequence of additions the whole matrix's sum would make.
        buf = np.empty((min(n, rows) + 1, k))
        total = None
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            s = buf[1 : stop - start + 1]
            s[...] = z[start:stop]  # float64, each row's max subtracted (as the former shifted matrix)
            s -= s.max(axis=1, keepdims=True)
            s += bias
            s -= s.max(axis=1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=1, keepdims=True)
            if total is None:
                total = s.sum(axis=0, keepdims=True)
            else:
                buf[0] = total
                total = buf[: stop - start + 1].sum(axis=0, keepdims=True)
        freq = total / n
        self.errors.append(float(np.max(np.abs(freq - p))))
        nxt = bias + (log_p - np.log(np.maximum(freq, 1e-300)))
        nxt -= nxt.mean(axis=1, keepdims=True)
        self.biases.append(nxt)

    def first_within(self, start: int, p, log_p, tolerance: float, limit: int) -> int:
        """The first step count t >= start whose error is below tolerance (``limit`` if none)."""
        t = start
        while t < limit:
            while len(self.errors) <= t:
                self._step(p, log_p)
            if self.errors[t] < tolerance:
                break
            t += 1
        self._logits = None  # the next surrogate's matrix takes its place
        return t

    def extend_to(self, steps: int, p, log_p, limit: int) -> None:
        while len(self.biases) <= steps:
            self._step(p, log_p)
        self._logits = None


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
    pool = np.asarray(pool_logits)
    ev = np.asarray(eval_logits, dtype=np.float64)
    bias = prior_matching_bias(pool, prior=prior)  # one surrogate's float64 copy at a time
    if pool.ndim == 2:
        return np.argmax(ev + bias, axis=1)
    return np.argmax(ev + bias[:, None, :], axis=2)
