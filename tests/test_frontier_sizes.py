"""The thief across campaign sizes: the synthetic archive generator and ``extract --pool-sizes``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.cli.commands import main
from caliber_core.extraction.archive import load_archive
from caliber_core.extraction.pool_sizes import check_pool_sizes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import make_extraction_archive  # noqa: E402


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("sizes") / "synthetic.npz"
    np.savez_compressed(path, **make_extraction_archive.make_archive(pool=400, heldout=300, train=800, steps=80))
    return path


def test_the_generator_writes_an_archive_extract_reads_and_is_a_function_of_its_seed(small_archive):
    archive = load_archive(small_archive)
    assert archive.pool.n_samples == 400 and archive.evaluation.n_samples == 300
    assert archive.n_features == make_extraction_archive.N_FEATURES and archive.n_classes == 10
    accuracy = float(np.mean(archive.evaluation.logits.argmax(1) == archive.evaluation.labels))
    assert 0.3 < accuracy < 1.0  # a teacher that learned something, on a task it does not solve outright
    again = make_extraction_archive.make_archive(pool=400, heldout=300, train=800, steps=80)
    np.testing.assert_array_equal(again["logits"], archive.pool.logits.astype(np.float32))
    other = make_extraction_archive.make_archive(pool=400, heldout=300, train=800, steps=80, seed=1)
    assert not np.array_equal(other["inputs"], again["inputs"])


def test_the_generator_refuses_a_split_too_small_in_one_line(tmp_path, capsys):
    assert make_extraction_archive.main(["--pool", "50", "--out", str(tmp_path / "x.npz")]) == 2
    assert capsys.readouterr().err.strip() == "error: --pool must be an integer of at least 100 rows, got 50"
    assert not (tmp_path / "x.npz").exists()


def test_check_pool_sizes_sorts_and_refuses_what_the_pool_cannot_serve():
    assert check_pool_sizes([2000, 500, 500], 3000, 10) == [500, 2000]
    with pytest.raises(ValueError) as err:
        check_pool_sizes([500, 2000, 8000, 32000], 3000, 10, name="demo")
    assert str(err.value) == ("demo holds 3000 pool rows: it can serve pool sizes 100 to 3000 (of those asked it can "
                              "serve 500, 2000; 8000, 32000 need a larger archive, e.g. from "
                              "scripts/make_extraction_archive.py)")
    with pytest.raises(ValueError, match="it serves none of those asked; 8000 needs a larger archive"):
        check_pool_sizes([8000], 3000, 10)
    with pytest.raises(ValueError, match="50 rows is too few for 10 classes; a pool size must be at least 100"):
        check_pool_sizes([50, 500], 3000, 10)


def _extract(capsys, archive, *extra):
    """``caliber extract`` in this process: (exit status, stdout, stderr)."""
    try:
        rc = main(["extract", str(archive), *extra])
    except SystemExit as exc:  # argparse's option errors
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("extra, message", [
    (["--pool-sizes", "200,4000,32000"], "synthetic holds 400 pool rows: it can serve pool sizes 100 to 400 "
                                         "(of those asked it can serve 200; 4000, 32000 need a larger archive"),
    (["--pool-sizes", "200", "--seeding", "consistent"], "--pool-sizes compares noise designs by name"),
])
def test_extract_pool_sizes_refuses_in_one_line(small_archive, capsys, extra, message):
    rc, _, err = _extract(capsys, small_archive, *extra)
    assert rc == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("word, message", [
    ("200,x", "argument --pool-sizes: not an integer: 'x'"),
    (",", "expected comma-separated pool sizes such as 500,2000,8000"),
])
def test_a_malformed_pool_size_list_is_an_option_error(small_archive, capsys, word, message):
    rc, _, err = _extract(capsys, small_archive, "--pool-sizes", word)
    assert rc == 2
    assert message in err.strip().splitlines()[-1]  # argparse's usage, then the one error line


def test_extract_measures_the_frontier_at_each_pool_size(small_archive, tmp_path, capsys):
    report = tmp_path / "sizes.json"
    rc, stdout, err = _extract(capsys, small_archive, "--pool-sizes", "150,400", "--frontier", "field-4",
                               "--keys", "1", "--seeds", "1", "--m", "1", "--processes", "1", "--quiet",
                               "--json", str(report))
    assert rc == 0, err
    assert "| 150 | field-4 | 0.75 |" in stdout and "| 400 | field-4 | 0.75 |" in stdout
    doc = json.loads(report.read_text())
    assert doc["schema"] == "caliber.frontier-sizes/v1"
    assert [s["pool_rows"] for s in doc["sizes"]] == [150, 400]
    for size in doc["sizes"]:
        (point,) = size["points"]
        assert point["design"] == "field-4" and 0.0 < point["thief"]["mean"] < 1.5
        assert 0.5 < point["teacher"]["mean"] < 1.0  # sigma solved on this size's rows for 0.75 of A0
    # σ is solved on each size's own rows: the two sizes calibrate apart
    assert doc["sizes"][0]["points"][0]["sigma_over_s"] != doc["sizes"][1]["points"][0]["sigma_over_s"]


def test_the_extraction_page_reads_the_sizes_figure(tmp_path):
    from caliber_dashboard.extraction.frontier_sizes import SIZES_JSON, measured_sizes, sizes_figure

    assert measured_sizes(tmp_path / "absent.json") is None
    (tmp_path / "other.json").write_text(json.dumps({"schema": "caliber.frontier/v1", "frontiers": []}))
    assert measured_sizes(tmp_path / "other.json") is None
    measured = measured_sizes(SIZES_JSON)  # the committed benchmark output
    assert measured is not None and {"per-input", "field-4"} <= set(measured["curves"])
    for pts in measured["curves"].values():
        sizes = [p[0] for p in pts]
        assert sizes == sorted(sizes) and sizes[0] == 500
        assert all(lo <= mean <= hi for _, _, mean, lo, hi in pts)
    fig = sizes_figure(measured)
    assert len(fig.data) == 2 * len(measured["curves"]) and fig.layout.xaxis.type == "log"


def test_the_generator_makes_a_second_teacher_of_another_task_and_architecture(tmp_path, capsys):
    arrays = make_extraction_archive.make_archive(pool=400, heldout=400, train=800, steps=20, n_classes=20,
                                                  hidden=16, layers=3, seed=1)
    assert arrays["logits"].shape == (400, 20) and set(np.unique(arrays["labels"])) <= set(range(20))
    assert make_extraction_archive.main(["--pool", "400", "--classes", "1", "--out", str(tmp_path / "x.npz")]) == 2
    assert capsys.readouterr().err.strip() == "error: --classes must be an integer of at least 2, got 1"
