"""Knowledge distillation of a batch of students on (possibly noisy) answers.

Each student s minimizes the paper's Eq. 1 on its own training rows,

    L_s = T_s^2 * mean_i KL( softmax(a_i / T_s) || softmax(f_s(x_i) / T_s) ),

(the T^2 factor keeps gradient sizes comparable across temperatures, as in
Hinton et al.), with mini-batch Adam and an L2 penalty added to the gradient
(``torch.optim.Adam``'s ``weight_decay``). The KL and the cross-entropy
-sum p log q differ by the targets' entropy, a constant, so the gradient is
that of the cross-entropy. Hard labels are one-hot targets at T = 1 (plain
cross-entropy).

All students of a batch step together (one Python loop for S runs); each
has its own seed, mini-batch order, temperature, weight decay, training rows
and stopping time, and its result does not depend on the other students of
the batch. torch runs single-threaded (``torch.set_num_threads(1)``): on two
cores, two threads were measured slower and erratic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .schedule import Schedule
from .students import StudentBatch, StudentShape

_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8
_TARGET_ROWS = 4096


def tempered_targets(answers: np.ndarray, temperature: float, *, out: np.ndarray | None = None) -> np.ndarray:
    """softmax(answers / T) row by row, float32 (the targets of Eq. 1).

    Parameters
    ----------
    answers : ndarray of shape (n, K)
        Logits as answered.
    temperature : float
        T, finite and > 0.
    out : ndarray of shape (n, K), float32, optional
        Written in place (e.g. one student's slot of a batch's targets).

    Returns
    -------
    ndarray of shape (n, K), float32
        ``out`` when given.

    Raises
    ------
    ValueError
        A temperature that is not finite and > 0.
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    a = np.asarray(answers)
    if out is None:
        out = np.empty(a.shape, dtype=np.float32)
    elif out.shape != a.shape or out.dtype != np.float32:
        raise ValueError(f"out must be float32 of shape {a.shape}, got {out.dtype} {out.shape}")
    # Row blocks: the float64 work space stays small whatever the pool (each row is its own softmax).
    for start in range(0, a.shape[0], _TARGET_ROWS):
        z = np.asarray(a[start:start + _TARGET_ROWS], dtype=np.float64) / temperature
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        out[start:start + _TARGET_ROWS] = z
    return out


