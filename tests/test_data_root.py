"""The data root: only files under it can be listed or opened, with one refusal for every reason."""

from __future__ import annotations

import argparse
import io
import os

import numpy as np
import pytest

from caliber_core.cli.dashboard import add_parser, environment
from caliber_core.loading import LogitsFileError, load_logits_bytes
from caliber_dashboard.data import data_root, server_files
from caliber_dashboard.data.data_root import NotInRoot


def _logits(n=240, k=6, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    z = rng.normal(size=(n, k)).astype(dtype)
    z[np.arange(n), y] += 2
    return z, y


@pytest.fixture()
def tree(tmp_path):
    """root/ with files, a link inside, links out; secret.npy beside the root."""
    root = tmp_path / "root"
    (root / "evals" / "deep").mkdir(parents=True)
    z, y = _logits()
    np.save(root / "evals" / "a.npy", z)
    np.save(root / "evals" / "a_labels.npy", y)
    np.savez(root / "evals" / "deep" / "b.npz", logits=z, labels=y)
    (root / "notes.txt.bak").write_text("x")
    (root / ".hidden.npy").write_bytes(b"x")
    np.save(tmp_path / "secret.npy", z)
    os.symlink(tmp_path / "secret.npy", root / "out.npy")
    os.symlink(tmp_path, root / "up")
    os.symlink(root / "evals" / "a.npy", root / "inside.npy")
    return root.resolve()


def test_the_root_comes_from_the_variable_and_must_be_a_directory(tmp_path):
    assert data_root.configured_root({}) is None
    assert data_root.configured_root({"CALIBER_DATA_ROOT": str(tmp_path)}) == tmp_path.resolve()
    with pytest.raises(ValueError, match="CALIBER_DATA_ROOT is not a directory"):
        data_root.configured_root({"CALIBER_DATA_ROOT": str(tmp_path / "none")})


def test_the_listing_holds_only_files_inside_the_root(tree):
    files, cut = data_root.list_files(tree)
    assert not cut
    assert [f.path for f in files] == ["evals/a.npy", "evals/a_labels.npy", "evals/deep/b.npz", "inside.npy"]
    assert files[0].size == (tree / "evals" / "a.npy").stat().st_size
    some, cut = data_root.list_files(tree, limit=2)
    assert cut and len(some) == 2 and set(some) <= set(files)


@pytest.mark.parametrize("path", [
    "../secret.npy", "evals/../../secret.npy", "out.npy", "up/secret.npy",
    "/etc/passwd", str("/") + "evals/a.npy", "C:/x.npy", "evals\\a.npy", "evals//a.npy", "./evals/a.npy",
    "missing.npy", "evals", "evals/a.npy\x00", "", ".hidden.npy/..",
])
def test_every_refusal_is_the_same_line(tree, path):
    with pytest.raises(NotInRoot) as err:
        server_files.open_in_place(tree, path)
    assert str(err.value).endswith(": no such file in the data root (a path is relative to the root, "
                                   "without '..', and may not lead out of it)")
    assert str(tree.parent) not in str(err.value)  # the server's own paths are never shown


def test_missing_and_outside_cannot_be_told_apart(tree):
    def message(path):
        with pytest.raises(NotInRoot) as err:
            server_files.open_in_place(tree, path)
        return str(err.value).split(": ", 1)[1]

    assert message("nothing/here.npy") == message("../secret.npy") == message("out.npy") == message("up/x.npy")


def test_a_link_inside_the_root_opens(tree):
    data = server_files.open_in_place(tree, "inside.npy")
    assert data.source == "inside.npy"


def test_an_npy_opened_in_place_equals_its_upload(tree):
    server_files._CACHE.clear()
    content = (tree / "evals" / "a.npy").read_bytes()
    labels = (tree / "evals" / "a_labels.npy").read_bytes()
    seen = []
    data = server_files.open_in_place(tree, "evals/a.npy", "evals/a_labels.npy", progress=seen.append)
    upload = load_logits_bytes(content, "a.npy", labels_content=labels, labels_filename="a_labels.npy")
    assert data.sha256 == upload.sha256 and data.name == upload.name == "a"
    assert data.logits.dtype == np.float64 and data.logits.flags.c_contiguous and data.logits.flags.writeable
    np.testing.assert_array_equal(data.logits, upload.logits)
    np.testing.assert_array_equal(data.labels, upload.labels)
    np.testing.assert_array_equal(data.margins, upload.margins)
    assert (data.source, data.labels_source) == ("evals/a.npy", "evals/a_labels.npy")
    assert seen and seen[-1] == 1.0
    assert server_files.open_in_place(tree, "evals/a.npy", "evals/a_labels.npy") is data  # cached


def test_small_blocks_give_the_same_matrix(tree, monkeypatch):
    server_files._CACHE.clear()
    whole = server_files.open_in_place(tree, "evals/a.npy")
    server_files._CACHE.clear()
    monkeypatch.setattr(server_files, "BLOCK_BYTES", 100)  # 4 rows a block, the last one short
    blocks = server_files.open_in_place(tree, "evals/a.npy")
    np.testing.assert_array_equal(whole.logits, blocks.logits)
    assert whole.sha256 == blocks.sha256


def test_other_formats_load_as_an_upload_does(tree):
    data = server_files.open_in_place(tree, "evals/deep/b.npz")
    upload = load_logits_bytes((tree / "evals" / "deep" / "b.npz").read_bytes(), "b.npz")
    assert data.sha256 == upload.sha256 and data.has_labels and data.source == "evals/deep/b.npz"


def test_a_changed_file_is_read_again(tree):
    first = server_files.open_in_place(tree, "evals/a.npy")
    z, _ = _logits(seed=5)
    np.save(tree / "evals" / "a.npy", z)
    second = server_files.open_in_place(tree, "evals/a.npy")
    assert second.sha256 != first.sha256


def test_bad_contents_get_the_loaders_line(tree):
    (tree / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(LogitsFileError, match=r"^bad\.npy: "):
        server_files.open_in_place(tree, "bad.npy")
    z, _ = _logits()
    buf = io.BytesIO()
    np.save(buf, z)
    (tree / "cut.npy").write_bytes(buf.getvalue()[:-100])
    with pytest.raises(LogitsFileError, match=r"^cut\.npy: truncated npy"):
        server_files.open_in_place(tree, "cut.npy")
    z[3, 2] = np.nan
    np.save(tree / "nan.npy", z)
    with pytest.raises(LogitsFileError, match=r"^nan\.npy: logits row 3, column 2 is nan"):
        server_files.open_in_place(tree, "nan.npy")
    np.save(tree / "short_labels.npy", np.zeros(3, dtype=np.int64))
    with pytest.raises(LogitsFileError, match=r"short_labels\.npy"):
        server_files.open_in_place(tree, "evals/a.npy", "short_labels.npy")


def test_a_labels_path_is_held_to_the_same_rule(tree):
    with pytest.raises(NotInRoot, match=r"^\.\./secret\.npy: no such file in the data root"):
        server_files.open_in_place(tree, "evals/a.npy", "../secret.npy")


def test_the_element_budget_applies_before_reading(tree):
    with pytest.raises(LogitsFileError, match="max_elements|elements"):
        server_files.open_in_place(tree, "evals/a.npy", max_elements=100)


def test_the_cli_option_sets_the_variable(tmp_path):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["dashboard", "--data-root", str(tmp_path)])
    assert environment(args, {})["CALIBER_DATA_ROOT"] == str(tmp_path.resolve())
    assert "CALIBER_DATA_ROOT" not in environment(parser.parse_args(["dashboard"]), {})
    with pytest.raises(ValueError, match="--data-root .*: not a directory"):
        environment(parser.parse_args(["dashboard", "--data-root", str(tmp_path / "none")]), {})
