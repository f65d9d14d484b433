"""``caliber dashboard``: start Streamlit on the dashboard that ships inside the package.

Needs the ``dashboard`` extra (``pip install "caliber[dashboard]"``). The
server binds 127.0.0.1 unless ``--address`` says otherwise; the settings a
checkout keeps in ``.streamlit/config.toml`` are passed as flags, so an
installed package runs the same server from any directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from .arguments import positive_int

#: Streamlit settings the dashboard is served with (the checkout's .streamlit/config.toml); the
#: upload limit comes from the workspace's size cap (:func:`upload_flag`).
SERVER_FLAGS = (
    "--server.enableXsrfProtection=true",
    "--server.enableCORS=true",
    "--browser.gatherUsageStats=false",
    "--runner.magicEnabled=false",
    "--client.toolbarMode=viewer",
)


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``dashboard`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``dashboard`` parser.
    """
    dash = sub.add_parser("dashboard", help="start the dashboard (needs the dashboard extra)")
    dash.add_argument("--address", "--server.address", dest="address", default="127.0.0.1",
                      help="the address to bind (default 127.0.0.1: this machine only)")
    dash.add_argument("--port", "--server.port", dest="port", type=positive_int, default=8501,
                      help="the port (default 8501)")
    dash.add_argument("--headless", action="store_true", help="do not open a browser")
    dash.add_argument("--data-root", dest="data_root", default=None, metavar="DIR",
                      help="a directory whose logits files the Data page lists and opens in place "
                           "(sets CALIBER_DATA_ROOT; off by default)")
    dash.add_argument("streamlit_args", nargs=argparse.REMAINDER,
                      help="further options passed to `streamlit run` (after --)")
    return dash


def app_path() -> Path:
    """The packaged ``caliber_dashboard/app.py`` (its ``pages/`` beside it).

    Raises
    ------
    ValueError
        The dashboard package or Streamlit is not installed (the message names the extra).
    """
    missing = [name for name in ("streamlit", "plotly", "pandas") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"the dashboard needs {', '.join(missing)}: pip install \"caliber[dashboard]\"")
    spec = importlib.util.find_spec("caliber_dashboard")
    if spec is None or spec.origin is None:
        raise ValueError("the caliber_dashboard package is not installed")
    return Path(spec.origin).parent / "app.py"


def upload_flag(environ=None) -> str:
    """``--server.maxUploadSize=N``: the per-file limit set from the workspace's size cap
    (``CALIBER_WORKSPACE_MAX_MB``), in Streamlit's MiB.

    Raises
    ------
    ValueError
        A cap variable that is not a positive number (one line naming it).
    """
    from caliber_dashboard.workspace.settings import upload_limit_mb

    return f"--server.maxUploadSize={upload_limit_mb(os.environ if environ is None else environ)}"


def command(args, environ=None) -> list[str]:
    """The ``streamlit run`` command line for parsed ``args``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``dashboard`` options: ``address``, ``port``, ``headless``, ``streamlit_args``.
    environ : mapping, optional
        The server's environment (default ``os.environ``): its size caps set the upload limit.

    Returns
    -------
    list of str
        The interpreter, ``-m streamlit run``, the packaged app, the server
        flags and any extra arguments (a leading ``--`` dropped).

    Raises
    ------
    ValueError
        The dashboard extra or package is not installed (:func:`app_path`).
    """
    extra = [a for a in args.streamlit_args if a != "--"]
    # Always headless for Streamlit itself: its non-headless start asks a first-run e-mail
    # question on stdin, which blocks a newcomer's terminal and hangs forever without one.
    # The browser is opened by :func:`run` instead, once the server answers.
    return [sys.executable, "-m", "streamlit", "run", str(app_path()), f"--server.address={args.address}",
            f"--server.port={args.port}", "--server.headless=true", *SERVER_FLAGS, upload_flag(environ), *extra]


def local_url(args) -> str:
    """The address a browser on this machine opens (a wildcard bind is reached on loopback)."""
    host = "127.0.0.1" if args.address in ("0.0.0.0", "::", "") else args.address
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{args.port}"


def has_display() -> bool:
    """Whether a graphical browser can be opened: on Linux, only with an X or Wayland display
    (as Streamlit decides; a console browser would take over the terminal)."""
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def open_browser_when_healthy(url: str, *, timeout: float = 120.0, opener=None) -> bool:
    """Open ``url`` in a browser once the server's health check answers.

    Returns whether it was opened: not when the server never answered within
    ``timeout`` seconds, nor where no browser can be found (a remote shell).
    ``opener`` defaults to ``webbrowser.open``.
    """
    # Imported here: every command imports this module, and urllib.request alone took 70-100 ms.
    import urllib.request
    import webbrowser

    opener = webbrowser.open if opener is None else opener
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.3)
    else:
        return False
    try:
        return bool(opener(url))
    except webbrowser.Error:
        return False


def environment(args, base=None) -> dict:
    """The server's environment: ``base`` (default ``os.environ``) plus ``CALIBER_DATA_ROOT`` from ``--data-root``.

    Raises
    ------
    ValueError
        ``--data-root`` is not a directory (one line).
    """
    env = dict(os.environ if base is None else base)
    root = getattr(args, "data_root", None)
    if root is not None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise ValueError(f"--data-root {root}: not a directory")
        env["CALIBER_DATA_ROOT"] = str(path.resolve())
    return env


def run(args) -> int:
    """Run the server until it stops.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``dashboard`` options.

    Returns
    -------
    int
        Streamlit's exit status, or 130 when interrupted.

    Raises
    ------
    ValueError
        The dashboard extra or package is not installed.
    """
    env = environment(args)  # a bad --data-root or size cap is refused before anything starts
    cmd = command(args, env)
    url = local_url(args)
    print(f"Caliber dashboard: {url} (Ctrl-C stops it)", file=sys.stderr, flush=True)
    # stdin is closed for the server: nothing it runs may wait on a prompt.
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    if not args.headless and has_display():
        threading.Thread(target=open_browser_when_healthy, args=(url,), daemon=True).start()
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 130
