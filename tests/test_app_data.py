"""AppTest: the Data page — demo set on a first visit, uploads, bad files, removal."""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from caliber_core.loading import LogitsFileError, load_logits_bytes
from caliber_dashboard.common import state

APP = str(Path(__file__).resolve().parent.parent / "caliber_dashboard" / "app.py")
N_DEMO = len(list((Path(APP).parents[1] / "data").glob("digits_*.npz")))


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    return at


def _npz(seed: int, *, n: int = 300, k: int = 5, labels: bool = True, nan: bool = False) -> bytes:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k))
    z[np.arange(n), y] += 2.0
    if nan:
        z[7, 2] = np.nan
    buf = io.BytesIO()
    if labels:
        np.savez(buf, logits=z, labels=y)
    else:
        np.savez(buf, logits=z)
    return buf.getvalue()


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=isinstance(array, np.ndarray) and array.dtype == object)
    return buf.getvalue()


def _models(at) -> dict:
    return at.session_state[state.MODELS]


def _text(markdown: str) -> str:
    """What the browser shows for Markdown the app escaped with ui.plain."""
    return re.sub(r"\\(.)", r"\1", markdown)


def _errors(at) -> list[str]:
    return [_text(e.value) for e in at.error]


def test_first_visit_loads_demo_set():
    at = _app()
    models = _models(at)
    assert len(models) == N_DEMO == 7
    assert all(d.has_labels for d in models.values())
    table = at.dataframe[0].value
    assert len(table) == N_DEMO
    assert set(table["model"]) == {d.name for d in models.values()}
    assert list(table["sha256"]) == [d.sha256[:12] for d in models.values()]
    assert table["N"].tolist() == [500] * N_DEMO and table["K"].tolist() == [10] * N_DEMO
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert len(fig["data"]) == N_DEMO and fig["data"][0]["type"] == "scatter"
    # Seven models: one row each on one shared x axis, named on the y axis.
    assert {t.get("xaxis", "x") for t in fig["data"]} == {"x"}
    assert fig["layout"]["yaxis"]["ticktext"] == [t["name"] for t in fig["data"]]
    assert "margin" in fig["layout"]["xaxis"]["title"]["text"]


def test_upload_adds_model_and_reupload_does_not_duplicate():
    at = _app()
    content = _npz(1)
    at.file_uploader(key="upload_logits").set_value(("fresh.npz", content, "application/octet-stream")).run()
    assert not at.exception
    models = _models(at)
    assert len(models) == N_DEMO + 1
    new = [d for d in models.values() if d.source == "fresh.npz"][0]
    assert (new.n_samples, new.n_classes, new.has_labels) == (300, 5, True)
    assert any("fresh" in _text(s.value) for s in at.success)
    # Rerun: the uploader still holds the file, nothing is added again.
    at.run()
    assert len(_models(at)) == N_DEMO + 1
    # The same bytes uploaded again (a new file_id): recognized by sha256.
    at.file_uploader(key="upload_logits").set_value(("again.npz", content, "application/octet-stream")).run()
    assert len(_models(at)) == N_DEMO + 1
    assert any("already loaded" in _text(i.value) for i in at.info)


@pytest.mark.parametrize("name, content", [
    ("nan.npz", _npz(2, nan=True)),
    ("evil.npy", _npy(np.array([{"x": 1}, None], dtype=object))),
    ("pickle.pt", pickle.dumps({"logits": [[1.0, 2.0]]})),
    ("notes.txt", b"hello"),
])
def test_bad_upload_shows_error_and_keeps_models(name, content):
    at = _app()
    before = dict(_models(at))
    at.file_uploader(key="upload_logits").set_value((name, content, "application/octet-stream")).run()
    assert not at.exception
    with pytest.raises(LogitsFileError) as info:
        load_logits_bytes(content, name)
    assert _errors(at) == [str(info.value)]  # the core's one-line message, verbatim
    assert name in _errors(at)[0]
    assert _models(at) == before
    assert len(at.dataframe[0].value) == N_DEMO
    at.run()  # still shown while the file sits in the uploader, still harmless
    assert _errors(at) == [str(info.value)] and _models(at) == before


def test_good_and_bad_files_in_one_upload():
    at = _app()
    at.file_uploader(key="upload_logits").set_value([
        ("good.npz", _npz(3), "application/octet-stream"),
        ("bad.npz", _npz(4, nan=True), "application/octet-stream"),
    ]).run()
    assert not at.exception
    assert len(_models(at)) == N_DEMO + 1
    assert len(_errors(at)) == 1 and _errors(at)[0].startswith("bad.npz")


def test_remove_model_is_not_readded_by_the_uploader():
    at = _app()
    at.file_uploader(key="upload_logits").set_value(("gone.npz", _npz(5), "application/octet-stream")).run()
    sha = [k for k, d in _models(at).items() if d.source == "gone.npz"][0]
    at.multiselect(key="remove_select").set_value([sha]).run()
    at.button(key="remove_btn").click().run()
    assert not at.exception
    assert sha not in _models(at) and len(_models(at)) == N_DEMO
    at.run()
    at.run()
    assert sha not in _models(at)
    assert len(at.dataframe[0].value) == N_DEMO


