"""Per-input against consistent seeding on one archive: the frontier a provider chooses from.

For each teacher retention level r, each seeding answers the whole pool as
it would be served, and the strongest thief distills from it:

* **per-input**: sigma from Caliber's usual calibration of the pool (the
  key-averaged curve, which every per-input key follows); one keyed draw
  per row, a new key per replicate;
* **consistent**: one key per replicate; for that key, sigma from its own
  exact curve on the pool rows (:mod:`caliber_core.calibration.keyed_curve`),
  answers z + sigma g(z) (:mod:`caliber_core.serving.consistent_noise`): the
  served smooth field at a length scale, or (length scale None) the class
  cycle of version 2, balanced at each level's target.

Reported per level and seeding, with the spread over keys: sigma, the
teacher's retention on the evaluation split (what a wrongly flagged user
keeps; for consistent noise the key's exact accuracy there), and the thief's
retention: the strongest of the fixed recipes and the tuned attacker's
candidates, each plain or prior-corrected, over the strongest clean-answer
surrogate. ``near_duplicates`` adds, at the lowest level, M near-duplicates
of every pool row averaged. The archive holds logits, not the teacher, so a
near-duplicate's clean logits are modelled as z + N(0, (jitter * S)^2) per
class (``benchmarks/bench_consistent.py`` answers real jittered images).
``curves`` holds, per key, the teacher's exact accuracy on the evaluation
split over a sigma grid: the key-averaged curve and its spread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..serving.runtime import KEYED_SEEDINGS
from ..calibration.calibrate import calibrate_model, sigma_for_target
from ..calibration.keyed_curve import keyed_accuracy, solve_keyed
from ..calibration.engine import CurveEngine
from ..serving.class_cycle_noise import ClassCycleNoise
from ..serving.consistent_levels import noise_binding
from ..serving.consistent_noise import CYCLE_VERSION, DEFAULT_FEATURES, DEFAULT_LENGTH_SCALE, ConsistentNoise
from .answers import Answers, answer_queries, per_input_key
from .archive import ExtractionArchive
from .recipes import LIGHT, STRONG, TUNED_CANDIDATES
from .spread import Spread
from .surrogate_requests import Request

if TYPE_CHECKING:  # trains with torch: imported when a comparison runs
    from .attacker import Thief

SEEDINGS = KEYED_SEEDINGS  # the keyed seedings, compared side by side
DEFAULT_LEVELS = (0.95, 0.85, 0.75, 0.65, 0.55)
NEAR_JITTER = 0.05  # a near-duplicate's logits move by 5% of S per class
_RECIPES = (LIGHT, STRONG) + TUNED_CANDIDATES


@dataclass
class SeedingPoint:
    """One seeding at one teacher retention level, over keys.

    Attributes
    ----------
    seeding : {"per-input", "consistent"}
    level : float
        The teacher retention target.
    sigma, teacher_retention, thief_retention : Spread
        Over keys; ``sigmas`` holds sigma per key.
    attackers : list of str
        The strongest thief per key.
    near_duplicate_retention : Spread or None
        M near-duplicates averaged (lowest level only).
    """

    seeding: str
    level: float
    sigma: Spread
    teacher_retention: Spread
    thief_retention: Spread
    attackers: list[str]
    sigmas: list[float]  # per key
    near_duplicate_retention: Spread | None = None  # M near-duplicates averaged (lowest level only)


@dataclass
class SeedingComparison:
    """Per-input against consistent seeding on one archive: the points and each key's retention curve.

    Attributes
    ----------
    archive : str
    length_scale : float or None
        The field's length scale in units of S; None for the class cycle (version 2).
    keys : int
    clean_surrogate : float
        The strongest clean-answer surrogate's accuracy (``clean_attacker``).
    points : list of SeedingPoint
    near_duplicates : int
        Near-duplicates answered per pool row.
    curve_sigmas : ndarray of shape (n_sigmas,)
    curves : ndarray of shape (keys, n_sigmas)
        Consistent teacher retention on the evaluation split, per key.
    notes : list of str
    """
    archive: str
    length_scale: float | None  # None: the class cycle (version 2)
    keys: int
    clean_surrogate: float
    clean_attacker: str
    points: list[SeedingPoint]
    near_duplicates: int
    curve_sigmas: np.ndarray
    curves: np.ndarray  # (keys, sigmas): consistent teacher retention on the evaluation split, per key
    notes: list[str] = field(default_factory=list)

    def at(self, seeding: str) -> list[SeedingPoint]:
        """The points of ``seeding``, in measured order.

        Parameters
        ----------
        seeding : str

        Returns
        -------
        list of SeedingPoint
        """
        return [p for p in self.points if p.seeding == seeding]


def consistent_noise_for(logits, key: bytes, *, scale: float, length_scale: float, noise_id: str,
                         data_sha256: str | None = None) -> ConsistentNoise:
    """Level-1 consistent noise for ``key``, centred on ``logits`` (the calibration rows).

    Parameters
    ----------
    logits : array_like of shape (n, K)
    key : bytes
    scale : float
        S of the logits.
    length_scale : float
        The field's length scale in units of S.
    noise_id : str
        The simulated noise identity (bound into the generator).
    data_sha256 : str, optional

    Returns
    -------
    ConsistentNoise

    Raises
    ------
    ValueError
        The rows give noise of zero variance.
    """
    record = {"noise_id": noise_id, "data_sha256": data_sha256, "seeding": "consistent",
              "length_scale": float(length_scale), "features": DEFAULT_FEATURES, "scale": float(scale),
              "key_fingerprint": "simulation"}
    z = np.asarray(logits, dtype=np.float64)
    return ConsistentNoise(key, binding=noise_binding(record), n_classes=z.shape[1], scale=scale,
                           length_scale=length_scale).centred_on(z)


def class_cycle_for(logits, key: bytes, *, target: float, noise_id: str,
                    data_sha256: str | None = None) -> ClassCycleNoise:
    """Level-1 class-cycle noise for ``key``, balanced for ``target``.

    Parameters
    ----------
    logits : array_like of shape (n, K)
        The calibration rows.
    key : bytes
    target : float
        The teacher retention the noise is calibrated for; the cycle is
        balanced where 1 - target of the rows change.
    noise_id : str
    data_sha256 : str, optional

    Returns
    -------
    ClassCycleNoise
    """
    record = {"version": CYCLE_VERSION, "design": "class-cycle", "noise_id": noise_id, "data_sha256": data_sha256,
              "seeding": "consistent", "scale": 1.0, "key_fingerprint": "simulation"}
    z = np.asarray(logits, dtype=np.float64)
    return ClassCycleNoise(key, binding=noise_binding(record), n_classes=z.shape[1]).balanced_on(
        z, share=min(max(1.0 - float(target), 0.01), 0.95))


def compare_seedings(archive: ExtractionArchive, *, levels: Sequence[float] = DEFAULT_LEVELS, keys: int = 3,
                     seeds: int = 2, length_scale: float | None = DEFAULT_LENGTH_SCALE, key: bytes | None = None,
                     near_duplicates: int = 16, seed: int = 0, thief: Thief | None = None,
                     progress: Callable[[float], None] | None = None) -> SeedingComparison:
    """Run both seedings at every level (see the module docstring).

    Parameters
    ----------
    archive : ExtractionArchive
    levels : teacher retention targets (fractions of A0)
    keys : int
        Keys (replicates) per seeding; ignored when ``key`` is given.
    seeds : int
        Training seeds per attacker and key.
    length_scale : float or None, default DEFAULT_LENGTH_SCALE
        The served field's length scale, in units of S; None: the class cycle
        (consistent noise version 2) instead.
    key : bytes, optional
        Calibrate and answer with this key only (the provider's own).
    near_duplicates : int
        M for the near-duplicate condition (0: skip it).
    """
    if not levels or any(not 0 < r < 1 for r in levels):
        raise ValueError(f"levels must be retention fractions in (0, 1), got {tuple(levels)!r}")
    for name, value in (("keys", keys), ("seeds", seeds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    pool, ev = archive.pool, archive.evaluation
    z, y, ze, ye = pool.logits, pool.labels, ev.logits, ev.labels
    cal = calibrate_model(z, y, name=archive.name)
    scale, a0, a0_eval = float(cal.scale), float(cal.clean_accuracy), float(np.mean(ze.argmax(1) == ye))
    exact = CurveEngine(ze, ye, method="exact")
    key_list = [key] if key is not None else [per_input_key(seed * 1000 + k) for k in range(keys)]
    own = thief is None
    if own:
        from .attacker import Thief

        thief = Thief(pool.inputs, ev.inputs, ye, ze.argmax(1), n_classes=archive.n_classes)
    train_seeds = list(range(seed, seed + seeds))
    levels = sorted(levels, reverse=True)
    total = (1 + 2 * len(levels) * len(key_list) + (2 * len(key_list) if near_duplicates else 0))
    done = [0]

    def strongest(answers: np.ndarray, tag: str) -> tuple[float, str]:
        a = Answers(answers, None, 0.0, 1, tag, "soft")
        outs = thief.train([Request(a, r, s) for r in _RECIPES for s in train_seeds])
        best, who = -1.0, ""
        for i, r in enumerate(_RECIPES):
            o = outs[i * seeds:(i + 1) * seeds]
            for value, name in ((np.mean([x.accuracy for x in o]), r.name),
                                (np.mean([x.corrected_accuracy for x in o]), r.name + "+prior")):
                if value > best:
                    best, who = float(value), name
        done[0] += 1
        if progress is not None:
            progress(min(0.99, done[0] / total))
        return best, who

    try:
        clean, clean_who = strongest(z, "clean")
        if length_scale is None:
            def noises_at(r):
                return [class_cycle_for(z, k, target=r, noise_id=f"extract-{i}", data_sha256=archive.sha256)
                        for i, k in enumerate(key_list)]
        else:
            fields = [consistent_noise_for(z, k, scale=scale, length_scale=length_scale, noise_id=f"extract-{i}",
                                           data_sha256=archive.sha256) for i, k in enumerate(key_list)]

            def noises_at(r):
                return fields
        points = []
        for r in levels:
            sigma_pi = float(sigma_for_target(cal, r, kind="retention").sigma)
            t_pi = float(exact.accuracy(sigma_pi)[0]) / a0_eval
            accs, whos = [], []
            for i in range(len(key_list)):
                served = answer_queries(z, sigma=sigma_pi, seed=seed * 1000 + i, seeding="per-input")[("soft", 1)]
                acc, who = strongest(served.values, f"per-input-{r}-{i}")
                accs.append(acc / clean)
                whos.append(who)
            points.append(SeedingPoint("per-input", r, Spread.of([sigma_pi] * len(key_list)),
                                       Spread.of([t_pi] * len(key_list)), Spread.of(accs), whos,
                                       [sigma_pi] * len(key_list)))
            sig, teach, accs, whos = [], [], [], []
            noises = noises_at(r)
            g_pool, g_eval = [n(z) for n in noises], [n(ze) for n in noises]
            for i in range(len(key_list)):
                solved = solve_keyed(z, y, g_pool[i], target=r * a0, bootstrap=0)
                sig.append(solved.sigma)
                teach.append(keyed_accuracy(ze, ye, g_eval[i], solved.sigma) / a0_eval)
                acc, who = strongest(z + solved.sigma * g_pool[i], f"consistent-{length_scale}-{r}-{i}")
                accs.append(acc / clean)
                whos.append(who)
            points.append(SeedingPoint("consistent", r, Spread.of(sig), Spread.of(teach), Spread.of(accs), whos, sig))
        if near_duplicates:
            _near_duplicates(points, z, scale, noises, strongest, clean, near_duplicates, seed)
        # noises, g_eval: the lowest level's (the last solved), as the near-duplicates use
        grid = np.linspace(0.0, 1.5 * max(p.sigma.mean for p in points), 40)
        curves = np.array([[keyed_accuracy(ze, ye, g, s) / a0_eval for s in grid] for g in g_eval])
    finally:
        if own:
            thief.close()
    if progress is not None:
        progress(1.0)
    return SeedingComparison(archive.name, None if length_scale is None else float(length_scale), len(key_list),
                             clean, clean_who, points,
                             near_duplicates, grid, curves)


def _near_duplicates(points, z, scale, noises, strongest, clean, m, seed) -> None:
    """At the lowest level: M near-duplicates of each pool row, each answered, averaged."""
    gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), 0xD0B])))
    copies = [z + gen.normal(0.0, NEAR_JITTER * scale, z.shape) for _ in range(m)]
    for p in (q for q in points if q.level == points[-1].level):
        accs = []
        for i in range(len(noises)):
            sigma = p.sigmas[i]
            if p.seeding == "per-input":
                # each near-duplicate is a new request id: its own keyed draw
                answers = [answer_queries(c, sigma=sigma, seed=seed * 1000 + i + 7919 * (j + 1),
                                          seeding="per-input")[("soft", 1)].values for j, c in enumerate(copies)]
            else:
                answers = [c + sigma * noises[i](c) for c in copies]
            acc, _ = strongest(np.mean(answers, axis=0), f"near-{p.seeding}-{p.level}-{i}")
            accs.append(acc / clean)
        p.near_duplicate_retention = Spread.of(accs)
