"""The extraction archive's refusals and ``python -m caliber_core extract`` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_core.extraction.archive import load_archive, load_archive_bytes
from caliber_core.loading import LogitsFileError, load_logits

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "data" / "digits_cnn.npz"


def _arrays():
    with np.load(DEMO, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def test_demo_archives_carry_what_extraction_needs_and_still_load_as_logits():
    for path in sorted((ROOT / "data").glob("digits_*.npz")):
        a = load_archive(path)
        assert a.pool.inputs.shape == (500, 64) and a.evaluation.inputs.shape == (500, 64)
        assert load_logits(path).logits.shape == (500, 10)  # the extra arrays do not disturb the loader


def test_a_file_without_inputs_gets_one_line_naming_what_is_missing(tmp_path):
    arrays = _arrays()
    del arrays["inputs"], arrays["heldout_inputs"]
    path = tmp_path / "no_inputs.npz"
    np.savez(path, **arrays)
    with pytest.raises(LogitsFileError) as err:
        load_archive(path)
    msg = str(err.value)
    assert "\n" not in msg and "without inputs, heldout_inputs" in msg


def test_missing_evaluation_arrays_point_at_eval(tmp_path):
    arrays = _arrays()
    for k in ("heldout_inputs", "heldout_logits", "heldout_labels"):
        del arrays[k]
    np.savez(tmp_path / "pool.npz", **arrays)
    with pytest.raises(LogitsFileError, match=r"heldout_inputs, heldout_logits, heldout_labels \(or give --eval FILE\)"):
        load_archive(tmp_path / "pool.npz")
    # A second file supplies the evaluation split (plain inputs/logits/labels names accepted).
    full = _arrays()
    np.savez(tmp_path / "eval.npz", inputs=full["heldout_inputs"], logits=full["heldout_logits"],
             labels=full["heldout_labels"])
    a = load_archive(tmp_path / "pool.npz", eval_path=tmp_path / "eval.npz")
    np.testing.assert_array_equal(a.evaluation.labels, full["heldout_labels"])


def test_inconsistent_inputs_are_refused(tmp_path):
    arrays = _arrays()
    arrays["heldout_inputs"] = arrays["heldout_inputs"][:, :32]
    np.savez(tmp_path / "a.npz", **arrays)
    with pytest.raises(LogitsFileError, match="32 features but the pool's have 64"):
        load_archive(tmp_path / "a.npz")
    arrays = _arrays()
    arrays["inputs"] = arrays["inputs"][:10]
    np.savez(tmp_path / "b.npz", **arrays)
    with pytest.raises(LogitsFileError, match="inputs has 10 rows but its logits have 500"):
        load_archive(tmp_path / "b.npz")
    arrays = _arrays()
    arrays["inputs"][3, 5] = np.nan
    np.savez(tmp_path / "c.npz", **arrays)
    with pytest.raises(LogitsFileError, match="inputs row 3, column 5 is nan"):
        load_archive(tmp_path / "c.npz")
    with pytest.raises(LogitsFileError, match="needs an .npz archive"):
        load_archive_bytes(b"1,2\n", "x.csv")


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "caliber_core", "extract", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_cli_refuses_a_file_without_inputs_with_exit_2(tmp_path):
    arrays = _arrays()
    del arrays["inputs"]
    np.savez(tmp_path / "x.npz", **arrays)
    out = _cli(tmp_path / "x.npz")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "without inputs" in out.stderr


def test_cli_report_and_a_surrogate_target_served_by_the_perturber(tmp_path):
    from caliber_core.config import load_config, sigma_to_serve
    from caliber_core.serving.runtime import Perturber

    report, config = tmp_path / "r.json", tmp_path / "c.json"
    out = _cli(DEMO, "--retention", "0.75", "--surrogate-retention", "0.9", "--seeds", "2", "--m", "1", "4",
               "--attack", "fixed", "--json", report, "--out", config, "--quiet")
    assert out.returncode == 0, out.stderr
    assert "Table 3 analogue" in out.stdout and "Table 4 analogue" in out.stdout
    rep = json.loads(report.read_text())
    assert rep["schema"] == "caliber.extraction/v1"
    sur = rep["targets"][-1]
    assert sur["kind"] == "surrogate-retention" and sur["sigma"] > rep["targets"][0]["sigma"]
    cfg = load_config(config)
    kinds = [t["kind"] for t in cfg["targets"]]
    assert kinds == ["retention", "surrogate-retention"]
    entry = cfg["targets"][1]
    assert entry["attacker"]["recipe"]["name"] in ("light", "strong")
    assert entry["attacker"]["seeds"] == rep["replicate_seeds"]
    assert sigma_to_serve(cfg, target=1) == pytest.approx(sur["sigma"])
    p = Perturber.from_config(cfg, target=1, key=b"test key, 16+ bytes")
    assert p.sigma == pytest.approx(sur["sigma"])
