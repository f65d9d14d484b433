"""A peer attacker from another library: ART's KnockoffNets, tuned on its own answers.

The thief's numbers mean little unless an attacker written elsewhere does no
better on the same answers. This module runs ART's ``KnockoffNets`` (random
sampling, probabilities) against a ``BlackBoxClassifier`` that returns the
softmax of exactly the answers our thief trained on (one answer per pool row,
:func:`~caliber_core.extraction.answers.answer_queries`), and gives it the
same chance to tune that our ``tuned`` recipe has, with no true labels:

* a held-out fifth of the queried rows, drawn from the seed;
* for each learning rate and weight decay of a small grid, ART's own training
  loop (``PyTorchClassifier.fit``, one pass at a time) on the other rows,
  with early stopping on the held-out cross-entropy against the noisy answers
  (the loss ART trains on);
* the setting and pass count with the lowest held-out loss, then one
  ``KnockoffNets.extract`` over the whole pool with them.

The stolen model is the thief's student: an MLP D-128-K on inputs
standardized with the pool's statistics. ART is a test and benchmark
dependency (``adversarial-robustness-toolbox``); it is imported on use.
ART draws its query order from numpy's global generator: it is seeded here
and restored afterwards, and torch's generator is forked, so a result is a
pure function of (answers, seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .answers import Answers
from .archive import ExtractionArchive

LEARNING_RATES = (1e-3, 3e-3)
WEIGHT_DECAYS = (0.0, 1e-3)
MAX_EPOCHS = 100
PATIENCE = 10
HELD_OUT = 0.2
BATCH_SIZE = 64
_SPLIT_TAG = 0xA27


@dataclass(frozen=True)
class PeerSetting:
    """One candidate of the peer's search and what its held-out answers said of it.

    Attributes
    ----------
    learning_rate, weight_decay : float
        Adam's step size and L2 decay.
    epochs : int
        Passes with the lowest held-out loss (early stopping).
    held_out_loss : float
        Mean cross-entropy of the held-out noisy answers under the student, at ``epochs``.
    """

    learning_rate: float
    weight_decay: float
    epochs: int
    held_out_loss: float


@dataclass(frozen=True)
class PeerOutcome:
    """The peer's final surrogate, scored on the evaluation split.

    Attributes
    ----------
    accuracy : float
        Against the evaluation labels.
    agreement : float
        With the clean teacher's argmax on the evaluation split.
    chosen : PeerSetting
    searched : tuple of PeerSetting
        Every candidate, in grid order.
    """

    accuracy: float
    agreement: float
    chosen: PeerSetting
    searched: tuple[PeerSetting, ...]


def _softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def _cross_entropy(targets: np.ndarray, logits: np.ndarray) -> float:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_q = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-(targets * log_q).sum(axis=1).mean())


def held_out_rows(n_samples: int, *, seed: int, fraction: float = HELD_OUT) -> np.ndarray:
    """The sorted pool rows the peer keeps out of training to judge its settings.

    Parameters
    ----------
    n_samples : int
        Rows of the pool.
    seed : int
        Draws the rows.
    fraction : float, default ``HELD_OUT``
        In (0, 1).

    Returns
    -------
    ndarray of int
        Sorted row indices, round(fraction * n_samples) of them.

    Raises
    ------
    ValueError
        A fraction outside (0, 1), or one that leaves no rows on one side.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    n_held = int(round(fraction * n_samples))
    if not 1 <= n_held < n_samples:
        raise ValueError(f"a held-out fraction of {fraction} leaves no rows on one side of {n_samples}")
    gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), _SPLIT_TAG])))
    return np.sort(gen.permutation(n_samples)[:n_held])


