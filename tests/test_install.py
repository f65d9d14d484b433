"""The package installs: a wheel built from this checkout, installed without extras into a
fresh virtualenv, calibrates a demo file through its own ``caliber`` command from another
directory, and carries the dashboard's app and pages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "digits_cnn.npz"
PAGES = ("attack_cost", "calibrate", "data", "export", "extraction", "fleet", "policy")


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{cmd[:4]} failed ({proc.returncode}): {proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_wheel_installs_light_and_calibrates_from_another_directory(tmp_path):
    dist = tmp_path / "dist"
    # Built from a copy of what the wheel holds: setuptools' build/ folder in the checkout
    # could carry a file deleted since. The backend is this environment's setuptools.
    source = tmp_path / "source"
    for name in ("caliber_core", "caliber_dashboard"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "--wheel-dir", str(dist), str(source)], cwd=tmp_path)
    (wheel,) = dist.glob("caliber-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "caliber_dashboard/app.py" in names
    assert {f"caliber_dashboard/pages/{page}.py" for page in PAGES} <= names
    assert "caliber_core/cli/calibrate.py" in names

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], env=env)
    installed = json.loads(_run([str(python), "-m", "pip", "list", "--format=json"], env=env).stdout)
    names = {p["name"].lower() for p in installed}
    assert {"caliber", "numpy", "scipy"} <= names
    assert not names & {"torch", "pandas", "streamlit", "pyarrow", "plotly", "redis"}, names

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = elsewhere / "config.json"
    _run([str(env_dir / "bin" / "caliber"), "calibrate", str(DEMO), "--retention", "0.9", "--quiet",
          "--out", str(out)], cwd=elsewhere, env=env)
    config = json.loads(out.read_text())
    from caliber_core.loading import load_logits

    assert config["schema"] == "caliber.config/v2" and config["model"] == load_logits(DEMO).name
    (target,) = config["targets"]
    assert target["kind"] == "retention" and target["requested"] == 0.9 and target["sigma"] > 0

    # The installed package is the one that ran (not this checkout), and its pages are files
    # beside its app.
    where = _run([str(python), "-c", "import caliber_dashboard, pathlib; "
                  "print(pathlib.Path(caliber_dashboard.__file__).parent)"], cwd=elsewhere, env=env).stdout.strip()
    assert Path(where).is_relative_to(env_dir)
    assert all((Path(where) / "pages" / f"{page}.py").is_file() for page in PAGES)

    # Without the dashboard extra, `caliber dashboard` says which extra to install.
    proc = subprocess.run([str(env_dir / "bin" / "caliber"), "dashboard"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and 'pip install "caliber[dashboard]"' in proc.stderr


def test_a_format_whose_library_is_missing_names_the_extra():
    from caliber_core.loading import LogitsFileError
    from caliber_core.loading.safety import optional_library

    with pytest.raises(LogitsFileError, match=r'f\.parquet: reading this format needs no_such_library_x, '
                       r'which is not installed: pip install "caliber\[tables\]"'):
        optional_library("no_such_library_x.parquet", extra="tables", src="f.parquet")
    assert optional_library("json", extra="tables", src="f.csv").loads("1") == 1


def test_the_dashboard_command_binds_this_machine_by_default():
    from caliber_core.cli import build_parser
    from caliber_core.cli.dashboard import command

    cmd = command(build_parser().parse_args(["dashboard", "--", "--server.fileWatcherType=none"]))
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == ROOT / "caliber_dashboard" / "app.py"
    assert "--server.address=127.0.0.1" in cmd and cmd[-1] == "--server.fileWatcherType=none"
    assert "--server.address=0.0.0.0" in command(build_parser().parse_args(["dashboard", "--address", "0.0.0.0"]))
