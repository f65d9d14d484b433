"""Label recalibration: a thief with a few labelled inputs refits the last layer's mixing of its surrogate.

Noise that is a smooth function of the logits is, over a class's region,
close to an affine map of them, z -> z + sigma (a + B z). A thief who has a
handful of labelled inputs (10 per class here) can undo an affine
distortion of its surrogate's logits by *matrix scaling*, the post-hoc
calibration of Guo et al. (ICML 2017, "On calibration of modern neural
networks"): fit W, b minimizing the cross-entropy of softmax(f(x) W + b) on
the labelled rows, with a penalty ``strength * |W - I|^2`` that keeps it
near the identity when labels are few. Against per-input noise it gains
little (the surrogate already averages that noise away); against consistent
noise of long length scale it is the natural adaptive attack.
"""

from __future__ import annotations

import numpy as np
import torch

DEFAULT_PER_CLASS = 10
DEFAULT_STRENGTH = 1e-2
_STEPS = 300


def labelled_rows(labels, *, per_class: int = DEFAULT_PER_CLASS, seed: int = 0) -> np.ndarray:
    """``per_class`` pool rows of each class (fewer where a class has fewer), drawn with ``seed``; sorted.

    Parameters
    ----------
    labels : array_like of shape (n,)
    per_class : int, default ``DEFAULT_PER_CLASS``
    seed : int, default 0

    Returns
    -------
    ndarray of int

    Raises
    ------
    ValueError
        ``per_class`` not a positive integer.
    """
    y = np.asarray(labels)
    if isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1:
        raise ValueError(f"per_class must be a positive integer, got {per_class!r}")
    gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), 0x1AB])))
    picks = [gen.permutation(np.nonzero(y == c)[0])[:per_class] for c in np.unique(y)]
    return np.sort(np.concatenate(picks))


def matrix_scaling(logits: torch.Tensor, labels: torch.Tensor, *, strength: float = DEFAULT_STRENGTH):
    """Fit (W, b) per student by Adam on the penalized cross-entropy.

    Parameters
    ----------
    logits : Tensor of shape (n_students, n_rows, n_classes)
        The surrogates' logits on the labelled rows.
    labels : Tensor of shape (n_rows,), int64

    Returns
    -------
    (W, b) : Tensors of shapes (n_students, K, K) and (n_students, 1, K).
    """
    if logits.ndim != 3 or labels.shape != (logits.shape[1],):
        raise ValueError(f"need logits (students, rows, K) and one label per row, got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    s, _, k = logits.shape
    x = logits.detach().float()
    # Logit scales differ by recipe (T up to 16): standardize so one step size fits all.
    unit = x.std(dim=(1, 2), keepdim=True).clamp_min(1e-6)
    x = x / unit
    eye = torch.eye(k).expand(s, k, k)
    w = eye.clone().requires_grad_(True)
    b = torch.zeros(s, 1, k, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    target = labels.expand(s, -1).reshape(-1)
    for _ in range(_STEPS):
        opt.zero_grad()
        out = torch.baddbmm(b, x, w)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, k), target, reduction="sum") / x.shape[1]
        loss = loss + strength * ((w - eye) ** 2).sum()
        loss.backward()
        opt.step()
    return (w.detach() / unit), b.detach()


def recalibrated_predictions(train_logits, train_labels, eval_logits, *, strength: float = DEFAULT_STRENGTH):
    """argmax of the evaluation logits after matrix scaling fitted on the labelled rows (per student).

    Parameters
    ----------
    train_logits : torch.Tensor of shape (n_students, n_labelled, K)
    train_labels : torch.Tensor of shape (n_labelled,)
    eval_logits : torch.Tensor of shape (n_students, n_eval, K)
    strength : float, default ``DEFAULT_STRENGTH``
        The fit's L2 strength toward the identity.

    Returns
    -------
    torch.Tensor of shape (n_students, n_eval), int64
    """
    w, b = matrix_scaling(train_logits, train_labels, strength=strength)
    return torch.baddbmm(b, eval_logits.float(), w).argmax(dim=2)
