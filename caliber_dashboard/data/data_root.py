"""The data root: a directory on the server whose files the Data page may list and open in place.

A provider's eval dumps (2,000 x 32,000 float32 is 256 MB) already sit on the
machine that runs the dashboard; uploading them through the browser copies
them twice. With a data root set (``CALIBER_DATA_ROOT``, or ``caliber dashboard
--data-root DIR``; off by default) the Data page lists the supported files
under it and opens one where it lies.

Nothing outside the root can be opened, listed or probed:

* a requested path is relative, written with ``/``, with no ``..``, no empty or
  ``.`` parts, no backslash, drive or NUL;
* it is resolved with every link followed, and the result must lie inside the
  resolved root and be a regular file with a supported extension;
* the file is opened without following a final link and, where the system
  says which file an open descriptor is (``/proc/self/fd``), checked again
  after opening, so a path swapped for a link between the check and the open
  is caught.

Every refusal is the same :class:`NotInRoot` line, whether the file is missing,
outside the root, a link out of it or a directory: a visitor cannot tell which,
so the error cannot be used to probe the server's files. The listing skips
hidden entries and links that lead out of the root, and stops at
:data:`MAX_LISTED` files.

This module holds no Streamlit code; :mod:`.server_files` opens the files and
:mod:`.server_panel` draws the Data page's part.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from caliber_core.loading import LABELS_EXTENSIONS, SUPPORTED_EXTENSIONS
from caliber_core.loading.safety import display_name

DATA_ROOT_ENV = "CALIBER_DATA_ROOT"
#: Most files the Data page lists (the walk stops there and says so).
MAX_LISTED = 2_000
#: Deepest folder level the listing walks into, below the root.
MAX_DEPTH = 8
OPENABLE_EXTENSIONS = tuple(dict.fromkeys(SUPPORTED_EXTENSIONS + LABELS_EXTENSIONS))
_RULE = ("no such file in the data root (a path is relative to the root, without '..', "
         "and may not lead out of it)")


class NotInRoot(ValueError):
    """A path that cannot be opened from the data root; one message for every reason."""


@dataclass(frozen=True)
class RootFile:
    """One listed file: its path relative to the root (``/``-separated), its size and mtime."""

    path: str
    size: int
    mtime_ns: int


def configured_root(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The data root from ``CALIBER_DATA_ROOT``, resolved; None when unset.

    Raises
    ------
    ValueError
        The variable names something that is not a directory (one line, naming the variable).
    """
    text = environ.get(DATA_ROOT_ENV, "").strip()
    if not text:
        return None
    root = Path(text).expanduser()
    try:
        resolved = root.resolve(strict=True)
    except (OSError, RuntimeError):
        resolved = None
    if resolved is None or not resolved.is_dir():
        raise ValueError(f"{DATA_ROOT_ENV} is not a directory the server can read: {display_name(text)}")
    return resolved


def refusal(relative) -> NotInRoot:
    """The one error for a path that cannot be opened (missing, outside, a link out, not a file)."""
    return NotInRoot(f"{display_name(relative)}: {_RULE}")


def _parts(relative) -> list[str]:
    if not isinstance(relative, str) or not relative or "\x00" in relative or "\\" in relative:
        raise refusal(relative)
    if relative.startswith("/") or (len(relative) > 1 and relative[1] == ":"):
        raise refusal(relative)
    parts = relative.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise refusal(relative)
    return parts


def resolve(root: Path, relative: str, *, extensions: tuple[str, ...] = OPENABLE_EXTENSIONS) -> Path:
    """The real path of ``relative`` under ``root``, or :class:`NotInRoot`.

    Parameters
    ----------
    root : Path
        The resolved data root (:func:`configured_root`).
    relative : str
        A path as the listing gives it.
    extensions : tuple of str
        The extensions accepted (lower case, with the dot).

    Returns
    -------
    Path
        With every link followed; inside ``root``; a regular file.

    Raises
    ------
    NotInRoot
        For every reason alike (see the module docstring).
    """
    parts = _parts(relative)
    try:
        real = root.joinpath(*parts).resolve(strict=True)
        inside = real.is_relative_to(root) and real != root
        regular = inside and stat.S_ISREG(real.stat().st_mode)
    except (OSError, RuntimeError, ValueError):
        raise refusal(relative) from None
    if not regular or real.suffix.lower() not in extensions:
        raise refusal(relative)
    return real


def open_file(root: Path, relative: str, *, extensions: tuple[str, ...] = OPENABLE_EXTENSIONS):
    """Open a file under the root for binary reading, checked before and after the open.

    Returns
    -------
    (file object, Path)
        The open file (the caller closes it) and its real path.

    Raises
    ------
    NotInRoot
        As :func:`resolve`, or when the opened file is not the one checked.
    """
    real = resolve(root, relative, extensions=extensions)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError:
        raise refusal(relative) from None
    try:
        info = os.fstat(fd)
        opened = _fd_path(fd)
        if not stat.S_ISREG(info.st_mode) or (opened is not None and not (
                opened.is_relative_to(root) and opened == real)):
            raise refusal(relative)
        return os.fdopen(fd, "rb"), real
    except BaseException:
        os.close(fd)
        raise


def _fd_path(fd: int) -> Path | None:
    link = f"/proc/self/fd/{fd}"
    try:
        return Path(os.readlink(link))
    except OSError:
        return None


def list_files(root: Path, *, extensions: tuple[str, ...] = OPENABLE_EXTENSIONS,
               limit: int = MAX_LISTED) -> tuple[list[RootFile], bool]:
    """The supported files under the root, sorted by path; and whether the list was cut at ``limit``.

    Hidden files and folders (a leading dot) are skipped; so are links whose
    target lies outside the root, and folders deeper than :data:`MAX_DEPTH`.
    """
    found: list[RootFile] = []
    cut = False
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and depth < MAX_DEPTH)
        for name in sorted(filenames):
            if name.startswith(".") or Path(name).suffix.lower() not in extensions:
                continue
            relative = (here / name).relative_to(root).as_posix()
            try:
                real = resolve(root, relative, extensions=extensions)
                info = real.stat()
            except (NotInRoot, OSError):
                continue
            if len(found) >= limit:
                cut = True
                break
            found.append(RootFile(relative, int(info.st_size), int(info.st_mtime_ns)))
        if cut:
            break
    found.sort(key=lambda f: f.path)
    return found, cut