def test_remove_all_then_load_demo_again():
    at = _app()
    at.button(key="remove_all_btn").click().run()
    assert not at.exception and _models(at) == {}
    assert any("No models loaded" in i.value for i in at.info)
    for page in ("calibrate", "fleet", "attack_cost", "export"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, page
        assert at.info, page  # each page says what is missing
    at.switch_page("pages/data.py").run()
    at.button(key="demo_btn").click().run()
    assert len(_models(at)) == N_DEMO


def test_npy_logits_with_separate_labels_file():
    at = _app()
    rng = np.random.default_rng(6)
    y = rng.integers(0, 4, 250)
    z = rng.normal(size=(250, 4))
    z[np.arange(250), y] += 1.5
    logits = _npy(z)
    at.file_uploader(key="upload_logits").set_value(("bare.npy", logits, "application/octet-stream")).run()
    bare = [d for d in _models(at).values() if d.source == "bare.npy"][0]
    assert not bare.has_labels
    assert "no" in at.dataframe[0].value["labels"].tolist()
    at.file_uploader(key="upload_labels").set_value(("y.npy", _npy(y), "application/octet-stream")).run()
    assert not at.exception
    labelled = _models(at)[bare.sha256]
    assert labelled.has_labels and np.array_equal(labelled.labels, y)
    assert len(_models(at)) == N_DEMO + 1  # replaced, not duplicated


def test_labels_that_fit_no_file_say_so_under_the_labels_file_only():
    at = _app()
    at.file_uploader(key="upload_labels").set_value(("y.npy", _npy(np.arange(3)), "application/octet-stream"))
    at.file_uploader(key="upload_logits").set_value(("bare.npy", _npy(np.eye(4) * 3), "application/octet-stream"))
    at.run()
    assert not at.exception
    (error,) = _errors(at)
    assert error.startswith("y.npy: 3 labels, but no loaded model without labels has 3 rows")
    bare = [d for d in _models(at).values() if d.source == "bare.npy"]
    assert len(bare) == 1 and not bare[0].has_labels  # the logits file itself loaded fine


def test_margin_histogram_normalized_axis():
    at = _app()
    at.segmented_control(key="hist_mode").set_value("divided by S (median)").run()
    fig = json.loads(at.get("plotly_chart")[0].proto.spec)
    titles = [v.get("title", {}).get("text") or "" for k, v in fig["layout"].items() if k.startswith("xaxis")]
    assert any("m / S" in t for t in titles)
    # Divided by its own median, every model's margins have median 1: the bin where half of the
    # model's inputs are reached lies within a bin of 1.
    for trace in fig["data"]:
        bins = _array(trace["customdata"]).reshape(-1, 2)
        centre, share = bins[~np.isnan(bins[:, 0])][::2].T  # each bin's (centre, % of inputs), once
        half = centre[np.searchsorted(np.cumsum(share), 50.0)]
        assert abs(half - 1.0) <= centre[1] - centre[0]


def _array(spec) -> np.ndarray:
    """A plotly JSON array: a list, or {"dtype", "bdata"} base64."""
    if isinstance(spec, dict):
        return np.frombuffer(base64.b64decode(spec["bdata"]), dtype=spec["dtype"])
    return np.asarray(spec, dtype=float)


def test_file_names_are_shown_verbatim_not_as_markdown():
    at = _app()
    name = "x_[click](http://example.com)*$1$*.npz"
    at.file_uploader(key="upload_logits").set_value((name, _npz(8, nan=True), "application/octet-stream")).run()
    assert not at.exception
    raw = at.error[0].value
    assert "\\[click\\]\\(http" in raw and "\\$1\\$" in raw  # escaped for st.markdown
    assert _errors(at)[0].startswith(name + ": ")


def test_the_uploader_states_its_limits(monkeypatch):
    from caliber_dashboard.common import upload_boundary

    at = _app().run()
    uploader = at.file_uploader(key="upload_logits")
    text = uploader.proto.help
    assert ("Up to 953 MB per file (the server's limit, never above the workspace's size cap): a larger "
            "upload is refused before it is read") in text
    assert uploader.proto.max_upload_size_mb == 953  # .streamlit/config.toml: the default cap, 1000 MB
    monkeypatch.setenv("CALIBER_WORKSPACE_MAX_MB", "50")  # a cap below the server's limit lowers it
    at = _app().run()
    uploader = at.file_uploader(key="upload_logits")
    assert uploader.proto.max_upload_size_mb == 47 and "Up to 47 MB per file" in uploader.proto.help
    monkeypatch.delenv("CALIBER_WORKSPACE_MAX_MB")
    assert f"more than {upload_boundary.max_elements():,} values" in text
