"""AppTest: the Data page's per-file messages, labels that arrive after their logits, the histogram."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from caliber_core.loading import LogitsFileError, load_logits_bytes
from caliber_dashboard.common import state, tables
from caliber_dashboard.data import uploads

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
N_DEMO = len(list((Path(APP).parents[1] / "data").glob("digits_*.npz")))
BIN = "application/octet-stream"


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    return at


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _bare(seed: int, n: int = 240, k: int = 4) -> tuple[bytes, np.ndarray]:
    """Answer-letter logits (K=4) with no labels inside, and their labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)).astype(np.float16)
    z[np.arange(n), y] += np.float16(2.0)
    return _npy(z), y


def _bad_npz(seed: int) -> bytes:
    z = np.random.default_rng(seed).normal(size=(50, 3))
    z[1, 1] = np.nan
    buf = io.BytesIO()
    np.savez(buf, logits=z, labels=np.zeros(50, dtype=np.int64))
    return buf.getvalue()


def _text(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


def _errors(at) -> list[str]:
    return [_text(e.value) for e in at.error]


def _models(at) -> dict:
    return at.session_state[state.MODELS]


def test_each_error_belongs_to_its_file_and_leaves_with_it():
    at = _app()
    first, second = ("a.npz", _bad_npz(1), BIN), ("b.npz", _bad_npz(2), BIN)
    at.file_uploader(key="upload_logits").set_value([first, second]).run()
    assert [e.split(":")[0] for e in _errors(at)] == ["a.npz", "b.npz"]
    at.file_uploader(key="upload_logits").set_value([second]).run()  # a.npz taken out of the uploader
    assert [e.split(":")[0] for e in _errors(at)] == ["b.npz"]
    at.run()  # a rerun loses nothing, adds nothing
    assert [e.split(":")[0] for e in _errors(at)] == ["b.npz"]
    good, _ = _bare(3)
    at.file_uploader(key="upload_logits").set_value([second, ("good.npy", good, BIN)]).run()
    assert [e.split(":")[0] for e in _errors(at)] == ["b.npz"]
    assert any("Loaded good" in _text(s.value) for s in at.success)
    at.run()
    assert any("Loaded good" in _text(s.value) for s in at.success)  # kept while the file is there


def test_labels_uploaded_after_the_logits_left_the_uploader_attach_to_the_matching_model():
    at = _app()
    content, y = _bare(4)
    other, _ = _bare(5, n=300)
    at.file_uploader(key="upload_logits").set_value([("answers.npy", content, BIN), ("other.npy", other, BIN)]).run()
    at.file_uploader(key="upload_logits").set_value([]).run()  # as after a reload: the uploader is empty
    sha = next(s for s, d in _models(at).items() if d.source == "answers.npy")
    assert not _models(at)[sha].has_labels
    at.file_uploader(key="upload_labels").set_value(("answers_labels.npy", _npy(y), BIN)).run()
    assert not at.exception
    labelled = _models(at)[sha]
    assert labelled.has_labels and np.array_equal(labelled.labels, y)
    assert len(_models(at)) == N_DEMO + 2
    done = [_text(s.value) for s in at.success]
    assert any(t.startswith("Labels from answers_labels.npy attached to answers") and "240 rows" in t
               for t in done), done
    # A reload (same workspace) keeps the labels.
    token = at.query_params["ws"]
    again = AppTest.from_file(APP, default_timeout=60)
    again.query_params["ws"] = token
    again.run()
    assert again.session_state[state.MODELS][sha].has_labels


def test_labels_that_fit_no_model_or_several_say_what_to_do():
    at = _app()
    a, _ = _bare(6)
    b, _ = _bare(7)
    at.file_uploader(key="upload_logits").set_value([("a.npy", a, BIN), ("b.npy", b, BIN)]).run()
    at.file_uploader(key="upload_logits").set_value([]).run()
    at.file_uploader(key="upload_labels").set_value(("y.npy", _npy(np.zeros(240, dtype=np.int64)), BIN)).run()
    assert not at.exception
    (error,) = _errors(at)
    assert error.startswith("y.npy: 240 labels fit 2 loaded models without labels") and "a_labels.npy" not in error
    assert "Name the labels file after its logits file" in error
    at.file_uploader(key="upload_labels").set_value(("y.npy", _npy(np.zeros(99, dtype=np.int64)), BIN)).run()
    (error,) = _errors(at)
    assert error == ("y.npy: 99 labels, but no loaded model without labels has 99 rows. Upload its logits "
                     "file on the left while this labels file is here.")
    at.file_uploader(key="upload_labels").set_value(None).run()
    assert _errors(at) == []


def test_one_based_labels_get_a_hint():
    at = _app()
    content, y = _bare(8)
    at.file_uploader(key="upload_labels").set_value(("y.npy", _npy(y + 1), BIN))
    at.file_uploader(key="upload_logits").set_value(("letters.npy", content, BIN)).run()
    assert not at.exception
    with_labels = None
    try:
        load_logits_bytes(content, "letters.npy", labels_content=_npy(y + 1), labels_filename="y.npy")
    except LogitsFileError as exc:
        with_labels = str(exc)
    (error,) = _errors(at)
    assert with_labels is not None and error.startswith(with_labels.rstrip("."))
    assert error.startswith(with_labels.rstrip(".") + ". These labels look 1-based")  # two sentences
    assert "look 1-based (a label equals K=4): class indices run 0..3 here, so subtract 1" in error
    assert uploads.one_based_hint("labels index 3 is 7, outside [0, 4) for K=4 classes") == ""


def test_the_histogram_follows_every_upload_and_keeps_the_users_choice():
    at = _app()
    demo = list(_models(at))
    at.multiselect(key="hist_models").set_value(demo[:2]).run()
    content, _ = _bare(9)
    at.file_uploader(key="upload_logits").set_value(("late.npy", content, BIN)).run()
    sha = next(s for s, d in _models(at).items() if d.source == "late.npy")
    assert at.multiselect(key="hist_models").value == demo[:2] + [sha]
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert len(fig["data"]) == 3 and any(t["name"].startswith("late") for t in fig["data"])
    assert tables.shown_models(None, None, [str(i) for i in range(12)]) == [str(i) for i in range(10)]
    assert tables.shown_models(["a"], ["a", "b"], ["a", "c"]) == ["a", "c"]  # b removed, c new


def test_labels_go_to_their_own_model_and_the_box_is_cleared():
    at = _app()
    content, y = _bare(11)
    other, _ = _bare(12, n=300)
    # The labels first, then two logits files: only the one with as many rows takes them.
    at.file_uploader(key="upload_labels").set_value(("answers_labels.npy", _npy(y), BIN))
    at.file_uploader(key="upload_logits").set_value([("answers.npy", content, BIN), ("other.npy", other, BIN)])
    at.run()
    assert not at.exception and _errors(at) == []
    by_source = {d.source: d for d in _models(at).values()}
    assert by_source["answers.npy"].has_labels and np.array_equal(by_source["answers.npy"].labels, y)
    assert not by_source["other.npy"].has_labels
    # The labels box is a new, empty uploader now.
    assert at.session_state[uploads.LABELS_ROUND] == 1
    assert at.file_uploader(key="upload_labels_1").value is None
    # A later logits file is not matched against the used labels: no error under any model.
    late, _ = _bare(13, n=180)
    at.file_uploader(key="upload_logits").set_value(
        [("answers.npy", content, BIN), ("other.npy", other, BIN), ("late.npy", late, BIN)]).run()
    assert not at.exception and _errors(at) == []
    assert [d.source for d in _models(at).values() if d.has_labels and d.source == "answers.npy"] == ["answers.npy"]
    assert any("Loaded late" in _text(s.value) for s in at.success)
