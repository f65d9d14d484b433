"""Where workspaces live and how big they may grow: environment variables.

Streamlit's ``config.toml`` has no section for an app's own settings, so the
workspace reads these variables (documented in the README):

=====================================  ==========================================
``CALIBER_DATA_DIR``                   data directory; default
                                       ``$XDG_DATA_HOME/caliber`` (that is
                                       ``~/.local/share/caliber``), outside any
                                       checkout
``CALIBER_WORKSPACE_MAX_MB``           per-workspace cap, default 1000 (MB, 10^6 bytes)
``CALIBER_STORE_MAX_MB``               overall cap, default 10000
``CALIBER_WORKSPACE_MAX_IDLE_DAYS``    a workspace unused this long is deleted, default 30
``CALIBER_WORKSPACE_EVICTABLE_HOURS``  under the overall cap, workspaces unused this long
                                       are evicted (least recently used first), default 24
=====================================  ==========================================
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .store import Limits

DATA_DIR_ENV = "CALIBER_DATA_DIR"
WORKSPACE_MAX_MB_ENV = "CALIBER_WORKSPACE_MAX_MB"
STORE_MAX_MB_ENV = "CALIBER_STORE_MAX_MB"
MAX_IDLE_DAYS_ENV = "CALIBER_WORKSPACE_MAX_IDLE_DAYS"
EVICTABLE_HOURS_ENV = "CALIBER_WORKSPACE_EVICTABLE_HOURS"

DEFAULT_WORKSPACE_MB = 1000.0
DEFAULT_STORE_MB = 10000.0
DEFAULT_MAX_IDLE_DAYS = 30.0
DEFAULT_EVICTABLE_HOURS = 24.0


@dataclass(frozen=True)
class Settings:
    """The data directory and the store's limits, as read from the environment."""

    data_dir: Path
    limits: Limits


def default_data_dir(environ: Mapping[str, str] = os.environ) -> Path:
    base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "caliber"


def _number(environ: Mapping[str, str], name: str, default: float, *, positive: bool) -> float:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        rule = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {rule}, got {text!r}")
    return value


def from_environment(environ: Mapping[str, str] = os.environ) -> Settings:
    """Read the settings; raises ValueError naming the variable and its bad value."""
    data_dir = environ.get(DATA_DIR_ENV, "").strip()
    limits = Limits(
        workspace_bytes=int(_number(environ, WORKSPACE_MAX_MB_ENV, DEFAULT_WORKSPACE_MB,
                                    positive=True) * 1e6),
        total_bytes=int(_number(environ, STORE_MAX_MB_ENV, DEFAULT_STORE_MB, positive=True) * 1e6),
        max_idle_s=_number(environ, MAX_IDLE_DAYS_ENV, DEFAULT_MAX_IDLE_DAYS,
                           positive=True) * 86_400.0,
        evictable_idle_s=_number(environ, EVICTABLE_HOURS_ENV, DEFAULT_EVICTABLE_HOURS,
                                 positive=False) * 3_600.0,
    )
    return Settings(Path(data_dir).expanduser() if data_dir else default_data_dir(environ), limits)


def upload_limit_mb(environ: Mapping[str, str] = os.environ) -> int:
    """The per-file upload limit in Streamlit's unit (``server.maxUploadSize``, MiB) from the workspace's cap.

    A file larger than the workspace's cap (never above the store's) cannot be
    kept, so the server refuses it before reading its body.

    Parameters
    ----------
    environ : mapping, default ``os.environ``

    Returns
    -------
    int
        At least 1.

    Raises
    ------
    ValueError
        A cap variable that is not a positive number (naming it).
    """
    limits = from_environment(environ).limits
    return max(1, limits.workspace_bytes // (1 << 20))