def knockoff_nets_peer(
    archive: ExtractionArchive,
    answers: Answers,
    *,
    seed: int,
    learning_rates: Sequence[float] = LEARNING_RATES,
    weight_decays: Sequence[float] = WEIGHT_DECAYS,
    max_epochs: int = MAX_EPOCHS,
    patience: int = PATIENCE,
) -> PeerOutcome:
    """ART's KnockoffNets on ``answers``, its settings chosen on held-out answers.

    Parameters
    ----------
    archive : ExtractionArchive
        The pool (inputs queried) and the evaluation split (scoring only).
    answers : Answers
        Soft answers to the pool's queries (``answers.values``, noisy logits);
        the victim returns their softmax.
    seed : int
        Fixes the held-out rows, the students' initial weights and ART's query
        and mini-batch order.
    learning_rates, weight_decays : sequences of float
        The grid searched.
    max_epochs, patience : int
        Early stopping: at most ``max_epochs`` passes, stopped after
        ``patience`` passes without a lower held-out loss.

    Returns
    -------
    PeerOutcome
    """
    import torch
    from art.attacks.extraction import KnockoffNets
    from art.estimators.classification import BlackBoxClassifier, PyTorchClassifier

    if answers.kind != "soft":
        raise ValueError(f"the peer distills soft answers, got {answers.kind!r} ones")
    pool, ev = archive.pool, archive.evaluation
    if answers.values.shape != pool.logits.shape:
        raise ValueError(f"answers have shape {answers.values.shape}, the pool's logits {pool.logits.shape}")
    if max_epochs < 1 or patience < 1:
        raise ValueError(f"max_epochs and patience must be >= 1, got {max_epochs} and {patience}")
    torch.set_num_threads(1)
    probs = _softmax(answers.values).astype(np.float32)
    x_pool = np.ascontiguousarray(pool.inputs, dtype=np.float32)
    rows = {x.tobytes(): i for i, x in enumerate(x_pool)}

    def predict(x):
        return probs[[rows[np.asarray(r, dtype=np.float32).tobytes()] for r in x]]

    d, k = x_pool.shape[1], archive.n_classes
    victim = BlackBoxClassifier(predict, input_shape=(d,), nb_classes=k)
    mean = x_pool.mean(axis=0)
    std = np.maximum(x_pool.std(axis=0), 0.1 * x_pool.std(axis=0).mean())

    def student(lr: float, wd: float):
        net = torch.nn.Sequential(torch.nn.Linear(d, 128), torch.nn.ReLU(), torch.nn.Linear(128, k))
        return PyTorchClassifier(net, loss=torch.nn.CrossEntropyLoss(),
                                 optimizer=torch.optim.Adam(net.parameters(), lr=lr, weight_decay=wd),
                                 input_shape=(d,), nb_classes=k,
                                 preprocessing=(mean.astype(np.float32), std.astype(np.float32)))

    held = held_out_rows(pool.n_samples, seed=seed)
    fit = np.setdiff1d(np.arange(pool.n_samples), held, assume_unique=True)
    x_fit, x_held = x_pool[fit], x_pool[held]
    y_fit, y_held = victim.predict(x_fit), victim.predict(x_held)
    searched = []
    state = np.random.get_state()
    try:
        with torch.random.fork_rng():
            for lr in learning_rates:
                for wd in weight_decays:
                    torch.manual_seed(seed)
                    thieved = student(float(lr), float(wd))
                    best, best_epoch = np.inf, 0
                    for epoch in range(1, max_epochs + 1):
                        thieved.fit(x_fit, y_fit, batch_size=BATCH_SIZE, nb_epochs=1)
                        loss = _cross_entropy(y_held, thieved.predict(x_held))
                        if loss < best:
                            best, best_epoch = loss, epoch
                        elif epoch - best_epoch >= patience:
                            break
                    searched.append(PeerSetting(float(lr), float(wd), best_epoch, best))
            chosen = min(searched, key=lambda s: s.held_out_loss)
            torch.manual_seed(seed)
            np.random.seed(seed)
            attack = KnockoffNets(victim, batch_size_fit=BATCH_SIZE, batch_size_query=pool.n_samples,
                                  nb_epochs=chosen.epochs, nb_stolen=pool.n_samples,
                                  sampling_strategy="random", use_probability=True)
            stolen = attack.extract(x_pool, thieved_classifier=student(chosen.learning_rate, chosen.weight_decay))
            pred = np.argmax(stolen.predict(np.asarray(ev.inputs, dtype=np.float32)), axis=1)
    finally:
        np.random.set_state(state)
    return PeerOutcome(accuracy=float(np.mean(pred == ev.labels)),
                       agreement=float(np.mean(pred == np.argmax(ev.logits, axis=1))),
                       chosen=chosen, searched=tuple(searched))