def one_hot(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Hard-label targets: one row per label, float32.

    Parameters
    ----------
    labels : ndarray of shape (n,), int
    n_classes : int

    Returns
    -------
    ndarray of shape (n, n_classes), float32
    """
    out = np.zeros((labels.shape[0], n_classes), dtype=np.float32)
    out[np.arange(labels.shape[0]), labels] = 1.0
    return out


def _row_stream(rows: np.ndarray, n_steps: int, batch_size: int, seed: int) -> np.ndarray:
    """n_steps * batch_size row indices: shuffled passes over ``rows``, one after another."""
    gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), 0xB47C])))
    need = n_steps * batch_size
    passes = -(-need // rows.size)
    return np.concatenate([gen.permutation(rows) for _ in range(passes)])[:need]


def distill(
    inputs: torch.Tensor,
    targets: Sequence[np.ndarray],
    *,
    shape: StudentShape,
    temperatures: Sequence[float],
    weight_decays: Sequence[float],
    seeds: Sequence[int],
    train_rows: Sequence[np.ndarray] | None = None,
    schedule: Schedule = Schedule(),
    on_epoch: Callable[[], None] | None = None,
) -> StudentBatch:
    """Train one student per target array, all in one batch.

    Parameters
    ----------
    inputs : Tensor of shape (n_samples, n_features), float32
        The thief's (standardized) query inputs, shared by every student.
    targets : sequence of S arrays of shape (n_samples, n_classes), or one (S, n_samples, n_classes) array
        Target probabilities per student (:func:`tempered_targets` or :func:`one_hot`);
        a float32 block is trained on in place, not copied.
    shape : StudentShape
    temperatures, weight_decays, seeds : sequences of length S
    train_rows : sequence of S int arrays, optional
        Rows each student trains on (default: all).
    schedule : Schedule
    on_epoch : callable, optional
        Called after each epoch of the longest-running student (progress).

    Returns
    -------
    StudentBatch
        The trained students, in the order of ``targets``.
    """
    n_jobs = len(targets)
    if not (len(temperatures) == len(weight_decays) == len(seeds) == n_jobs) or n_jobs == 0:
        raise ValueError(
            f"need one temperature, weight decay and seed per target array, got {len(temperatures)}, "
            f"{len(weight_decays)}, {len(seeds)} for {n_jobs} target arrays"
        )
    n_samples = inputs.shape[0]
    if train_rows is None:
        train_rows = [np.arange(n_samples)] * n_jobs
    bs = schedule.batch_size
    sizes = np.array([r.size for r in train_rows])
    if sizes.min() < 1:
        raise ValueError("every student needs at least one training row")
    steps_per_epoch = np.maximum(1, -(-sizes // bs))
    epochs = np.maximum(schedule.epochs, -(-schedule.min_steps // steps_per_epoch))
    budget = steps_per_epoch * epochs
    max_steps = int(budget.max())
    # Row streams as flat indices into the pool, one (max_steps, bs) block per student.
    streams = torch.from_numpy(np.stack([_row_stream(np.asarray(r), max_steps, bs, s)
                                         for r, s in zip(train_rows, seeds)]).reshape(n_jobs, max_steps, bs))
    # One (S, n, K) float32 block: a float32 ndarray block is used as it is (the thief
    # writes each student's targets into its slot), a list is copied in array by array.
    target_t = None
    # The targets' entropy turns the cross-entropy into the KL of Eq. 1; the
    # stopping rule needs the KL (at large T the entropy dwarfs it).
    entropy = torch.empty((n_jobs, n_samples), dtype=torch.float32)
    if isinstance(targets, np.ndarray) and targets.dtype == np.float32 and targets.ndim == 3:
        target_t = torch.from_numpy(targets)  # already one block: no copy
    for j in range(n_jobs):
        t = torch.from_numpy(np.asarray(targets[j], dtype=np.float32))
        if target_t is None:
            target_t = torch.empty((n_jobs,) + tuple(t.shape), dtype=torch.float32)
        if t.data_ptr() != target_t[j].data_ptr():
            target_t[j] = t
        entropy[j] = -(t * torch.log(t.clamp_min(1e-30))).sum(dim=1)
        del t
    n_classes = target_t.shape[2]
    temp = torch.tensor(np.asarray(temperatures, dtype=np.float32)).view(n_jobs, 1, 1)
    decay = torch.tensor(np.asarray(weight_decays, dtype=np.float32)).view(n_jobs, 1, 1)
    students = StudentBatch(shape, seeds)
    final = [p.detach().clone() for p in students.params]
    # The live batch: students still training, compacted whenever some stop,
    # so a stopped student costs nothing. Every live student has taken the
    # same number of Adam steps, so the bias corrections are scalars.
    live = np.arange(n_jobs)
    params = [p.detach().clone().requires_grad_(True) for p in students.params]
    m1 = [torch.zeros_like(p) for p in params]
    m2 = [torch.zeros_like(p) for p in params]
    flat_targets = target_t.reshape(n_jobs * n_samples, n_classes)
    flat_entropy = entropy.reshape(n_jobs * n_samples)
    offsets = (torch.arange(n_jobs) * n_samples).view(n_jobs, 1)
    epoch_loss = np.zeros(n_jobs)
    best = np.full(n_jobs, np.inf)
    stale = np.zeros(n_jobs, dtype=np.int64)
    lr = schedule.learning_rate
    longest = int(steps_per_epoch.max())
    n_features = inputs.shape[1]

    taken = np.zeros(n_jobs, dtype=np.int64)

    def compact(keep: np.ndarray) -> None:
        nonlocal live, params, m1, m2
        for k, p in enumerate(params):
            final[k][torch.from_numpy(live[~keep])] = p.detach()[torch.from_numpy(~keep)]
        sel = torch.from_numpy(np.nonzero(keep)[0])
        params = [p.detach().index_select(0, sel).requires_grad_(True) for p in params]
        m1 = [a.index_select(0, sel) for a in m1]
        m2 = [b.index_select(0, sel) for b in m2]
        live = live[keep]

    for step in range(max_steps):
        n_live = live.size
        sel = torch.from_numpy(live)
        idx = streams[sel, step, :]  # (n_live, bs)
        flat = idx.reshape(-1)
        xb = inputs.index_select(0, flat).view(n_live, bs, n_features)
        cell = (idx + offsets[sel]).reshape(-1)
        pb = flat_targets.index_select(0, cell).view(n_live, bs, n_classes)
        t_live = temp[sel]
        t_sq = (t_live * t_live).view(n_live)
        logq = torch.log_softmax(_forward(params, xb) / t_live, dim=2)
        per_job = -(pb * logq).sum(dim=2).mean(dim=1) * t_sq
        kl = per_job.detach() - flat_entropy.index_select(0, cell).view(n_live, bs).mean(dim=1) * t_sq
        torch.autograd.backward(per_job.sum(), inputs=params)
        k_step = step + 1
        corr1 = 1.0 - _BETA1 ** k_step
        corr2_sqrt = math.sqrt(1.0 - _BETA2 ** k_step)
        d_live = decay[sel]
        with torch.no_grad():
            for p, a, b in zip(params, m1, m2):
                g = p.grad
                g.addcmul_(p, d_live)
                a.lerp_(g, 1.0 - _BETA1)
                b.mul_(_BETA2).addcmul_(g, g, value=1.0 - _BETA2)
                denom = b.sqrt().div_(corr2_sqrt).add_(_EPS)
                p.addcdiv_(a, denom, value=-lr / corr1)
                p.grad = None
        epoch_loss[live] += kl.numpy()
        taken[live] = k_step
        keep = np.ones(n_live, dtype=bool)
        for pos, j in enumerate(live):
            if k_step % steps_per_epoch[j] == 0:
                mean = epoch_loss[j] / steps_per_epoch[j]
                epoch_loss[j] = 0.0
                if mean < best[j] * (1.0 - schedule.tolerance):
                    best[j], stale[j] = mean, 0
                else:
                    stale[j] += 1
                    if stale[j] >= schedule.patience:
                        keep[pos] = False
            if k_step >= budget[j]:
                keep[pos] = False
        if on_epoch is not None and k_step % longest == 0:
            on_epoch()
        if not keep.all():
            compact(keep)
        if live.size == 0:
            break
    if live.size:
        compact(np.zeros(live.size, dtype=bool))
    students.params = [p.requires_grad_(False) for p in final]
    students.steps = taken
    return students


def _forward(params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits of a stacked batch of students (see :meth:`StudentBatch.forward`)."""
    out = x
    n_layers = len(params) // 2
    for layer in range(n_layers):
        out = torch.baddbmm(params[2 * layer + 1], out, params[2 * layer])
        if layer < n_layers - 1:
            out = torch.relu(out)
    return out
