"""The thief's frontier: what a flagged user keeps against what the strongest thief keeps, per noise design.

For each noise design (:mod:`.noise_designs`), teacher retention target r and
key, the design's sigma is solved exactly on the pool rows (the provider's
calibration rows, with their labels) for accuracy r * A0, the pool is
answered z + sigma * g(z) as it would be served, and every thief below
distills a surrogate from those answers:

* knowledge distillation at T = 1, 2, 4, 16 and 32 with weight decays 1e-4
  to 1e-2 (:data:`SOFT_RECIPES`), each used as trained and after prior
  correction (:mod:`.prior_correction`);
* hard labels (the noisy argmax only) at two weight decays, plain and
  prior-corrected;
* near-duplicate averaging: M jittered copies of every pool row asked, the
  answers averaged, then distilled with :data:`NEAR_RECIPES`;
* a thief who knows the class-cycle design: it estimates the cycle from its
  answers, subtracts the push (:mod:`.cycle_unmixing`) and distills with
  :data:`UNMIX_RECIPES`, plain and prior-corrected.

Reported apart, outside the label-free threat model: the same thieves holding
:data:`LABELS_PER_CLASS` labelled pool rows per class, who refit their
surrogate's logits by matrix scaling (:mod:`.recalibration`).

x, the flagged user's retention, is the teacher's exact accuracy on the
evaluation split under this key's noise over its clean accuracy there; y,
the thief's retention, is the strongest thief's evaluation accuracy over the
strongest thief's on clean answers. "Strongest" is the attacker with the best
mean over keys and seeds, chosen on the evaluation labels: a choice no real
thief can make, so y errs toward the thief. Intervals are over keys and
training seeds (t interval of the mean of the key x seed values).

A near-duplicate's clean logits are modelled as z + N(0, (jitter * S)^2) per
class (the archive holds logits, not the teacher).
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..calibration.keyed_curve import keyed_accuracy, solve_keyed
from ..calibration.margins import margin_scale
from .noise_designs import design as design_named
from .recipes import Recipe

SOFT_RECIPES = (
    Recipe("T1-wd1e-3", 1.0, 1e-3),
    Recipe("T2-wd1e-4", 2.0, 1e-4),
    Recipe("T4-wd1e-2", 4.0, 1e-2),
    Recipe("T4-wd1e-3", 4.0, 1e-3),
    Recipe("T16-wd1e-3", 16.0, 1e-3),
    Recipe("T16-wd1e-2", 16.0, 1e-2),
    Recipe("T32-wd1e-3", 32.0, 1e-3),
    Recipe("T32-wd1e-2", 32.0, 1e-2),
)
HARD_RECIPES = (Recipe("hard-wd1e-3", 1.0, 1e-3), Recipe("hard-wd1e-2", 1.0, 1e-2))
NEAR_RECIPES = (Recipe("T4-wd1e-3", 4.0, 1e-3), Recipe("T16-wd1e-3", 16.0, 1e-3), Recipe("T32-wd1e-2", 32.0, 1e-2))
UNMIX_RECIPES = (Recipe("T1-wd1e-3", 1.0, 1e-3), Recipe("T4-wd1e-2", 4.0, 1e-2), Recipe("T16-wd1e-3", 16.0, 1e-3))
UNMIX = "unmix:"  # the design-aware thief of :mod:`.cycle_unmixing`
DEFAULT_LEVELS = (0.95, 0.85, 0.75, 0.65, 0.55)
NEAR_JITTER = 0.05
LABELS_PER_CLASS = 10
LABELLED = "labels:"  # attackers that also hold LABELS_PER_CLASS labelled pool rows (matrix scaling)


@dataclass(frozen=True)
class Interval:
    """Mean with a 95% t interval over n values (lo = hi = mean for one value).

    Attributes
    ----------
    mean, lo, hi : float
        NaN for no values.
    n : int
        How many values.
    """

    mean: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values) -> "Interval":
        """The mean and 95% Student-t interval of ``values``.

        Parameters
        ----------
        values : array_like of float
            Per key or per seed.

        Returns
        -------
        Interval
            NaN and n = 0 for no values; lo = hi = mean for one.
        """
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        m = float(v.mean())
        if v.size < 2:
            return cls(m, m, m, 1)
        half = float(_t975(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
        return cls(m, m - half, m + half, int(v.size))

    def to_dict(self) -> dict:
        """Plain JSON values: ``{"mean", "lo", "hi", "n"}``."""
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n}


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
         2.042)


def _t975(df: int) -> float:
    """Student's t 97.5% quantile (table to 30 degrees of freedom, then 2.0 down to the normal 1.96)."""
    return _T975[df - 1] if df <= len(_T975) else (2.0 if df <= 60 else 1.96)


