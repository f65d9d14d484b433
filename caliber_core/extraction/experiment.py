"""The extraction experiment: conditions, seeds, spreads, frontier and surrogate targets.

One call of :func:`run_extraction` reproduces, on a cached-logits archive, the
paper's end-to-end evidence (its Tables 3 and 4 and the hard-label
paragraph) and adds what a provider needs to aim at the thief:

* **targets** -- clean answers and each calibrated retention target (sigma
  from Caliber's own calibration of the pool logits), every recipe, several
  seeds; the headline is the strongest recipe (the provider's worst case);
* **frontier** -- teacher accuracy against surrogate accuracy over a sigma grid;
* **surrogate targets** -- sigma at which the frontier attacker's surrogate
  keeps R of the clean-answer accuracy of the strongest recipe, seed by seed
  (what the thief would get without the defense; :mod:`.frontier`);
* **averaging** -- at the lowest-retention target, M in ``m_values`` repeated
  queries, fresh versus per-input seeding, soft answers and hard labels.

The *frontier attacker* (used for the frontier, the surrogate targets and the
hard-label rows) is the recipe with the highest mean accuracy at the lowest-retention
target; when that is the tuned attacker, its most frequent choice there is
kept fixed, as a thief who tuned once at its operating point would. Averaged
soft answers are attacked by the tuned attacker when it runs, since it re-tunes
for the lower effective noise of M averaged answers. The tuned attacker
selects once per noise level (sigma, or sigma / sqrt(M) for M fresh answers
averaged) with its k folds spread over the replicate seeds' answers, and every
seed keeps that choice (:meth:`.attacker.Thief.train`); per-input answers at
sigma keep the choice made at sigma.

``timings`` holds the wall seconds of each phase (calibration, clean, each
target, frontier, each surrogate search, averaging, hard labels).

Each replicate seed fixes the noise draws (shared by every sigma: common
random numbers), the per-input key, the vote tie-breaks and the students'
initialization and mini-batch order; the same seed gives identical numbers.
Teacher accuracy is exact (quadrature of Eq. top1-exact with the true label
as reference), not sampled.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..calibration.calibrate import Calibration, calibrate_model, sigma_for_target
from ..calibration.engine import CurveEngine
from .answers import DrawnAnswers
from .archive import ExtractionArchive
from .averaging import AveragingRow, averaging_rows
from .frontier import RetentionRoot, solve_retention, teacher_grid
from .recipes import DEFAULT_FOLDS, TUNED, Recipe, fixed_recipe, recipes_for
from .schedule import Schedule
from .spread import Spread
from .surrogate_requests import Outcome, Request, modal_choice, noise_group

if TYPE_CHECKING:
    from .attacker import Thief

DEFAULT_M = (1, 2, 4, 8, 16)
DEFAULT_RETENTION = (0.95, 0.85, 0.75)
# Teacher retention levels of the frontier grid (fractions of A0); the grid
# continues until the teacher is within a few points of chance.
FRONTIER_LEVELS = (0.95, 0.85, 0.75, 0.65, 0.55, 0.45, 0.35, 0.25)
_NEAR_CHANCE = 0.03


@dataclass(frozen=True)
class ExtractionSettings:
    """Options of one extraction experiment (the CLI's flags).

    Attributes
    ----------
    retention : tuple of float
        Teacher retention targets r; sigma from calibration of the pool.
    surrogate_retention : tuple of float
        Surrogate retention targets R.
    seeds : int
        Replicates per condition.
    m_values : tuple of int
        Queries per input averaged.
    attack : {"fixed", "tuned", "all"}
    seed : int
        Base seed; the replicate seeds derive from it.
    architecture, hidden : the student (``mlp`` D-hidden-K or ``linear``).
    schedule : Schedule
    folds : int
        k of the tuned attacker.
    near_seeds : int or None
        Seeds used by the surrogate-target search (default: max(2 seeds, 4)).
    averaging : bool
        Run the averaging and hard-label conditions.
    averaging_attacker : {"tuned", "frontier"}
        Who attacks averaged soft answers: the tuned attacker (re-tuned for
        each M; when it runs) or the frontier attacker's fixed recipe (cheaper).
    processes : int
        Processes that train the surrogates (the numbers do not depend on it).
    """

    retention: tuple[float, ...] = DEFAULT_RETENTION
    surrogate_retention: tuple[float, ...] = ()
    seeds: int = 3
    m_values: tuple[int, ...] = DEFAULT_M
    attack: str = "all"
    seed: int = 0
    architecture: str = "mlp"
    hidden: int = 128
    schedule: Schedule = Schedule()
    folds: int = DEFAULT_FOLDS
    near_seeds: int | None = None
    averaging: bool = True
    averaging_attacker: str = "tuned"
    processes: int = 1

    def __post_init__(self):
        recipes_for(self.attack)
        if self.averaging_attacker not in ("tuned", "frontier"):
            raise ValueError(f"averaging_attacker must be 'tuned' or 'frontier', got {self.averaging_attacker!r}")
        for name in ("seeds", "folds", "hidden", "processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        for r in self.retention:
            if not (0.0 < r < 1.0):
                raise ValueError(f"each retention target must lie in (0, 1), got {r}")
        for r in self.surrogate_retention:
            if not (0.0 < r < 1.0):
                raise ValueError(f"each surrogate retention target must lie in (0, 1), got {r}")
        if not self.m_values or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in self.m_values):
            raise ValueError(f"m_values must be positive integers, got {self.m_values!r}")

    def replicate_seeds(self, count: int | None = None) -> list[int]:
        """The first ``count`` (default :attr:`seeds`) replicate seeds, each derived from :attr:`seed` and its index.

        Returns
        -------
        list of int
        """
        n = self.seeds if count is None else count
        return [int(np.random.SeedSequence([self.seed, i]).generate_state(1)[0] % 2**31) for i in range(n)]

    def n_near(self) -> int:
        """Seeds of the surrogate-target search: ``near_seeds``, else max(2 seeds, 4)."""
        return self.near_seeds if self.near_seeds is not None else max(2 * self.seeds, 4)


@dataclass
class RecipeStats:
    """One recipe at one condition, over seeds.

    Attributes
    ----------
    accuracy, agreement, drop_recovered : Spread
        The surrogate's accuracy, agreement with the teacher, and share of the noise's drop it recovered.
    accuracies : list of float
        Per seed. ``chosen``: the tuned attacker's choice per seed (None for fixed recipes).
    """

    recipe: str
    accuracy: Spread
    agreement: Spread
    drop_recovered: Spread
    accuracies: list[float]
    chosen: list[dict] | None = None  # the tuned attacker's choice per seed


@dataclass
class Condition:
    """A row of the Table-3 analogue: one sigma, every recipe."""

    kind: str  # "clean", "retention" or "surrogate-retention"
    requested: float | None
    sigma: float
    teacher_accuracy: float
    by_recipe: dict[str, RecipeStats]
    headline: str
    sigma_se: float | None = None
    root: RetentionRoot | None = None
    frontier_retention: Spread | None = None

    @property
    def best(self) -> RecipeStats:
        """The headline recipe's statistics."""
        return self.by_recipe[self.headline]


@dataclass
class FrontierPoint:
    """Teacher accuracy at one sigma of the grid and the frontier attacker's surrogate there, over seeds."""
    sigma: float
    teacher_accuracy: float
    surrogate_accuracy: Spread
    surrogate_agreement: Spread
    surrogate_retention: Spread


@dataclass
class ExtractionResult:
    """Everything one :func:`run_extraction` measured: conditions, frontier, averaging rows, runs and timings."""
    archive: ExtractionArchive
    settings: ExtractionSettings
    seeds: list[int]
    recipes: list[str]
    clean_accuracy_pool: float
    clean_accuracy_eval: float
    scale: float
    clean: Condition
    targets: list[Condition]
    frontier_attacker: Recipe
    frontier: list[FrontierPoint]
    averaging: list[AveragingRow]
    averaging_sigma: float | None
    runs: int
    seconds: float
    calibration: Calibration | None = None
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per phase, in run order


class _Phases:
    """Wall seconds per phase of the experiment; ``start`` ends the phase before."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._name: str | None = None
        self._t0 = 0.0

    def start(self, name: str) -> None:
        self.stop()
        self._name, self._t0 = name, time.perf_counter()

    def stop(self) -> None:
        if self._name is not None:
            self.seconds[self._name] = self.seconds.get(self._name, 0.0) + time.perf_counter() - self._t0
            self._name = None


class _Progress:
    def __init__(self, callback, total: int):
        self.callback, self.total, self.done = callback, max(1, total), 0

    def __call__(self, n: int) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(min(0.99, self.done / self.total))


def plan_runs(settings: ExtractionSettings, *, frontier_points: int = len(FRONTIER_LEVELS) + 2) -> int:
    """An upper bound on training runs (progress total); tuned runs include their fold models.

    Returns
    -------
    int
    """
    from .recipes import candidates_for

    names = recipes_for(settings.attack)
    select = settings.folds * len(candidates_for("soft"))  # one tuned selection (shared by the seeds)
    row = settings.seeds * len(names) + (select if TUNED in names else 0)
    total = (1 + len(settings.retention)) * row + frontier_points * settings.seeds
    total += len(settings.surrogate_retention) * (4 * settings.n_near() + row)
    if settings.averaging and settings.retention:
        retuned = TUNED in names and settings.averaging_attacker == "tuned"
        total += settings.seeds * (2 * len(settings.m_values) + 3)
        total += (len(settings.m_values) - 1) * select if retuned else 0
    return total


def run_extraction(
    archive: ExtractionArchive,
    settings: ExtractionSettings = ExtractionSettings(),
    *,
    thief: Thief | None = None,
    progress: Callable[[float], None] | None = None,
) -> ExtractionResult:
    """Run every condition of the experiment on one archive.

    Parameters
    ----------
    archive : ExtractionArchive
    settings : ExtractionSettings
    thief : Thief, optional
        Reuse a thief (and its memo of trained surrogates) built for this archive.
    progress : callable, optional
        ``progress(fraction)`` after every batch of training runs; ends at 1.0.

    Returns
    -------
    ExtractionResult
    """
    start = time.perf_counter()
    pool, ev = archive.pool, archive.evaluation
    tick = _Progress(progress, plan_runs(settings))
    timer = _Phases()
    timer.start("calibration")
    cal = calibrate_model(pool.logits, pool.labels, name=archive.name)
    exact = CurveEngine(ev.logits, ev.labels)  # the one cost policy (quadrature on these sizes)
    own = thief is None
    if own:
        from .attacker import Thief  # torch: imported when a run starts, so reading results needs none
        thief = Thief(pool.inputs, ev.inputs, ev.labels, np.argmax(ev.logits, axis=1),
                      n_classes=archive.n_classes, architecture=settings.architecture,
                      hidden=settings.hidden, schedule=settings.schedule, folds=settings.folds,
                      processes=settings.processes)
    try:
        return _experiment(archive, settings, thief, cal, exact, tick, timer, progress, start)
    finally:
        if own:
            thief.close()


def _experiment(archive, settings, thief, cal, exact, tick, timer, progress, start) -> ExtractionResult:
    pool = archive.pool
    a0_eval = float(exact.accuracy(0.0)[0])
    thief.on_runs = tick
    runs_before = thief.runs
    seeds = settings.replicate_seeds()
    names = list(recipes_for(settings.attack))

    def teacher(sigma: float) -> float:
        return float(exact.accuracy(sigma)[0])

    def condition(kind, requested, sigma, clean_by_recipe=None) -> Condition:
        reqs, index = [], []
        for name in names:
            for s in seeds:
                reqs.append(Request(_soft(pool.logits, sigma, s), name, s, noise_group(sigma)))
                index.append((name, s))
        outs = thief.train(reqs)
        t_acc = teacher(sigma)
        by_recipe = {}
        for name in names:
            per_seed = [o for (n, _), o in zip(index, outs) if n == name]
            clean = None if clean_by_recipe is None else clean_by_recipe[name].accuracies
            by_recipe[name] = _stats(name, per_seed, clean, a0_eval, t_acc,
                                     chosen=[thief.chosen(r.answers, r.seed).to_dict()
                                             for r, (n, _) in zip(reqs, index) if n == name]
                                     if name == TUNED else None)
        headline = max(names, key=lambda n: (by_recipe[n].accuracy.mean, n == TUNED))
        return Condition(kind, requested, float(sigma), t_acc, by_recipe, headline)

    timer.start("clean")
    clean = condition("clean", None, 0.0)
    targets = []
    for r in settings.retention:
        timer.start(f"retention {r:g}")
        sigma = float(sigma_for_target(cal, r, kind="retention").sigma)
        targets.append(condition("retention", r, sigma, clean.by_recipe))
    timer.start("frontier")

    anchor = max(targets, key=lambda c: c.sigma) if targets else clean
    attacker = _frontier_attacker(anchor, thief, seeds, pool.logits)
    notes = [f"frontier attacker: {attacker.name} (T={attacker.temperature:g}, weight decay "
             f"{attacker.weight_decay:g}), the strongest recipe at sigma={anchor.sigma:.4g}"]

    def frontier_eval(sigma: float, seed_list: Sequence[int]) -> list[Outcome]:
        return thief.train([Request(_soft(pool.logits, sigma, s), attacker, s) for s in seed_list])

    chance = 1.0 / archive.n_classes
    levels = list(FRONTIER_LEVELS)
    floor = (chance + _NEAR_CHANCE) / cal.clean_accuracy
    if floor < levels[-1]:
        levels.append(floor)
    sigmas = teacher_grid(levels, lambda r: _sigma_or_none(cal, r))
    sigmas = sorted(set(sigmas) | {c.sigma for c in targets})
    frontier, grid = [], []
    def clean_reference(seed_list: Sequence[int]) -> np.ndarray:
        # Retention is measured against the strongest recipe on clean answers
        # (same seed): what the thief would get without the defense.
        return np.array([o.accuracy for o in thief.train(
            [Request(_soft(pool.logits, 0.0, s), clean.headline, s, noise_group(0.0)) for s in seed_list])])

    clean_front = clean_reference(seeds)
    # The whole grid in one request list: its surrogates train in a few large batches.
    grid_outs = thief.train([Request(_soft(pool.logits, sigma, s), attacker, s) for sigma in sigmas for s in seeds])
    for i, sigma in enumerate(sigmas):
        outs = grid_outs[i * len(seeds):(i + 1) * len(seeds)]
        acc = np.array([o.accuracy for o in outs])
        frontier.append(FrontierPoint(sigma, teacher(sigma), Spread.of(acc), Spread.of([o.agreement for o in outs]),
                                      Spread.of(acc / clean_front)))
        grid.append((sigma, acc / clean_front))

    near = settings.replicate_seeds(settings.n_near())
    near_clean = clean_reference(near)
    for big_r in settings.surrogate_retention:
        timer.start(f"surrogate {big_r:g} search")

        def evaluate(sigma, _near=near, _clean=near_clean):
            return np.array([o.accuracy for o in frontier_eval(sigma, _near)]) / _clean
        root = solve_retention(grid, big_r, evaluate)
        if root.sigma is None:
            cond = Condition("surrogate-retention", big_r, math.nan, math.nan, {}, "", root=root)
        else:
            timer.start(f"surrogate {big_r:g} every recipe")
            cond = condition("surrogate-retention", big_r, root.sigma, clean.by_recipe)
            cond.sigma_se, cond.root = root.sigma_se, root
            cond.frontier_retention = Spread.of(evaluate(root.sigma))
        targets.append(cond)

    averaging, avg_sigma = [], None
    if settings.averaging and any(c.kind == "retention" for c in targets):
        avg_sigma = max(c.sigma for c in targets if c.kind == "retention")
        soft_attacker = TUNED if TUNED in names and settings.averaging_attacker == "tuned" else attacker
        averaging = averaging_rows(thief, soft_attacker, attacker, pool.logits, avg_sigma, seeds, settings.m_values,
                                   on_phase=timer.start)
    timer.stop()
    tick.done = tick.total
    if progress is not None:
        progress(1.0)
    return ExtractionResult(
        archive=archive, settings=settings, seeds=seeds, recipes=names,
        clean_accuracy_pool=float(cal.clean_accuracy), clean_accuracy_eval=a0_eval, scale=float(cal.scale),
        clean=clean, targets=targets, frontier_attacker=attacker, frontier=frontier,
        averaging=averaging, averaging_sigma=avg_sigma, runs=thief.runs - runs_before,
        seconds=time.perf_counter() - start, calibration=cal, notes=notes, timings=timer.seconds,
    )


def _soft(logits, sigma, seed):
    # Drawn when a surrogate trains on them: a grid of conditions holds no answer matrices.
    return DrawnAnswers(logits, sigma, seed)


def _sigma_or_none(cal, retention: float) -> float | None:
    try:
        return float(sigma_for_target(cal, retention, kind="retention").sigma)
    except ValueError:
        return None


def _stats(name, outcomes: Sequence[Outcome], clean_acc, a0, teacher_acc, *, chosen=None) -> RecipeStats:
    acc = [o.accuracy for o in outcomes]
    drop = a0 - teacher_acc
    recovered = []
    if clean_acc is not None and drop > 1e-9:
        recovered = [1.0 - (c - a) / drop for c, a in zip(clean_acc, acc)]
    return RecipeStats(name, Spread.of(acc), Spread.of([o.agreement for o in outcomes]),
                       Spread.of(recovered), acc, chosen)


def _frontier_attacker(anchor: Condition, thief: Thief, seeds, logits) -> Recipe:
    if anchor.headline != TUNED:
        return fixed_recipe(anchor.headline)
    picks = [thief.chosen(_soft(logits, anchor.sigma, s), s) for s in seeds]
    pick = modal_choice(picks)
    return Recipe(f"tuned:{pick.name}", pick.temperature, pick.weight_decay)
