"""The workspace store: round trip, tokens, atomic writes, caps, eviction, damaged entries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from caliber_dashboard.workspace import (CapExceeded, CorruptEntry, Limits, SQLiteStore,
                                         UnknownWorkspace, WorkspaceStore, from_environment,
                                         workspace_id)
from caliber_dashboard.workspace.blob_files import BlobFiles
from caliber_dashboard.workspace.store import blob_digest

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _alive(store, token: str) -> bool:
    """Whether a workspace exists, without marking it used (unlike ``exists``)."""
    try:
        store.uploads(token)
    except UnknownWorkspace:
        return False
    return True


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "blobs").glob("*/*"))


@pytest.fixture
def store(tmp_path):
    return SQLiteStore(tmp_path / "data")


def test_round_trip_uploads_and_results(store):
    assert isinstance(store, WorkspaceStore)
    token = store.create()
    a, labels = b"logits-a" * 100, b"labels" * 10
    model_a = store.put_upload(token, filename="a.npz", content=a)
    model_b = store.put_upload(token, filename="b.npy", content=b"logits-b",
                               labels_filename="y.npy", labels_content=labels)
    assert model_a == blob_digest(a)
    records = store.uploads(token)
    assert [(r.model, r.filename, r.labels_filename) for r in records] == [
        (model_a, "a.npz", None), (model_b, "b.npy", "y.npy")]
    assert [r.seq for r in records] == [1, 2]
    assert store.read_blob(records[0].blob) == a
    assert store.read_blob(records[1].labels_blob) == labels
    assert store.usage(token).workspace_bytes == len(a) + len(b"logits-b") + len(labels)

    store.save_result(token, "options", model_a, b'{"statistic":"mean"}')
    store.save_result(token, "options", model_b, b"\x00\x01")
    assert store.load_result(token, "options", model_a) == b'{"statistic":"mean"}'
    assert store.results(token, "options") == {model_a: b'{"statistic":"mean"}',
                                               model_b: b"\x00\x01"}
    store.save_result(token, "options", model_a, b"{}")  # replaces
    assert store.load_result(token, "options", model_a) == b"{}"
    store.delete_result(token, "options", model_a)
    assert store.load_result(token, "options", model_a) is None
    assert store.load_result(token, "other", "x") is None

    # Reopening the directory (a server restart) finds the same state.
    again = SQLiteStore(store.root)
    assert again.exists(token)
    assert [r.model for r in again.uploads(token)] == [model_a, model_b]
    assert again.read_blob(model_a) == a


def test_blobs_are_stored_once_and_deleted_when_unreferenced(store):
    t1, t2 = store.create(), store.create()
    content = os.urandom(5000)
    digest = store.put_upload(t1, filename="one.npz", content=content)
    store.put_upload(t2, filename="two.npz", content=content)
    assert _files(store.root) == [digest]
    assert store.usage(t1).total_bytes == 5000  # counted once for the store...
    assert store.usage(t2).workspace_bytes == 5000  # ...and once per workspace holding it
    store.remove_upload(t1, digest)
    assert store.read_blob(digest) == content  # t2 still holds it
    store.delete(t2)
    assert _files(store.root) == []
    assert store.usage(t1).total_bytes == 0


def test_tokens_are_random_and_never_stored(store):
    tokens = {store.create() for _ in range(20)}
    assert len(tokens) == 20 and all(len(t) >= 43 for t in tokens)  # >= 256 bits, URL-safe
    token = next(iter(tokens))
    store.put_upload(token, filename="f.npz", content=b"abc")
    db = b"".join(p.read_bytes() for p in store.root.glob("workspaces.sqlite3*"))
    assert token.encode() not in db
    assert workspace_id(token).encode() in db
    assert not store.exists("not-a-token") and not store.exists("") and not store.exists(None)
    with pytest.raises(UnknownWorkspace):
        store.uploads("not-a-token")
    with pytest.raises(UnknownWorkspace):
        store.put_upload("not-a-token", filename="f.npz", content=b"abc")


def test_interrupted_blob_write_leaves_previous_state(store, monkeypatch):
    token = store.create()
    first = store.put_upload(token, filename="first.npz", content=b"first" * 1000)
    store.save_result(token, "options", first, b'{"statistic":"median"}')
    before = store.uploads(token)

    def half_then_fail(out, content):
        out.write(content[: len(content) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(BlobFiles, "_write_bytes", staticmethod(half_then_fail))
    with pytest.raises(OSError, match="No space"):
        store.put_upload(token, filename="second.npz", content=b"second" * 1000)
    # Replacing the first model (now with labels) fails the same way: the old entry stays.
    with pytest.raises(OSError):
        store.put_upload(token, filename="first.npz", content=b"first" * 1000,
                         labels_filename="y.npy", labels_content=b"labels")
    monkeypatch.undo()

    assert store.uploads(token) == before
    assert store.read_blob(first) == b"first" * 1000
    assert store.load_result(token, "options", first) == b'{"statistic":"median"}'
    assert _files(store.root) == [first]  # no temporary file left behind
    assert store.usage(token).total_bytes == 5000 + len(b'{"statistic":"median"}')


_CHILD = textwrap.dedent("""
    import os, sys, time
    from caliber_dashboard.workspace import SQLiteStore
    from caliber_dashboard.workspace.blob_files import BlobFiles
    root, token, where = sys.argv[1], sys.argv[2], sys.argv[3]
    original = BlobFiles.write

    def pause():
        print("paused", flush=True)
        time.sleep(60)

    def half(out, content):
        out.write(content[: len(content) // 2])
        out.flush()
        pause()

    def after_rename(self, digest, content):
        original(self, digest, content)
        pause()

    if where == "mid-write":
        BlobFiles._write_bytes = staticmethod(half)
    else:
        BlobFiles.write = after_rename
    SQLiteStore(root).put_upload(token, filename="new.npz", content=os.urandom(2_000_000))
""")


@pytest.mark.parametrize("where", ["mid-write", "before-commit"])
def test_killed_writer_leaves_previous_state(tmp_path, where):
    root = tmp_path / "data"
    store = SQLiteStore(root)
    token = store.create()
    kept = store.put_upload(token, filename="kept.npz", content=b"kept" * 500)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(root), token, where],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout.readline().strip() == "paused"
        assert len(_files(root)) == 2  # the child's temporary (or renamed) file exists now
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)

    reopened = SQLiteStore(root, stale_s=0.0)  # recovery treats every leftover as stale
    assert [r.model for r in reopened.uploads(token)] == [kept]
    assert reopened.read_blob(kept) == b"kept" * 500
    assert _files(root) == [kept]
    assert reopened.usage(token).total_bytes == 2000
    reopened.put_upload(token, filename="after.npz", content=b"after")  # the lock was released


def test_recover_restores_a_trashed_blob_whose_row_survived(store):
    token = store.create()
    digest = store.put_upload(token, filename="f.npz", content=b"payload")
    path = store.root / "blobs" / digest[:2] / digest
    os.replace(path, path.with_name(digest + ".del"))  # a crash between rename and commit
    assert store.recover() == {"restored": 1, "removed": 0}
    assert store.read_blob(digest) == b"payload"


def test_workspace_cap_refuses_and_writes_nothing(tmp_path):
    store = SQLiteStore(tmp_path, limits=Limits(workspace_bytes=10_000, total_bytes=100_000))
    token = store.create()
    store.put_upload(token, filename="a.npz", content=b"a" * 6000)
    with pytest.raises(CapExceeded, match=r"Refused big\.npz: this workspace would hold "
                                          r"0\.0 MB, over its cap of 0\.0 MB"):
        store.put_upload(token, filename="big.npz", content=b"b" * 5000)
    assert len(_files(tmp_path)) == 1
    store.put_upload(token, filename="a-again.npz", content=b"a" * 6000)  # held already: free
    with pytest.raises(CapExceeded, match="Not saved"):
        store.save_result(token, "run", "x", b"r" * 5000)
    assert store.load_result(token, "run", "x") is None
    store.save_result(token, "run", "x", b"r" * 3000)
    assert store.usage(token).workspace_bytes == 9000


def test_total_cap_evicts_least_recently_used_idle_workspaces(tmp_path):
    clock = Clock()
    limits = Limits(workspace_bytes=2000, total_bytes=3000, max_idle_s=1e9, evictable_idle_s=100)
    store = SQLiteStore(tmp_path, limits=limits, clock=clock)
    tokens = []
    for i in range(3):
        clock.t += 10
        tokens.append(store.create())
        store.put_upload(tokens[-1], filename=f"{i}.npz", content=bytes([i]) * 1000)
    clock.t += 10
    assert store.exists(tokens[0])  # used again: now the most recent of the three
    clock.t += 500  # every one is idle long enough to be evictable
    newest = store.create()
    store.put_upload(newest, filename="3.npz", content=b"\x03" * 1000)
    assert [_alive(store, t) for t in tokens] == [True, False, True]  # tokens[1] was the LRU one
    clock.t += 500
    store.put_upload(newest, filename="4.npz", content=b"\x04" * 1000)
    # Next least recently used: tokens[2] (last used at +30) before tokens[0] (+40).
    assert [_alive(store, t) for t in tokens] == [True, False, False]
    assert store.usage(newest).total_bytes == 3000


def test_total_cap_never_evicts_active_workspaces(tmp_path):
    clock = Clock()
    limits = Limits(workspace_bytes=2000, total_bytes=2000, evictable_idle_s=3600)
    store = SQLiteStore(tmp_path, limits=limits, clock=clock)
    busy, other = store.create(), store.create()
    store.put_upload(busy, filename="a.npz", content=b"a" * 1500)
    clock.t += 60  # used a minute ago: not evictable
    with pytest.raises(CapExceeded, match="over its overall cap"):
        store.put_upload(other, filename="b.npz", content=b"b" * 1000)
    assert store.exists(busy) and store.uploads(other) == []


def test_evict_expired_removes_only_workspaces_idle_past_the_age(tmp_path):
    clock = Clock()
    store = SQLiteStore(tmp_path, limits=Limits(max_idle_s=1000), clock=clock)
    old = store.create()
    store.put_upload(old, filename="old.npz", content=b"old")
    clock.t += 600
    recent = store.create()
    clock.t += 600
    assert store.evict_expired() == 1
    assert not store.exists(old) and store.exists(recent)
    assert _files(tmp_path) == []


def test_damaged_or_missing_blob_is_reported_and_repaired_by_a_new_upload(store):
    token = store.create()
    good = store.put_upload(token, filename="good.npz", content=b"good" * 100)
    bad = store.put_upload(token, filename="bad.npz", content=b"bad!" * 100)
    path = store.root / "blobs" / bad[:2] / bad
    path.write_bytes(b"bad?" * 100)  # same size, other bytes
    with pytest.raises(CorruptEntry, match="damaged"):
        store.read_blob(bad)
    assert store.read_blob(good) == b"good" * 100
    path.unlink()
    with pytest.raises(CorruptEntry, match="unreadable"):
        store.read_blob(bad)
    store.put_upload(token, filename="bad.npz", content=b"bad!" * 100)
    assert store.read_blob(bad) == b"bad!" * 100
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.read_blob("../../etc/passwd")


def test_input_checks(store):
    token = store.create()
    with pytest.raises(ValueError, match="non-empty bytes"):
        store.put_upload(token, filename="e.npz", content=b"")
    with pytest.raises(ValueError, match="given together"):
        store.put_upload(token, filename="e.npz", content=b"x", labels_content=b"y")
    with pytest.raises(ValueError, match="1 to 200 characters"):
        store.save_result(token, "", "k", b"x")
    with pytest.raises(TypeError, match="payload must be bytes"):
        store.save_result(token, "k", "k", "text")
    with pytest.raises(ValueError, match="must not exceed"):
        Limits(workspace_bytes=10, total_bytes=5)
    with pytest.raises(ValueError, match="positive integer"):
        Limits(workspace_bytes=0)


def test_settings_from_environment(tmp_path):
    cfg = from_environment({"CALIBER_DATA_DIR": str(tmp_path), "CALIBER_WORKSPACE_MAX_MB": "5",
                            "CALIBER_STORE_MAX_MB": "50", "CALIBER_WORKSPACE_MAX_IDLE_DAYS": "2",
                            "CALIBER_WORKSPACE_EVICTABLE_HOURS": "0"})
    assert cfg.data_dir == tmp_path
    assert cfg.limits == Limits(workspace_bytes=5_000_000, total_bytes=50_000_000,
                                max_idle_s=172_800.0, evictable_idle_s=0.0)
    default = from_environment({"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "x")})
    assert default.data_dir == tmp_path / "x" / "caliber"
    assert default.limits == Limits()
    with pytest.raises(ValueError, match="CALIBER_STORE_MAX_MB must be a number, got 'lots'"):
        from_environment({"CALIBER_STORE_MAX_MB": "lots"})
    with pytest.raises(ValueError, match=r"CALIBER_WORKSPACE_MAX_MB must be a finite number > 0"):
        from_environment({"CALIBER_WORKSPACE_MAX_MB": "0"})