@dataclass
class FrontierPoint:
    """One design at one teacher retention target, over keys and seeds.

    Attributes
    ----------
    design : str
        The noise design (per-input, a served field, class cycle, ...).
    level : float
        The teacher retention target.
    sigma_over_s : Interval
        The calibrated sigma in units of S, over keys.
    teacher, thief : Interval
        The flagged user's retention (over keys) and the strongest thief's (over keys x seeds).
    attacker : str
        The strongest thief; ``attackers`` holds every thief's mean retention.
    near_gain : float
        Accuracy points the best near-duplicate thief adds over the best single-answer one.
    labelled : Interval or None
        The strongest thief that also holds a few labels (outside the threat model).
    """

    design: str
    level: float
    sigma_over_s: Interval
    teacher: Interval  # the flagged user's retention on the evaluation split, over keys
    thief: Interval  # the strongest thief's retention, over keys x seeds
    attacker: str
    near_gain: float  # points of accuracy the best near-duplicate thief adds over the best single-answer thief
    attackers: dict = field(default_factory=dict)  # every thief's mean retention
    labelled: Interval | None = None  # the strongest thief that also holds a few labels (outside the threat model)

    def to_dict(self) -> dict:
        """Plain JSON values, the intervals as dicts."""
        return {"design": self.design, "level": self.level, "sigma_over_s": self.sigma_over_s.to_dict(),
                "teacher": self.teacher.to_dict(), "thief": self.thief.to_dict(), "attacker": self.attacker,
                "near_gain": self.near_gain, "attackers": self.attackers,
                "labelled": None if self.labelled is None else self.labelled.to_dict()}


@dataclass
class Frontier:
    """The thief's frontier of one archive: every design's points, and the clean reference.

    Attributes
    ----------
    archive : str
        The archive's name.
    clean_accuracy : float
        The strongest thief's accuracy on clean answers (the retention's denominator).
    clean_attacker : str
        That thief.
    keys, seeds : int
        Simulated keys and seeds per key.
    points : list of FrontierPoint
    """
    archive: str
    clean_accuracy: float  # the strongest thief's on clean answers (its retention's denominator)
    clean_attacker: str
    keys: int
    seeds: int
    points: list[FrontierPoint] = field(default_factory=list)

    def of(self, design: str) -> list[FrontierPoint]:
        """The points of ``design``, highest retention target first.

        Parameters
        ----------
        design : str

        Returns
        -------
        list of FrontierPoint
        """
        return sorted((p for p in self.points if p.design == design), key=lambda p: -p.level)

    def at(self, design: str, user: float = 0.75) -> tuple[float, float] | None:
        """The thief's retention where the flagged user keeps ``user``: linear between the measured points.

        Parameters
        ----------
        design : str
        user : float, default 0.75
            The flagged user's retention.

        Returns
        -------
        tuple of (float, float) or None
            The thief's mean retention and its interval's half width; None when
            ``user`` lies outside the measured range.
        """
        pts = sorted(self.of(design), key=lambda p: p.teacher.mean)
        xs = [p.teacher.mean for p in pts]
        if not pts or not xs[0] <= user <= xs[-1]:
            return None
        j = int(np.searchsorted(xs, user))
        if xs[j] == user or j == 0:
            p = pts[j]
            return p.thief.mean, (p.thief.hi - p.thief.lo) / 2
        a, b = pts[j - 1], pts[j]
        w = (user - a.teacher.mean) / (b.teacher.mean - a.teacher.mean)
        return ((1 - w) * a.thief.mean + w * b.thief.mean,
                (1 - w) * (a.thief.hi - a.thief.lo) / 2 + w * (b.thief.hi - b.thief.lo) / 2)


# --------------------------------------------------------------------------- workers

_STATE: dict = {}


