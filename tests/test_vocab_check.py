"""``check`` on a full-vocabulary dump streams it (``vocab_check``): same findings, no Monte-Carlo rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from caliber_core.calibration import vocab_check
from caliber_core.calibration.drift import check_drift
from caliber_core.calibration.gap_histogram import ReducedRows, reduce_block
from caliber_core.cli import EXIT_USER_ERROR, main
from caliber_core.cli.check import EXIT_DRIFT

K = 8192  # full_vocab.STREAM_MIN_CLASSES: the CLI streams from here on


def labelled(n, k, seed, lift=2.5):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, k), dtype=np.float32)
    y = rng.integers(0, k, n)
    z[np.arange(n), y] += lift
    return z, y


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab_check")
    z, y = labelled(300, K, seed=5)
    np.save(d / "z.npy", z)
    np.save(d / "y.npy", y)
    z2, y2 = labelled(300, K, seed=6)  # a second sample of the same population
    np.save(d / "z2.npy", z2)
    np.save(d / "y2.npy", y2)
    np.save(d / "sharp.npy", 2.0 * z2)  # the model changed: margins doubled
    cfg = d / "cfg.json"
    assert main(["calibrate", str(d / "z.npy"), "--labels", str(d / "y.npy"), "--retention", "0.9", "0.7",
                 "--out", str(cfg), "--quiet"]) == 0
    agree = d / "agree.json"
    assert main(["calibrate", str(d / "z.npy"), "--agreement", "0.8", "--side", "at-least",
                 "--out", str(agree), "--quiet"]) == 0
    return d


def _no_monte_carlo(monkeypatch):
    import caliber_core.calibration.drift as drift

    def refuse(*a, **k):
        raise AssertionError("the dense engine ran on a full-vocabulary dump")

    monkeypatch.setattr(drift, "CurveEngine", refuse)


def test_a_new_sample_of_the_same_population_is_consistent(files, capsys, monkeypatch):
    _no_monte_carlo(monkeypatch)
    capsys.readouterr()
    code = main(["check", str(files / "cfg.json"), str(files / "z2.npy"), "--labels", str(files / "y2.npy")])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.strip().splitlines()
    assert sum("target (sigma=" in line for line in lines) == 2  # retention at each of the two targets
    assert lines[-1].startswith(f"consistent with {files / 'cfg.json'}: 4 comparisons at 95% (simultaneous), "
                                "N=300 against the config's N=300")
    code = main(["check", str(files / "cfg.json"), str(files / "z2.npy"), "--labels", str(files / "y2.npy"),
                 "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["rows"] == vocab_check.ROW_METHOD and report["comparisons"] == 4


def test_a_changed_model_is_drift_with_one_line_per_finding(files, capsys, monkeypatch):
    _no_monte_carlo(monkeypatch)
    capsys.readouterr()
    code = main(["check", str(files / "cfg.json"), str(files / "sharp.npy"), "--labels", str(files / "y2.npy")])
    out = capsys.readouterr().out
    assert code == EXIT_DRIFT
    assert any(line.startswith("margin scale S (median)") and line.endswith("recalibrate")
               for line in out.splitlines())
    assert any("retention" in line and line.endswith("recalibrate") for line in out.splitlines())


def test_an_agreement_config_is_checked_without_labels(files, capsys):
    capsys.readouterr()
    code = main(["check", str(files / "agree.json"), str(files / "z2.npy")])
    out = capsys.readouterr().out
    assert code == 0, out
    # The one-sided target has no reference: its certified interval's midpoint is the calibration value.
    assert "agreement 0.8 target" in out and "2 comparisons" in out.splitlines()[-1]


def test_other_k_and_bad_files_get_one_line(files, tmp_path, capsys):
    np.save(tmp_path / "wide.npy", labelled(20, K + 1, seed=1)[0])
    assert main(["check", str(files / "cfg.json"), str(tmp_path / "wide.npy")]) == EXIT_USER_ERROR
    assert "config's 8192 classes" in capsys.readouterr().err
    (tmp_path / "cut.npy").write_bytes((files / "z2.npy").read_bytes()[:1_000_000])
    assert main(["check", str(files / "cfg.json"), str(tmp_path / "cut.npy")]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_streamed_values_match_the_exact_engine_within_the_bounds():
    z, y = labelled(120, 600, seed=9, lift=1.5)
    g, c, h, slots = reduce_block(z, m=32, labels=y)
    reduced = ReducedRows(g, c, z.shape[1], h, slots)
    from caliber_core.calibration.full_vocab import config_for_full_vocab

    _, config = config_for_full_vocab(reduced, [("accuracy", 0.3), ("retention", 0.6)], name="m")
    streamed = vocab_check.check_reduced(dict(config), reduced)
    exact = check_drift(dict(config), z.astype(np.float64), y)
    assert [f.quantity for f in streamed.findings] == [f.quantity for f in exact.findings]
    for s, e in zip(streamed.findings, exact.findings):
        assert s.observed == pytest.approx(e.observed, abs=2e-3), (s, e)
        assert (s.high - s.low) >= (e.high - e.low) - 1e-9  # the bounds only widen the range
