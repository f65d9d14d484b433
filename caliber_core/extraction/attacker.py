"""The thief: distills surrogates from answers, with fixed or self-tuned recipes.

:class:`Thief` sees the pool's inputs and the answers the API returned --
nothing else. The evaluation split is used only to *score* the surrogates
afterwards (accuracy against its true labels, agreement with the clean
teacher's prediction), which is the evaluator's side of the experiment.

Requests are batched: every surrogate asked for in one :meth:`Thief.train`
call (and every fold model of the tuned attacker) trains in a few
:func:`~caliber_core.extraction.distill.distill` batches. Training is a pure
function of (answers, recipe, seed), so results are memoized by the answers'
digest: conditions that produce bit-identical answers (per-input seeding at
any M) train once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch

from .answers import Answers
from .distill import one_hot, tempered_targets
from .prior_correction import lockstep_biases
from .recalibration import recalibrated_predictions
from .recipes import DEFAULT_FOLDS, TUNED, Recipe, candidates_for, fixed_recipe, fold_rows, select_by_agreement
from .schedule import Schedule
from .students import DEFAULT_HIDDEN, StudentBatch, StudentShape
# What a thief is asked and what it returns live apart from torch; imported from here too.
from .surrogate_requests import Outcome, Request, modal_choice, noise_group, training_seed  # noqa: F401
from .workers import DistillPool

# Students scored together (one prior-correction lockstep, :func:`~.prior_correction.lockstep_biases`).
_BATCH_LIMIT = 48
# Bytes of float32 targets one distill() call may hold: a large pool trains fewer students at a
# time (a student's numbers do not depend on its batch), so memory grows with one pool, not 48.
_TARGET_BYTES = 16 * 2**20


class Thief:
    """Distills surrogates from answers to queries on the pool.

    Parameters
    ----------
    pool_inputs : ndarray of shape (n_pool, n_features)
    eval_inputs : ndarray of shape (n_eval, n_features)
    eval_labels : ndarray of shape (n_eval,)
        For scoring only.
    eval_teacher : ndarray of shape (n_eval,)
        The clean teacher's argmax on the evaluation split, for agreement.
    n_classes : int
    architecture : {"mlp", "linear"}, default "mlp"
    hidden : int, default 128
    schedule : Schedule
    folds : int, default 3
        k of the tuned attacker's k-fold selection.
    on_runs : callable, optional
        Called with the number of training runs just finished (progress).
    processes : int, default 1
        Processes that train each batch (:class:`~.workers.DistillPool`);
        the numbers do not depend on it. Call :meth:`close` when done.

    Notes
    -----
    Inputs are standardized with the pool's own per-feature mean and standard
    deviation (floored at a tenth of the mean deviation, so constant pixels
    do not blow up) -- statistics the thief can compute from its queries.
    """

    def __init__(self, pool_inputs, eval_inputs, eval_labels, eval_teacher, *, n_classes: int,
                 architecture: str = "mlp", hidden: int = DEFAULT_HIDDEN, schedule: Schedule = Schedule(),
                 folds: int = DEFAULT_FOLDS, on_runs: Callable[[int], None] | None = None, processes: int = 1,
                 labelled: tuple[np.ndarray, np.ndarray] | None = None):
        torch.set_num_threads(1)
        # (pool rows, their labels): the few labelled inputs of a recalibrating thief, if any.
        self._labelled = None if labelled is None else (torch.from_numpy(np.asarray(labelled[0], dtype=np.int64)),
                                                        torch.from_numpy(np.asarray(labelled[1], dtype=np.int64)))
        x = np.asarray(pool_inputs, dtype=np.float64)
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        floor = 0.1 * float(std.mean()) if std.mean() > 0 else 1.0
        std = np.maximum(std, floor)
        self._pool = torch.from_numpy(((x - mean) / std).astype(np.float32))
        self._eval = torch.from_numpy(((np.asarray(eval_inputs, dtype=np.float64) - mean) / std).astype(np.float32))
        self._eval_labels = torch.from_numpy(np.asarray(eval_labels, dtype=np.int64))
        self._eval_teacher = torch.from_numpy(np.asarray(eval_teacher, dtype=np.int64))
        self.n_pool = self._pool.shape[0]
        self.shape = StudentShape(architecture, int(self._pool.shape[1]), int(n_classes), hidden)
        self.schedule = schedule
        self.folds = folds
        self.on_runs = on_runs
        self._memo: dict[tuple, Outcome] = {}
        self._choice: dict[tuple, Recipe] = {}
        self._group_choice: dict[tuple, Recipe] = {}
        self.runs = 0  # training runs actually performed (memo hits excluded)
        self._trainer = DistillPool(self._pool, processes=processes)

    # ------------------------------------------------------------------ public

    def train(self, requests: Sequence[Request]) -> list[Outcome]:
        """Train (or recall) one surrogate per request; outcomes in request order.

        The tuned attacker selects its recipe once per *group* of requests
        (:attr:`Request.group`; a request without one is its own group): k
        folds of the pool, fold f's models trained on the answers of member
        f mod (group size) and scored on that member's held-out answers, the
        agreements summed over folds. A group of one is the plain k-fold
        selection on its own answers; a group of one answer set per seed
        costs the same and uses every seed's answers. A group chosen earlier
        keeps its choice for later members (the same noise level).

        Parameters
        ----------
        requests : sequence of Request

        Returns
        -------
        list of Outcome
            One per request; identical requests are trained once (memoized).
        """
        tuned = [r for r in requests if r.recipe == TUNED]
        self._tune(tuned)
        plain: list[tuple[Answers, Recipe, int]] = []
        for r in requests:
            recipe = self._resolve(r)
            plain.append((r.answers, recipe, r.seed))
        todo = {}
        for answers, recipe, seed in plain:
            key = self._key(answers, recipe, seed)
            if key not in self._memo and key not in todo:
                todo[key] = (answers, recipe, seed)
        self._run_jobs(list(todo.items()))
        return [self._memo[self._key(a, rec, s)] for a, rec, s in plain]

    def close(self) -> None:
        """End the worker processes, if any (the thief still trains, in this process)."""
        self._trainer.close()

    def chosen(self, answers: Answers, seed: int) -> Recipe:
        """The candidate the tuned attacker chose for these answers and seed (after :meth:`train`).

        Parameters
        ----------
        answers : Answers
        seed : int

        Returns
        -------
        Recipe

        Raises
        ------
        KeyError
            No tuned request with these answers and seed was trained.
        """
        return self._choice[(answers.digest(), seed)]

    # ------------------------------------------------------------------ internals

    def _resolve(self, request: Request) -> Recipe:
        if isinstance(request.recipe, Recipe):
            recipe = request.recipe
        elif request.recipe == TUNED:
            recipe = self._choice[(request.answers.digest(), request.seed)]
        else:
            recipe = fixed_recipe(request.recipe)
        if request.answers.kind == "hard":
            return Recipe(recipe.name, 1.0, recipe.weight_decay)  # one-hot targets: T plays no role
        return recipe

    @staticmethod
    def _key(answers: Answers, recipe: Recipe, seed: int) -> tuple:
        return (answers.digest(), recipe.key(), int(seed))

    def _targets(self, jobs: Sequence[tuple[Answers, Recipe, int]]) -> np.ndarray:
        """The jobs' targets as one (S, n_pool, K) float32 block, each made from its answers in its slot."""
        block = np.empty((len(jobs), self.n_pool, self.shape.n_classes), dtype=np.float32)
        for j, (answers, recipe, _) in enumerate(jobs):
            if answers.kind == "hard":
                block[j] = one_hot(answers.labels, self.shape.n_classes)
            else:
                tempered_targets(answers.values, recipe.temperature, out=block[j])
        return block

    def _tune(self, requests: Sequence[Request]) -> None:
        """k-fold selection for every group of tuned requests not chosen yet, all fold models in batches."""
        pending: dict[tuple, list[Request]] = {}
        for r in requests:
            member = (r.answers.digest(), r.seed)
            if member in self._choice:
                continue
            gkey = r.group if r.group is not None else ("member",) + member
            if gkey in self._group_choice:
                self._choice[member] = self._group_choice[gkey]
                continue
            members = pending.setdefault(gkey, [])
            if all((m.answers.digest(), m.seed) != member for m in members):
                members.append(r)
        if not pending:
            return
        # Fold models take as many passes as the final surrogate will: (k - 1)/k of its
        # minimum steps on (k - 1)/k of the rows.
        fold_schedule = replace(self.schedule, min_steps=max(1, round(self.schedule.min_steps * (self.folds - 1)
                                                                      / self.folds)))
        jobs, layout = [], []
        for gkey, members in pending.items():
            cands = candidates_for(members[0].answers.kind)
            parts = fold_rows(self.n_pool, folds=self.folds, seed=training_seed(members[0].seed, 1))
            for c_i, cand in enumerate(cands):
                for f_i, held in enumerate(parts):
                    m = members[f_i % len(members)]
                    train_rows = np.setdiff1d(np.arange(self.n_pool), held, assume_unique=True)
                    jobs.append((m.answers, cand, training_seed(m.seed, 2 + f_i), train_rows, held))
                    layout.append((gkey, c_i, f_i))
        hits: dict[tuple, np.ndarray] = {}
        step = self._students_per_batch()
        for start in range(0, len(jobs), step):
            chunk = jobs[start:start + step]
            students = self._distill([(a, rec, s) for a, rec, s, _, _ in chunk],
                                     train_rows=[t for _, _, _, t, _ in chunk], schedule=fold_schedule)
            pred = students.predict_logits(self._pool).argmax(dim=2).numpy()
            del students
            for j, (answers, _, _, _, held) in enumerate(chunk):
                given = answers.labels if answers.kind == "hard" else np.argmax(answers.values, axis=1)
                gkey, c_i, f_i = layout[start + j]
                n_c = len(candidates_for(pending[gkey][0].answers.kind))
                table = hits.setdefault(gkey, np.zeros((n_c, self.folds), dtype=np.int64))
                table[c_i, f_i] = int(np.count_nonzero(pred[j, held] == given[held]))
        for gkey, members in pending.items():
            cands = candidates_for(members[0].answers.kind)
            best, _ = select_by_agreement(hits[gkey], cands)
            self._group_choice[gkey] = cands[best]
            for m in members:
                self._choice[(m.answers.digest(), m.seed)] = cands[best]

    def _students_per_batch(self) -> int:
        """Students per distill() call: as many as ``_TARGET_BYTES`` of targets allow (1 to 48)."""
        per_student = 4 * self.n_pool * self.shape.n_classes
        return max(1, min(_BATCH_LIMIT, _TARGET_BYTES // per_student))

    def _run_jobs(self, items: list[tuple[tuple, tuple[Answers, Recipe, int]]]) -> None:
        step = self._students_per_batch()
        for start in range(0, len(items), _BATCH_LIMIT):
            chunk = items[start:start + _BATCH_LIMIT]
            # Trained in parts of `step` students; each student's parameters are kept (they are
            # small) and its pool logits made again when the prior correction reads them.
            singles, evals, labelled = [], [], []
            for sub in range(0, len(chunk), step):
                students = self._distill([job for _, job in chunk[sub:sub + step]])
                evals.append(students.predict_logits(self._eval))
                singles.extend(StudentBatch.from_params(self.shape, [p[i:i + 1] for p in students.params])
                               for i in range(students.size))
                if self._labelled is not None:
                    rows = self._labelled[0]
                    labelled.append(students.predict_logits(self._pool)[:, rows].clone())
                del students
            eval_logits = torch.cat(evals)
            pred = eval_logits.argmax(dim=2)
            acc = (pred == self._eval_labels).float().mean(dim=1).numpy()
            agr = (pred == self._eval_teacher).float().mean(dim=1).numpy()
            bias = lockstep_biases(lambda j: singles[j].predict_logits(self._pool)[0].numpy(), len(singles))
            fixed = torch.from_numpy(np.argmax(eval_logits.numpy().astype(np.float64) + bias[:, None, :], axis=2))
            c_acc = (fixed == self._eval_labels).float().mean(dim=1).numpy()
            c_agr = (fixed == self._eval_teacher).float().mean(dim=1).numpy()
            r_acc = [None] * len(chunk)
            if self._labelled is not None:
                recal = recalibrated_predictions(torch.cat(labelled), self._labelled[1], eval_logits)
                r_acc = [float(v) for v in (recal == self._eval_labels).float().mean(dim=1).numpy()]
            for j, (key, (_, recipe, _)) in enumerate(chunk):
                self._memo[key] = Outcome(float(acc[j]), float(agr[j]), recipe, float(c_acc[j]), float(c_agr[j]),
                                          r_acc[j])

    def _distill(self, jobs: Sequence[tuple[Answers, Recipe, int]], *, train_rows=None, schedule=None):
        students = self._trainer.distill(
            self._targets(jobs),
            shape=self.shape,
            temperatures=[1.0 if a.kind == "hard" else rec.temperature for a, rec, _ in jobs],
            weight_decays=[rec.weight_decay for _, rec, _ in jobs],
            seeds=[training_seed(s) if train_rows is None else s for _, _, s in jobs],
            train_rows=train_rows,
            schedule=self.schedule if schedule is None else schedule,
        )
        self.runs += len(jobs)
        if self.on_runs is not None:
            self.on_runs(len(jobs))
        return students