def setup_worker(path: str, eval_path: str | None, pool_rows: int | None = None) -> None:
    """Load the archive (its first ``pool_rows`` pool rows) and the thief into this worker process."""
    import dataclasses

    import torch

    from .archive import Split, load_archive
    from .attacker import Thief
    from .recalibration import labelled_rows

    torch.set_num_threads(1)
    archive = load_archive(path, eval_path=eval_path)
    if pool_rows is not None:  # a campaign of this many queries: the pool's first rows
        p = archive.pool
        archive = dataclasses.replace(archive, pool=Split(p.inputs[:pool_rows], p.logits[:pool_rows],
                                                          p.labels[:pool_rows]))
    pool, ev = archive.pool, archive.evaluation
    labelled = labelled_rows(pool.labels, per_class=LABELS_PER_CLASS)
    _STATE.update(archive=archive, thief=Thief(pool.inputs, ev.inputs, ev.labels, ev.logits.argmax(1),
                                              n_classes=archive.n_classes,
                                              labelled=(labelled, pool.labels[labelled])))


def thief_scores(answers_soft: np.ndarray, recipes, seeds, *, hard: bool = False) -> dict[str, list[float]]:
    """Every recipe's accuracies (per seed) on ``answers_soft``: plain, prior-corrected and with a few labels.

    Runs in a worker set up by :func:`setup_worker`; ``hard`` trains on the answers' argmax only.
    """
    from .answers import Answers
    from .attacker import Request

    thief = _STATE["thief"]
    if hard:
        answers = Answers(None, np.argmax(answers_soft, axis=1), 0.0, 1, "frontier", "hard")
    else:
        answers = Answers(np.asarray(answers_soft, dtype=np.float64), None, 0.0, 1, "frontier", "soft")
    outs = thief.train([Request(answers, r, s) for r in recipes for s in seeds])
    scores: dict[str, list[float]] = {}
    for i, r in enumerate(recipes):
        o = outs[i * len(seeds):(i + 1) * len(seeds)]
        scores[r.name] = [x.accuracy for x in o]
        scores[r.name + "+prior"] = [x.corrected_accuracy for x in o]
        scores[LABELLED + r.name] = [x.recalibrated_accuracy for x in o]
    return scores


def worker_archive():
    """The archive :func:`setup_worker` loaded into this worker (its pool cut to the campaign's size)."""
    return _STATE["archive"]


def frontier_cell(task) -> dict:
    """One (design, level, key): sigma, the user's retention and every thief's accuracy per seed."""
    name, level, key_index, seeds, near = task
    archive = _STATE["archive"]
    pool, ev = archive.pool, archive.evaluation
    z, y, ze, ye = pool.logits, pool.labels, ev.logits, ev.labels
    scale = _scale(z)
    key = b"caliber-frontier-key-" + str(key_index).encode()
    if name == "clean":
        return {"task": task, "scores": {**thief_scores(z, SOFT_RECIPES, seeds),
                                         **thief_scores(z, HARD_RECIPES, seeds, hard=True)}}
    g = design_named(name).build(z, key, scale=scale, target=level)
    rows = [f"pool-{i}" for i in range(len(z))]
    gz = g(z, rows)
    a0 = float(np.mean(z.argmax(1) == y))
    sigma = solve_keyed(z, y, gz, target=level * a0, bootstrap=0).sigma
    a0_eval = float(np.mean(ze.argmax(1) == ye))
    user = keyed_accuracy(ze, ye, g(ze, [f"eval-{i}" for i in range(len(ze))]), sigma) / a0_eval
    served = z + sigma * gz
    scores = {**thief_scores(served, SOFT_RECIPES, seeds), **thief_scores(served, HARD_RECIPES, seeds, hard=True)}
    from .cycle_unmixing import unmixed

    unmix_scores = thief_scores(unmixed(served), UNMIX_RECIPES, seeds)
    scores.update({prefixed(UNMIX, k): v for k, v in unmix_scores.items()})
    if near:
        gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([key_index, 0xD0B])))
        total = np.zeros_like(z)
        for j in range(near):
            copy = z + gen.normal(0.0, NEAR_JITTER * scale, z.shape)
            total += copy + sigma * g(copy, [f"near{j}-pool-{i}" for i in range(len(z))])
        near_scores = thief_scores(total / near, NEAR_RECIPES, seeds)
        scores.update({prefixed(f"near{near}:", k): v for k, v in near_scores.items()})
    return {"task": task, "sigma_over_s": sigma / scale, "user": user, "scores": scores}


def prefixed(prefix: str, name: str) -> str:
    """A thief's name under ``prefix``; a labelled thief keeps its prefix first (out of the label-free strongest)."""
    if name.startswith(LABELLED):
        return LABELLED + prefix + name[len(LABELLED):]
    return prefix + name


