"""Plain C kernels built by the machine's own compiler: once per source, flags, compiler and CPU, into a cache.

The served noise (``serving/fused_noise.c``) and the dump's row reduction
(``calibration/gap_rows.c``) are plain C with no Python headers, so any C
compiler builds them in a second or two. The library lands in
``CALIBER_KERNEL_CACHE`` (default ``~/.cache/caliber/kernels``) under a name
that hashes everything it depends on, so later processes load it, and a cache
shared between machines never hands one CPU another's instructions
(``-march=native``). Each kernel's module binds, self-checks and falls back on
its own.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["built_library", "compiler", "load_checked", "load_once"]


def compiler() -> str | None:
    """The C compiler to build with: ``CC``, else cc, gcc or clang on the PATH; None where there is none."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def _cpu_fingerprint() -> str:
    """What a library was compiled for (-march=native)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            lines = [line for line in handle if line.startswith(("flags", "model name", "Features", "CPU part"))]
        text = "".join(sorted(set(lines)))
    except OSError:
        text = platform.processor()
    return f"{platform.system()}-{platform.machine()}-{text}"


def _cache_dir() -> Path:
    configured = os.environ.get("CALIBER_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "caliber" / "kernels"


def _build(command: str, source: Path, flags: tuple, target: Path) -> None:
    """Build into ``target`` atomically (a concurrent loader never sees half a file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for arch in (("-march=native",), ()):  # a compiler without -march=native still builds it
        fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        proc = subprocess.run([*command.split(), *flags, *arch, "-o", partial, str(source)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode == 0:
            os.replace(partial, target)
            return
        os.unlink(partial)
        errors.append((proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"])
    raise RuntimeError(f"{command} failed: {errors[-1][0]}")


def built_library(source: Path, flags: tuple) -> Path:
    """The cached shared library of ``source`` built with ``flags``, built now if the cache lacks it.

    Parameters
    ----------
    source : Path
        A C file.
    flags : tuple of str
        Compiler flags (``-march=native`` is added, or left out where the compiler refuses it).

    Returns
    -------
    Path
        ``<cache>/<source stem>-<24 hex digits>.so``.

    Raises
    ------
    RuntimeError
        No compiler and nothing cached, or the compiler failed (its last line of output).
    """
    command = compiler()
    identity = hashlib.sha256()
    for part in (source.read_bytes(), " ".join(flags).encode(), (command or "none").encode(),
                 _cpu_fingerprint().encode(), sys.platform.encode()):
        identity.update(hashlib.sha256(part).digest())
    cached = _cache_dir() / f"{source.stem}-{identity.hexdigest()[:24]}.so"
    if not cached.exists():
        if command is None:
            raise RuntimeError("no C compiler found (set CC, or install gcc or clang)")
        _build(command, source, flags, cached)
    return cached


def load_once(state: dict, lock, load, on_failure=None):
    """``load()``'s library, decided once per process and kept in ``state`` with the reason it failed.

    Parameters
    ----------
    state : dict
        The kernel module's own: ``"library"`` (None after a failure) and ``"reason"``.
    lock : threading.Lock
        Held only while deciding; later calls read ``state`` without it.
    load : callable
        Builds or loads, binds and self-checks; any exception means the slower path serves.
    on_failure : callable, optional
        Called once with the reason (a warning, say).

    Returns
    -------
    ctypes.CDLL or None
    """
    library = state.get("library", state)  # decided already: no lock on every request
    if library is not state:
        return library
    with lock:
        if "library" not in state:
            try:
                state["library"], state["reason"] = load(), None
            except Exception as exc:  # any failure to build, load or self-check
                state["library"], state["reason"] = None, f"{type(exc).__name__}: {exc}"
                if on_failure is not None:
                    on_failure(state["reason"])
    return state["library"]


def load_checked(source: Path, flags: tuple, switch: str, bind, self_check):
    """The built library of ``source``, bound and self-checked; refused while the environment variable ``switch``
    is 0, off or no.

    Returns
    -------
    ctypes.CDLL
        ``bind``'s result, after ``self_check`` passed on it.

    Raises
    ------
    RuntimeError
        Switched off, no compiler, a failed build, or what ``bind`` or ``self_check`` raise.
    """
    if os.environ.get(switch, "").lower() in ("0", "off", "no"):
        raise RuntimeError(f"{switch} is off")
    library = bind(ctypes.CDLL(str(built_library(source, flags))))
    self_check(library)
    return library
