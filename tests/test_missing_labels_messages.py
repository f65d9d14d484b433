"""A file without labels tells the user what to do next: the defaults are retention targets,
agreement targets need no labels (``--agreement``), and a table is told it has no ``label`` column."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from caliber_core.cli import main

CNN = Path(__file__).resolve().parents[1] / "data" / "digits_cnn.npz"


def _error(argv, capsys) -> str:
    assert main([str(a) for a in argv]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert captured.out == "" and line.startswith("error: ")
    return line


def _table(path: Path, *, label_header: str | None, rows: int = 500) -> Path:
    demo = np.load(CNN)
    columns = [demo["logits"][:rows]] + ([demo["labels"][:rows, None]] if label_header else [])
    header = [f"c{j}" for j in range(10)] + ([label_header] if label_header else [])
    np.savetxt(path, np.hstack(columns), delimiter=",", header=",".join(header), comments="", fmt="%.6g")
    return path


def test_default_targets_on_unlabelled_logits_point_to_agreement(tmp_path, capsys):
    np.save(tmp_path / "z.npy", np.load(CNN)["logits"])
    line = _error(["calibrate", tmp_path / "z.npy", "--out", tmp_path / "c.json"], capsys)
    assert "each default target (retention 0.9, 0.8, 0.7, 0.6) needs labels" in line
    assert "--labels FILE" in line and "--agreement 0.9 0.8" in line
    assert not (tmp_path / "c.json").exists()
    # and the hint works: agreement targets calibrate the same file
    assert main(["calibrate", str(tmp_path / "z.npy"), "--agreement", "0.9", "--quiet",
                 "--out", str(tmp_path / "c.json")]) == 0


def test_an_asked_accuracy_target_names_agreement_too(tmp_path, capsys):
    np.save(tmp_path / "z.npy", np.load(CNN)["logits"])
    line = _error(["calibrate", tmp_path / "z.npy", "--target-accuracy", "0.9"], capsys)
    assert "an accuracy or retention target needs labels" in line and "--agreement" in line


def test_a_csv_without_a_label_column_says_so(tmp_path, capsys):
    line = _error(["calibrate", _table(tmp_path / "y.csv", label_header="y")], capsys)
    assert "no labels in the file" in line and "no column is named `label`" in line
    line = _error(["calibrate", _table(tmp_path / "none.csv", label_header=None)], capsys)
    assert "no column is named `label`" in line and "--agreement" in line


def test_a_short_csv_without_a_label_column_says_so_beside_the_shape(tmp_path, capsys):
    line = _error(["calibrate", _table(tmp_path / "short.csv", label_header="target", rows=8)], capsys)
    assert "8 rows and 11 class columns" in line
    assert "no column is named `label`, so every column was counted as a class" in line
    # with a label column the shape is all that is said
    line = _error(["calibrate", _table(tmp_path / "short2.csv", label_header="label", rows=8)], capsys)
    assert "8 rows and 10 class columns" in line and "named `label`" not in line