def _scale(z: np.ndarray) -> float:
    return float(margin_scale(z))


# --------------------------------------------------------------------------- the sweep

def measure_frontier(path: str, *, designs: Sequence[str], levels: Sequence[float] = DEFAULT_LEVELS,
                     keys: int = 3, seeds: int = 2, near_duplicates: int = 16, processes: int = 1,
                     eval_path: str | None = None, pool_rows: int | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     cell: Callable[[tuple], dict] = frontier_cell) -> Frontier:
    """The frontier of every design on one archive (see the module docstring).

    Parameters
    ----------
    path : str
        An extraction archive (pool with inputs, logits and labels; evaluation split).
    designs : names from :data:`~.noise_designs.DESIGNS`.
    levels : teacher retention targets, fractions of the pool's clean accuracy.
    keys, seeds : replicates (keys: noise draws; seeds: the thief's training seeds).
    near_duplicates : M of the near-duplicate thief (0: no such thief).
    processes : worker processes (each trains single-threaded).
    pool_rows : the thief queries only the pool's first this many rows (σ is solved on them); None: all.
    progress : called with (cells done, cells) after each cell.
    cell : measures one (design, level, key) task in a worker (:func:`frontier_cell`; a module-level
        function that knows other designs, which it then validates itself).

    Raises
    ------
    ValueError
        An unknown design, a level outside (0, 1), or a non-positive count.
    """
    for name in designs if cell is frontier_cell else ():
        design_named(name)
    if not levels or any(not 0 < r < 1 for r in levels):
        raise ValueError(f"levels must be retention fractions in (0, 1), got {tuple(levels)!r}")
    counts = (("keys", keys), ("seeds", seeds), ("processes", processes))
    for label, value in counts + ((("pool_rows", pool_rows),) if pool_rows is not None else ()):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    seed_list = tuple(range(seeds))
    tasks = [("clean", 0.0, 0, seed_list, 0)]
    tasks += [(d, float(r), k, seed_list, int(near_duplicates)) for d in designs for r in levels for k in range(keys)]
    results = []
    if processes == 1:
        setup_worker(path, eval_path, pool_rows)
        for t in tasks:
            results.append(cell(t))
            if progress:
                progress(len(results), len(tasks))
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(processes, initializer=setup_worker, initargs=(path, eval_path, pool_rows)) as pool:
            for out in pool.imap_unordered(cell, tasks):
                results.append(out)
                if progress:
                    progress(len(results), len(tasks))
    return summarize(path, results, keys=keys, seeds=seeds)


def summarize(path: str, results: list[dict], *, keys: int, seeds: int) -> Frontier:
    """The frontier of measured cells: per (design, level), the strongest label-free thief over keys x seeds."""
    clean = {a: v for a, v in next(r for r in results if r["task"][0] == "clean")["scores"].items()
             if not a.startswith(LABELLED)}
    clean_name = max(clean, key=lambda a: np.mean(clean[a]))
    base = float(np.mean(clean[clean_name]))
    frontier = Frontier(str(path), base, clean_name, keys, seeds)
    cells: dict[tuple, list[dict]] = {}
    for r in results:
        if r["task"][0] != "clean":
            cells.setdefault((r["task"][0], r["task"][1]), []).append(r)
    for (name, level), group in sorted(cells.items()):
        attackers = group[0]["scores"].keys()
        every = {a: [v for r in group for v in r["scores"][a]] for a in attackers}
        pooled = {a: v for a, v in every.items() if not a.startswith(LABELLED)}
        best = max(pooled, key=lambda a: np.mean(pooled[a]))
        best_labelled = max(every, key=lambda a: np.mean(every[a]))
        single = [a for a in pooled if not a.startswith("near")]
        best_single = max(np.mean(pooled[a]) for a in single)
        near = [a for a in pooled if a.startswith("near")]  # label-free near-duplicate thieves
        near_gain = (max(np.mean(pooled[a]) for a in near) - best_single) * 100 if near else math.nan
        frontier.points.append(FrontierPoint(
            name, level, Interval.of([r["sigma_over_s"] for r in group]), Interval.of([r["user"] for r in group]),
            Interval.of(np.asarray(pooled[best]) / base), best, float(near_gain),
            {a: float(np.mean(v)) / base for a, v in every.items()},
            Interval.of(np.asarray(every[best_labelled]) / base)))
    return frontier
