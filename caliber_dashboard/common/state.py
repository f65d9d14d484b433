"""The session's models and choices, backed by its persistent workspace.

Widget-keyed values vanish from the session state when their widget is not
drawn (a page switch), so everything that must outlive a page lives under the
plain keys below, never in module globals: each browser session has its own
models. Every change is also written to the session's workspace
(:mod:`caliber_dashboard.workspace.session`), and a session's first run
restores it, so a reload, a reconnect or a server restart loses nothing.

* ``MODELS``: dict sha256 -> LogitsData, in load order (a file loaded twice is kept once);
* ``PROCESSED``: upload keys already handled, so the uploader's persisted value
  does not re-add a removed model on every rerun;
* ``UPLOAD_STATUS``: uploaded file id -> the messages about that file (loaded,
  refused, already loaded), shown while that file stays in its uploader
  (:mod:`caliber_dashboard.data.uploads`);
* ``SELECTED``: sha256 of the model the pages last worked on;
* ``TARGETS``: the last target chosen per kind (percent), shared by the pages;
* ``OPTIONS``: sha256 -> that model's chosen options (margin statistic, target
  kind, target per kind), persisted per model;
* ``WARNINGS``: what the restore skipped (unreadable entries), shown in the sidebar.

The demo set is never copied into a workspace: the workspace records only
which demo models the user removed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import streamlit as st

from caliber_core.calibration.margins import MARGIN_STATISTICS
from caliber_core.config import SIDES
from caliber_core.loading import LogitsData, load_logits

from caliber_dashboard.common import background, upload_boundary
from caliber_dashboard.workspace import CapExceeded
from caliber_dashboard.workspace import session as workspace

MODELS = "caliber_models"
PROCESSED = "caliber_processed_uploads"
UPLOAD_STATUS = "caliber_upload_status"
SELECTED = "caliber_selected"
TARGETS = "caliber_targets"
OPTIONS = "caliber_model_options"
WARNINGS = "caliber_workspace_warnings"
VERIFY_COUNTER = "caliber_verify_counter"
_SAVED = "caliber_saved_choices"  # what the workspace holds now, to write only changes
_SEEDED = "caliber_seeded_widgets"  # widget key -> the model its value was set for

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DEMO_GLOB = "digits_*.npz"

SETTINGS_KIND, OPTIONS_KIND = "settings", "options"
KIND_KEY = "_kind"  # the entry of TARGETS holding the last chosen target kind

# Per-model options carried by page widgets: widget key -> (its page's model
# selector key, option name). The option is restored when the widget is drawn
# for that model again (after a reload, a page switch or a model switch).
MODEL_WIDGETS = {
    "calibrate_statistic": ("calibrate_model", "statistic"),
    "export_statistic": ("export_model", "statistic"),
    "calibrate_side": ("calibrate_model", "side"),
}
_OPTION_VALUES = {"statistic": tuple(MARGIN_STATISTICS), "side": tuple(SIDES)}


@st.cache_resource(max_entries=1, show_spinner=False)
def demo_models() -> tuple[LogitsData, ...]:
    """The bundled demo files, read once per process (read-only, shared)."""
    return tuple(load_logits(p) for p in sorted(DATA_DIR.glob(DEMO_GLOB)))


def init() -> None:
    """Create the plain keys; on a session's first run, restore its workspace."""
    ss = st.session_state
    for key, empty in ((MODELS, dict), (PROCESSED, set), (UPLOAD_STATUS, dict), (TARGETS, dict),
                       (OPTIONS, dict), (WARNINGS, list), (_SAVED, dict), (_SEEDED, dict)):
        ss.setdefault(key, empty())
    ss.setdefault(VERIFY_COUNTER, 0)
    if workspace.open_session():
        _restore()
    _seed_widgets()


def _restore() -> None:
    """Demo models (less the removed ones), stored uploads, then the stored choices."""
    ss = st.session_state
    stored, bad = workspace.load_results(SETTINGS_KIND)
    options, bad_options = workspace.load_results(OPTIONS_KIND)
    hidden = set(_strings(stored.get("demo_hidden")))
    for data in demo_models():
        if data.sha256 not in hidden:
            add_model(data)
    with st.spinner("Restoring this workspace's files…"):
        restored = workspace.restore_uploads()
    for data in restored.models:
        try:
            upload_boundary.check_visitor_budget(held_elements(besides=data.sha256), data, data.source)
        except ValueError as exc:  # stored under another budget: it stays stored, unloaded
            restored.warnings.append(f"Not loaded: {exc}")
            continue
        add_model(data)
    from caliber_dashboard.data import server_files  # files opened in place from the data root

    with st.spinner("Reopening this workspace's files from the data root…"):
        served, served_warnings = server_files.restore()
    for data in served:
        add_model(data)
    ss[WARNINGS] = restored.warnings + served_warnings + [
        f"Skipped unreadable stored choices ({what})." for what in bad + bad_options]
    ss[OPTIONS] = {sha: o for sha, o in options.items() if isinstance(o, dict)}
    targets = stored.get("targets")
    if isinstance(targets, dict):
        ss[TARGETS] = {k: v for k, v in targets.items()
                       if (k == KIND_KEY and isinstance(v, str)) or _finite(v)}
    selected = stored.get("selected")
    if selected in models():
        ss[SELECTED] = selected
        kind = ss[OPTIONS].get(selected, {}).get("kind")
        if isinstance(kind, str):
            ss[TARGETS][KIND_KEY] = kind
    ss[_SAVED] = {("settings", k): v for k, v in stored.items()}
    ss[_SAVED].update({("options", k): v for k, v in ss[OPTIONS].items()})


