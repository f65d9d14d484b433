"""Every test's dashboard writes its workspaces under a temporary data directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _workspace_data_dir(tmp_path_factory):
    """Point CALIBER_DATA_DIR at a fresh directory, never the user's real one."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CALIBER_DATA_DIR", str(tmp_path_factory.mktemp("caliber-data")))
    yield
    mp.undo()
