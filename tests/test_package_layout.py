"""The package's shape: a light serving import, no private names across modules, small modules."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "caliber_core"
HEAVY = ("scipy", "pandas", "torch", "streamlit", "plotly", "sklearn")
MAX_LINES = 450


def _modules(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def _loaded_after(statement: str) -> list[str]:
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("statement", [
    "from caliber_core import Perturber",
    "from caliber_core import Perturber, LogitsProcessorAdapter, noisy_probabilities, noisy_top_logprobs",
    "from caliber_core.config import load_config, sigma_to_serve",
    "import caliber_core.serving.responses",
])
def test_the_serving_path_loads_no_heavy_library(statement):
    assert _loaded_after(statement) == []


def test_serving_a_config_loads_no_heavy_library(tmp_path):
    config = {"schema": "caliber.config/v2", "model": "m", "n_classes": 3, "n_samples": 2,
              "statistic": "median", "scale": 1.0, "fit": {},
              "targets": [{"kind": "retention", "requested": 0.9, "accuracy": 0.8, "retention": 0.9,
                           "v": 0.25, "sigma": 0.5}]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    statement = ("import numpy as np\nfrom caliber_core import Perturber\n"
                 f"p = Perturber.from_config({str(path)!r}, key=b'sixteen byte key')\n"
                 "p.perturb(np.zeros((2, 3)), ['a', 'b'])")
    assert _loaded_after(statement) == []


def test_the_heavy_names_still_import_on_first_use():
    import caliber_core

    assert callable(caliber_core.sigma_for_target) and callable(caliber_core.load_logits)
    assert callable(caliber_core.simulate_averaging_attack)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        caliber_core.nope  # noqa: B018
    assert set(caliber_core.__all__) <= set(dir(caliber_core))


@pytest.mark.parametrize("path", _modules(CORE), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_modules_stay_under_the_line_limit(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (limit {MAX_LINES})"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _private_imports(path: Path) -> list[str]:
    """`from other import _name` and `other._name` where `other` is another project module."""
    importer = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, module_aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(node.module, node.level, importer, path.name == "__init__.py")
            for alias in node.names:
                if source.split(".")[0] not in ("caliber_core", "caliber_dashboard"):
                    continue
                full = f"{source}.{alias.name}"
                if _is_private(alias.name) and source != importer:
                    found.append(f"from {source} import {alias.name}")
                module_aliases[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("caliber_core", "caliber_dashboard"):
                    module_aliases[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases and _is_private(node.attr)
                and module_aliases[node.value.id] != importer):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize(
    "path", _modules(CORE, ROOT / "caliber_dashboard"),
    ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_another_modules_private_name(path):
    assert _private_imports(path) == []


def test_the_private_import_scan_finds_what_it_looks_for(tmp_path, monkeypatch):
    fake = ROOT / "caliber_core" / "calibration" / "fake_for_scan.py"
    text = ("from .margins import _hidden, visible\nfrom caliber_core.validation import _x\n"
            "from caliber_core.calibration import margins\nmargins._as_logits(1)\n")
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: text)
    assert _private_imports(fake) == [
        "from caliber_core.calibration.margins import _hidden",
        "from caliber_core.validation import _x",
        "margins._as_logits",
    ]


def _string_constants(tree: ast.AST) -> list[str]:
    """String literals of a module, docstrings left out."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_only_the_config_module_knows_the_config_schema():
    """Exactly one module parses config JSON: no other names the schema or reads JSON for it."""
    knowing = []
    for path in _modules(CORE):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path.name != "config.py" and any("caliber.config/" in c for c in _string_constants(tree)):
            knowing.append(str(path.relative_to(ROOT)))
    assert knowing == []
    for name in ("cli/calibrate.py", "cli/commands.py", "serving/runtime.py", "serving/responses.py"):
        tree = ast.parse((CORE / name).read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("load", "loads")
                 and isinstance(n.value, ast.Name) and n.value.id == "json"]
        assert calls == [], name
