"""The thief: surrogates distilled from the defended API's answers.

Modules, one concept each:

* :mod:`.archive`    the inputs + logits archive (query pool and evaluation split)
* :mod:`.answers`    answers from cached logits through the Perturber; averaging, votes
* :mod:`.students`   the surrogate models (MLP D-128-K, linear), batched
* :mod:`.distill`    Eq. 1 distillation with Adam, many students per step
* :mod:`.workers`    distillation batches split over two processes
* :mod:`.recipes`    fixed recipes and the self-tuned attacker's k-fold selection
* :mod:`.attacker`   the thief: recipes on answers, memoized surrogates, scoring
* :mod:`.frontier`   the defense frontier and the noisy root for a surrogate target
* :mod:`.averaging`  M repeated queries, fresh against per-input seeding
* :mod:`.spread`     mean and sd over replicate seeds
* :mod:`.experiment` conditions, seeds, phases: the whole experiment
* :mod:`.report`     the ``caliber.extraction/v1`` JSON and the printed tables
* :mod:`.prior_correction` the thief's class-frequency matching (Saerens et al.)
* :mod:`.recalibration` matrix scaling by a thief with a few labels (Guo et al.)
* :mod:`.seedings`   per-input against consistent seeding, side by side, spread over keys
* :mod:`.seedings_report` its table and ``caliber.seedings/v1`` JSON
* ``caliber extract``  :mod:`caliber_core.cli.extract`
* :mod:`.peer`       a peer attacker for checks: ART's KnockoffNets, tuned on its own answers

torch is imported by the training modules only; importing this package is cheap.
"""