def start_new_workspace() -> None:
    """Leave this workspace (kept, reachable by its URL) for a fresh one with the demo set."""
    background.drain()  # the choices still queued belong to this workspace
    workspace.start_new()
    _reset()


def delete_workspace() -> None:
    """Delete this workspace and everything in it, then start a fresh one."""
    background.drain()  # a choice queued for it must not write it back after the deletion
    try:
        workspace.delete_current()
    except workspace.STORE_ERRORS as exc:
        st.session_state[WARNINGS] = [f"The workspace could not be deleted: {exc}"]
        return
    _reset()


def _reset() -> None:
    ss = st.session_state
    # PROCESSED stays: files still sitting in the uploader belong to the old workspace.
    for key in (MODELS, TARGETS, OPTIONS, WARNINGS, _SAVED, _SEEDED):
        ss.pop(key, None)
    ss.pop(SELECTED, None)
    init()
    load_demo()


def load_demo() -> int:
    """Add the demo models not loaded yet; returns how many were added."""
    _save_setting("demo_hidden", [])
    return sum(add_model(d) for d in demo_models())


def models() -> dict[str, LogitsData]:
    return st.session_state.setdefault(MODELS, {})


def labelled_models() -> dict[str, LogitsData]:
    return {k: d for k, d in models().items() if d.has_labels}


def add_model(data: LogitsData) -> bool:
    """Store a model under its sha256; False if that file is already loaded.

    A file first loaded without labels and now given labels replaces the old entry.
    """
    if not is_new(data):
        return False
    models()[data.sha256] = data
    for hook in _ADDED_HOOKS:
        hook(data)
    return True


#: Called with each newly added model. The background calibration registers here
#: (``precalibrate``), so this module, which it reads, does not import it.
_ADDED_HOOKS: list = []


def on_model_added(hook) -> None:
    """Call ``hook(data)`` whenever :func:`add_model` adds a model (once per hook)."""
    if hook not in _ADDED_HOOKS:
        _ADDED_HOOKS.append(hook)


def held_elements(*, besides: str | None = None) -> int:
    """The logits values this session's models hold (less the model ``besides``, which is being replaced)."""
    return sum(d.logits.size for sha, d in models().items() if sha != besides)


def is_new(data: LogitsData) -> bool:
    """Whether storing ``data`` would change the session: a new file, or labels for one without."""
    old = models().get(data.sha256)
    return old is None or (not old.has_labels and data.has_labels)


def remove_model(sha256: str) -> None:
    remove_models([sha256])


def remove_models(shas: Iterable[str]) -> None:
    """Remove models from the session and the workspace (demo ones are only hidden)."""
    demo = {d.sha256 for d in demo_models()}
    hidden = set(_strings(st.session_state.get(_SAVED, {}).get(("settings", "demo_hidden"))))
    for sha in list(shas):
        models().pop(sha, None)
        st.session_state.get(OPTIONS, {}).pop(sha, None)
        if st.session_state.get(SELECTED) == sha:
            st.session_state.pop(SELECTED, None)
        if sha in demo:
            hidden.add(sha)
        else:
            _guard("remove the file from the workspace", workspace.forget_upload, sha)
            _guard("remove the server file's record", _forget_server_file, sha)
        _guard("remove its choices", workspace.delete_result, OPTIONS_KIND, sha)
        st.session_state.get(_SAVED, {}).pop(("options", sha), None)
    _save_setting("demo_hidden", sorted(hidden))


def _forget_server_file(sha256: str) -> None:
    from caliber_dashboard.data import server_files

    server_files.forget(sha256)


def clear_models() -> None:
    remove_models(list(models()))


def model_label(data: LogitsData) -> str:
    """Display name: the model name plus the digest prefix (two files may share a name)."""
    return f"{data.name} · {data.sha256[:8]}"


# ------------------------------------------------------------------- choices


def model_options(sha256: str) -> dict:
    """The stored options of one model (a copy; empty when none)."""
    return dict(st.session_state.get(OPTIONS, {}).get(sha256, {}))


