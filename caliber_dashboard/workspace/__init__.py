"""A private, persistent workspace per visitor: uploads, choices and long results.

* :mod:`.store`: the storage protocol, its errors and the token rules;
* :mod:`.sqlite_store`: the embedded implementation (SQLite plus blob files);
* :mod:`.settings`: the data directory and caps from environment variables;
* :mod:`.session`: the Streamlit glue (the ``?ws=`` token, restore, the sidebar
  panel, ``save_result``/``load_result`` for the pages).

Only the glue imports Streamlit; the store is usable from scripts and tests.
"""

from caliber_core.lazy_names import lazy_names

_NAMES = {
    "Settings": "settings", "from_environment": "settings", "SQLiteStore": "sqlite_store",
    **{name: "store" for name in ("CapExceeded", "CorruptEntry", "Limits", "UnknownWorkspace", "UploadRecord",
                                  "Usage", "WorkspaceError", "WorkspaceStore", "new_token", "workspace_id")},
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
