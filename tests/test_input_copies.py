"""The thief that asks jittered copies of its queries against designs keyed on the input."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.extraction.input_copies import (COPY_PLANS, CopyPlan, archive_teacher, averaged, copy_thief_scores,
                                                  jittered_copies, scale_from_structure, structure_function)
from caliber_core.extraction.input_designs import InputDesign

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import make_extraction_archive  # noqa: E402


@pytest.fixture(scope="module")
def linear_task():
    """A teacher linear in its inputs: averaging symmetric copies gives back its answer at the input exactly."""
    gen = np.random.default_rng(5)
    w = gen.normal(size=(8, 5))
    x = gen.normal(size=(3000, 8))
    z = x @ w
    y = z.argmax(1)
    return x, w, z, y


def test_copies_keep_the_input_first_and_jitter_the_rest_at_the_asked_spread(linear_task):
    x = linear_task[0][:500]
    c = jittered_copies(x, CopyPlan(4, 0.5), seed=1)
    assert c.shape == (2000, 8)
    np.testing.assert_array_equal(c[::4], x)
    offsets = (c.reshape(500, 4, 8)[:, 1:] - x[:, None, :]).reshape(-1, 8)
    np.testing.assert_allclose(offsets.std(axis=0) / x.std(axis=0), 0.5, rtol=0.1)
    np.testing.assert_array_equal(jittered_copies(x, CopyPlan(4, 0.5), seed=1), c)
    np.testing.assert_allclose(averaged(np.arange(8.0).reshape(4, 2), 2), [[1, 2], [5, 6]])


def test_averaging_copies_undoes_a_rough_field_but_not_a_smooth_one(linear_task):
    x, w, z, y = linear_task
    teacher = lambda inputs: inputs @ w  # noqa: E731
    plan = CopyPlan(16, 0.5)
    xs = x[:500]
    c = jittered_copies(xs, plan, seed=2)
    blur = np.sqrt(np.mean((averaged(teacher(c), 16) - teacher(xs)) ** 2))  # a linear teacher is not blurred,
    assert blur < 0.2 * np.sqrt(np.mean(teacher(xs) ** 2))  # only sampled
    errors = {}
    for length in (0.1, 3.0):
        noise = InputDesign(f"t{length}", "input-field", length).calibrate(x, z, y, b"k" * 16, target=0.7)
        single = np.sqrt(np.mean((noise.serve(xs, teacher(xs)) - teacher(xs)) ** 2))
        mean = np.sqrt(np.mean((averaged(noise.serve(c, teacher(c)), 16) - teacher(xs)) ** 2))
        errors[length] = mean / single
    assert errors[0.1] < 0.45  # copies 0.5 sd apart draw nearly independent noise from a field of length 0.1
    assert errors[3.0] > 0.9  # and nearly the same noise from one of length 3


def test_the_scale_read_off_the_answers_lands_near_a_planted_field_and_is_withheld_without_a_plateau(linear_task):
    x, w, z, y = linear_task
    jitters = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4]
    for length in (0.3, 1.0):
        noise = InputDesign("t", "input-field", length).calibrate(x, z, y, b"k" * 16, target=0.7)
        # the field alone (a teacher that barely moves): the scale comes out near the planted one
        curve = structure_function(lambda q: noise.serve(q, np.zeros((len(q), 5))), x[:400], jitters, seed=3)
        estimate = scale_from_structure(jitters, curve)
        assert estimate is not None and length / 1.5 < estimate < length * 1.5
    # a linear teacher keeps growing: no plateau, no scale
    assert scale_from_structure(jitters, structure_function(lambda q: q @ w, x[:400], jitters)) is None
    with pytest.raises(ValueError, match="increasing jitters"):
        scale_from_structure([1.0, 0.5, 2.0], [1, 2, 3])


def test_the_archive_carries_its_teacher_and_the_copy_thief_trains_on_every_plan(tmp_path):
    from caliber_core.extraction.archive import load_archive

    path = tmp_path / "a.npz"
    arrays = make_extraction_archive.make_archive(pool=400, heldout=300, train=800, steps=40)
    np.savez_compressed(path, **arrays)
    teacher = archive_teacher(str(path))
    np.testing.assert_allclose(teacher(arrays["inputs"]), arrays["logits"], atol=1e-4)
    bare = tmp_path / "bare.npz"
    np.savez_compressed(bare, **{k: v for k, v in arrays.items() if not k.startswith("teacher_")})
    assert archive_teacher(str(bare)) is None
    archive = load_archive(str(path))
    plans = (CopyPlan(4, 0.5), CopyPlan(2, 0.25, average=False))
    scores = copy_thief_scores(lambda q, logits: logits, teacher, archive.pool.inputs, archive.evaluation,
                               archive.n_classes, (0,), plans=plans)
    assert set(scores) == {f"{p.name}{r}{suffix}" for p in plans for r in ("T4-wd1e-2", "T1-wd1e-3", "hard-wd1e-2")
                           for suffix in ("", "+prior")}
    assert all(len(v) == 1 and 0.0 <= v[0] <= 1.0 for v in scores.values())
    # clean answers at the copies: the averaged thief learns the task (10 classes: chance is 0.1)
    assert scores["copies4x0.5:T4-wd1e-2"][0] > 0.3


def test_bad_plans_are_refused_in_one_line():
    with pytest.raises(ValueError, match="copies must be a positive integer"):
        CopyPlan(0, 0.5)
    with pytest.raises(ValueError, match="jitter must be"):
        CopyPlan(4, float("nan"))
    with pytest.raises(ValueError, match="do not split into blocks"):
        averaged(np.zeros((5, 2)), 2)
    assert len({p.name for p in COPY_PLANS}) == len(COPY_PLANS)


def test_every_design_of_an_input_frontier_meets_the_copy_thief_where_the_archive_has_a_teacher(tmp_path):
    from caliber_core.extraction.input_frontier import measure_input_frontier

    path = tmp_path / "a.npz"
    np.savez_compressed(path, **make_extraction_archive.make_archive(pool=300, heldout=200, train=600, steps=20))
    frontier = measure_input_frontier(str(path), designs=["field-4", "input-field-1"], keys=1, seeds=1,
                                      near_duplicates=0)
    for point in frontier.points:
        names = set(point.attackers)
        assert {p.name + "T4-wd1e-2" for p in COPY_PLANS} <= names, point.design
        assert "hard-wd1e-2+prior" in names  # beside every earlier thief