def set_model_option(sha256: str, name: str, value, *, later: bool = False) -> None:
    """Record one option of a model and persist it (written only when it changed).

    ``later``: the write goes to the session's background worker (:func:`_save_later`).
    """
    if sha256 not in models():
        return
    options = st.session_state.setdefault(OPTIONS, {}).setdefault(sha256, {})
    options[name] = value
    (_save_later if later else _save)(OPTIONS_KIND, sha256, options)


def remember_target(kind: str, percent: float, side: str | None = None) -> None:
    """The target just chosen: for every page, and for the selected model.

    With ``side`` (the Calibrate page), the (kind, percent, side) triple is also
    the model's ``"calibrate"`` choice, which the Export page starts from.
    """
    targets = st.session_state.setdefault(TARGETS, {})
    targets[kind] = float(percent)
    _save_setting("targets", targets)
    sha = st.session_state.get(SELECTED)
    if sha in models():
        options = st.session_state.setdefault(OPTIONS, {}).setdefault(sha, {})
        options["kind"] = kind
        options.setdefault("targets", {})[kind] = float(percent)
        if side is not None:
            options["calibrate"] = {"kind": kind, "percent": float(percent), "side": side}
        _save(OPTIONS_KIND, sha, options)


def remembered_target(kind: str, default: float) -> float:
    """The selected model's last target of this kind, else the last one on any model."""
    sha = st.session_state.get(SELECTED)
    own = st.session_state.get(OPTIONS, {}).get(sha, {}).get("targets", {})
    for value in (own.get(kind) if isinstance(own, dict) else None,
                  st.session_state.get(TARGETS, {}).get(kind)):
        if _finite(value):
            return float(value)
    return float(default)


def sync_choices() -> None:
    """End of a script run: persist the selected model and the per-model widget options.

    The session's copies change here, at once; the workspace's writes (a durable commit
    each, 0.05-0.1 s here) go to the session's background worker, so the run's end (and
    the page a person waits for) does not wait for the disk. The worker writes in order,
    each from the session's live value at the time of writing: a later target saved by
    the same worker is never overwritten by an older copy.
    """
    ss = st.session_state
    if ss.get(SELECTED) in models():
        _save_later(SETTINGS_KIND, "selected", ss[SELECTED])
    for widget, (selector, name) in MODEL_WIDGETS.items():
        # Pair the widget with its own page's model selector: both are this run's
        # values, or both the previous page's (not yet dropped at this point).
        sha, value = ss.get(selector), ss.get(widget)
        if sha in models() and value in _OPTION_VALUES[name]:
            if model_options(sha).get(name) != value:
                set_model_option(sha, name, value, later=True)
            ss.setdefault(_SEEDED, {})[widget] = sha


def _save_later(kind: str, key: str, value) -> None:
    """:func:`_save` on the background worker, unless the workspace holds that value already."""
    if st.session_state.get(_SAVED, {}).get((kind, key)) != value:
        background.run_after(_save, kind, key, value)


def _seed_widgets() -> None:
    """Set a per-model widget to its model's stored option when drawn for a new model."""
    ss = st.session_state
    seeded = ss.setdefault(_SEEDED, {})
    for widget, (selector, name) in MODEL_WIDGETS.items():
        sha = ss.get(selector) if ss.get(selector) in models() else ss.get(SELECTED)
        if widget in ss and seeded.get(widget) == sha:
            continue
        seeded[widget] = sha
        value = model_options(sha).get(name) if sha else None
        if value in _OPTION_VALUES[name]:
            ss[widget] = value


def next_verify_seed() -> int:
    """A fresh seed for every verify click in this session (a counter)."""
    st.session_state[VERIFY_COUNTER] = st.session_state.get(VERIFY_COUNTER, 0) + 1
    return 1_000 + st.session_state[VERIFY_COUNTER]


def _save_setting(name: str, value) -> None:
    _save(SETTINGS_KIND, name, value)


def _save(kind: str, key: str, value) -> None:
    """Persist a JSON-able choice unless the workspace already holds that value."""
    saved = st.session_state.setdefault(_SAVED, {})
    if saved.get((kind, key)) == value:
        return
    if _guard("save your choices", workspace.save_result, kind, key, value):
        saved[(kind, key)] = _copy(value)


def _guard(what: str, func, *args) -> bool:
    """Run a workspace write; a failure becomes a sidebar warning, never a crash."""
    try:
        func(*args)
    except (CapExceeded, *workspace.STORE_ERRORS, ValueError) as exc:
        warnings = st.session_state.setdefault(WARNINGS, [])
        message = f"Could not {what} in the workspace: {exc}"
        if message not in warnings:
            warnings.append(message)
        return False
    return True


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _strings(value) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def add_warning(message: str) -> None:
    """A sidebar warning for this session (shown once however often it is added)."""
    warnings = st.session_state.setdefault(WARNINGS, [])
    if message not in warnings:
        warnings.append(message)
