"""The versioned config JSON (caliber.config/v2, v1 upgraded): build, save, load, validate."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from caliber_core.calibration.calibrate import saturated_sigma, sigma_for_target
from caliber_core.calibration.config_build import build_config
from caliber_core.config import (
    SCHEMA,
    TARGET_KINDS,
    ConfigError,
    TargetRecord,
    config_to_json,
    inversion_of_method,
    load_config,
    save_config,
    target_records,
    validate_config,
)
from caliber_core.calibration.fleet import calibrate_from_scale
from caliber_core.loading import load_logits
from caliber_core.calibration.pipeline import config_for

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DIGITS_FILE = DATA_DIR / "digits_mlp-wide.npz"
# Deliberately not sorted by kind or value: the config keeps the order asked for.
TARGETS = [("retention", 0.7), ("agreement", 0.8), ("accuracy", 0.5), ("retention", 0.9), ("agreement", 0.6)]


@pytest.fixture(scope="module")
def built():
    data = load_logits(DIGITS_FILE)
    cal, results, config = config_for(data, TARGETS)
    return data, cal, results, config


def _float_leaves(obj, path=""):
    """Every float in a nested config, keyed by its path."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_float_leaves(v, f"{path}/{k}"))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_float_leaves(v, f"{path}[{i}]"))
        return out
    return {path: obj} if isinstance(obj, float) else {}


# --------------------------------------------------------------------------- round trip


def test_save_then_load_gives_back_the_identical_dict(built, tmp_path):
    _, _, _, config = built
    path = tmp_path / "config.json"
    save_config(config, path)
    loaded = load_config(path)
    assert loaded == config
    original, back = _float_leaves(config), _float_leaves(loaded)
    assert original.keys() == back.keys() and len(original) > 20
    for key, value in original.items():
        assert repr(back[key]) == repr(value), key
    # Loading the text or the bytes directly gives the same, as does saving again.
    text = path.read_text(encoding="utf-8")
    assert load_config(text) == config
    assert load_config(text.encode("utf-8")) == config
    assert load_config(str(path)) == config
    path2 = tmp_path / "again.json"
    save_config(loaded, path2)
    assert path2.read_text(encoding="utf-8") == text


def test_config_is_plain_json(built):
    _, _, _, config = built
    text = config_to_json(config)
    assert text.endswith("\n")
    parsed = json.loads(text)  # strict JSON: no NaN / Infinity tokens
    assert parsed == config
    assert "NaN" not in text and "Infinity" not in text


# --------------------------------------------------------------------------- contents


def test_required_fields_and_values(built):
    data, cal, results, config = built
    assert config["schema"] == SCHEMA == "caliber.config/v2"
    assert config["model"] == data.name == "digits-mlp-wide"
    assert config["n_classes"] == 10 and config["n_samples"] == 500
    assert config["sha256"] == hashlib.sha256(DIGITS_FILE.read_bytes()).hexdigest()
    assert config["statistic"] == "median"
    assert config["scale"] == cal.scale > 0
    assert config["scales"]["median"] == cal.scale
    with np.load(DIGITS_FILE) as d:
        a0 = float(np.mean(np.argmax(d["logits"], axis=1) == d["labels"]))
    assert config["clean_accuracy"] == a0
    fit = config["fit"]
    assert fit["mode"] == "per-model" and fit["law"] == "logistic" and fit["quantity"] == "accuracy"
    assert (fit["v50"], fit["p"], fit["c"], fit["r2"]) == (cal.fit.v50, cal.fit.p, cal.fit.c, cal.fit.r2)
    assert 0.99 < fit["r2"] <= 1.0


def test_targets_keep_the_requested_order_and_carry_every_field(built):
    _, cal, results, config = built
    targets = config["targets"]
    assert [(t["kind"], t["requested"]) for t in targets] == TARGETS
    for t, r in zip(targets, results):
        for field in ("kind", "accuracy", "retention", "agreement", "v", "sigma"):
            assert field in t
        assert t["sigma"] == r.sigma > 0
        assert t["v"] == pytest.approx((t["sigma"] / config["scale"]) ** 2, rel=1e-12)
        if t["kind"] == "agreement":
            assert t["agreement"] == t["requested"]
            assert t["accuracy"] is None and t["retention"] is None
        else:
            assert t["agreement"] is None
            assert t["retention"] == pytest.approx(t["accuracy"] / config["clean_accuracy"], rel=1e-12)
        # The config's sigma is what sigma_for_target says for the same calibration.
        again = sigma_for_target(cal, t["requested"], kind=t["kind"])
        assert again.sigma == t["sigma"]


def test_a_saturated_target_serves_the_largest_sigma_swept(built, tmp_path):
    data, cal, _, _ = built
    unreachable = sigma_for_target(cal, 0.05, kind="accuracy", saturate=True)
    assert unreachable.saturated and math.isinf(unreachable.sigma_logistic)
    assert unreachable.sigma == saturated_sigma(cal) == cal.sweep.sigma[-1]
    assert unreachable.v == pytest.approx(cal.sweep.v[-1], rel=1e-12)
    config = build_config(cal, [unreachable], sha256=data.sha256, source=data.source)
    path = tmp_path / "saturated.json"
    save_config(config, path)
    parsed = json.loads(path.read_text(encoding="utf-8"))  # valid, strict JSON
    t = parsed["targets"][0]
    assert t["saturated"] is True and t["sigma"] == unreachable.sigma and t["v"] == unreachable.v
    assert t["sigma_logistic"] is None  # the closed form has no finite answer: shown as null
    assert load_config(path)["targets"][0]["sigma"] == unreachable.sigma


def test_an_infinite_sigma_is_not_a_config(built):
    data, cal, _, _ = built
    # A shared law saturates to sigma = inf when it is not told where its sweeps ended.
    shared = calibrate_from_scale(cal.fit, scale=cal.scale, clean_accuracy=cal.clean_accuracy, n_classes=10,
                                  value=0.05, kind="accuracy", saturate=True)
    assert shared.saturated and math.isinf(shared.sigma)
    with pytest.raises(ConfigError, match=r"targets\[0\].sigma must be a finite number >= 0, got inf"):
        config_to_json(build_config(cal, [shared], sha256=data.sha256, source=data.source))
    bounded = calibrate_from_scale(cal.fit, scale=cal.scale, clean_accuracy=cal.clean_accuracy, n_classes=10,
                                   value=0.05, kind="accuracy", saturate=True, v_max=float(cal.sweep.v[-1]))
    assert bounded.saturated and bounded.v == cal.sweep.v[-1]
    assert bounded.sigma == pytest.approx(cal.sweep.sigma[-1], rel=1e-12)
    assert bounded.method == "saturated-shared-logistic"


def test_v1_configs_are_upgraded_on_load(built):
    cfg = _minimal(built)
    cfg["schema"] = "caliber.config/v1"
    for t in cfg["targets"]:
        del t["side"], t["interval"], t["attacker"]
    # v1 wrote a saturated sigma as null; the sweep's end is recovered from sweep.v_max and S.
    cfg["targets"][0].update(sigma=None, v=None, saturated=True, method="saturated-exact-curve")
    before = copy.deepcopy(cfg)
    loaded = load_config(cfg)
    assert cfg == before  # the caller's dict is left alone
    assert loaded["schema"] == SCHEMA
    assert all(t["side"] == "point" and t["interval"] is None for t in loaded["targets"])
    v_max = cfg["sweep"]["v_max"]
    assert loaded["targets"][0]["v"] == v_max
    assert loaded["targets"][0]["sigma"] == pytest.approx(cfg["scale"] * math.sqrt(v_max), rel=1e-15)
    assert loaded["targets"][1:] == [{**t, "side": "point", "interval": None} for t in cfg["targets"][1:]]
    del cfg["sweep"]
    with pytest.raises(ConfigError, match=r"targets\[0\] is saturated with sigma null"):
        load_config(cfg)


def test_target_record_is_keyword_only_and_round_trips(built):
    _, _, results, config = built
    with pytest.raises(TypeError):
        TargetRecord("retention", 0.9, 0.8, 0.9, None, 0.1, 1.0, 1.0, "exact-curve")  # noqa
    assert target_records(config) == results
    assert [r.to_dict() for r in results] == config["targets"]
    assert results[0].side == "point" and results[0].interval["level"] == 0.95 and results[0].attacker is None


@pytest.mark.parametrize("method, inversion", [
    ("exact-curve", "curve"), ("monte-carlo-curve", "curve"), ("saturated-curve", "curve"),
    ("exact-agreement", "curve"), ("saturated-exact-agreement", "curve"), ("none-needed", "curve"),
    ("logistic", "logistic"), ("saturated-logistic", "logistic"), ("shared-logistic", "logistic"),
    ("saturated-shared-logistic", "logistic"),
])
def test_the_inversion_is_read_from_the_recorded_method(method, inversion):
    assert inversion_of_method(method) == inversion


def test_target_kinds_are_one_tuple():
    assert TARGET_KINDS == ("retention", "accuracy", "agreement", "surrogate-retention")


def test_side_interval_and_attacker_are_validated(built):
    cfg = _minimal(built)
    cfg["targets"][0]["side"] = "at-least"
    cfg["targets"][0]["interval"] = {"level": 0.95, "method": "bootstrap", "accuracy": [0.7, 0.72],
                                     "retention": None, "agreement": None}
    validate_config(cfg)
    for key, bad, match in [
        ("side", "above", r"targets\[0\].side must be one of \('point', 'at-least', 'at-most'\), got 'above'"),
        ("interval", {"level": 1.5, "method": "x"}, r"targets\[0\].interval.level must be a number in \(0, 1\)"),
        ("interval", {"level": 0.9, "method": "x", "accuracy": [0.8, 0.7]},
         r"targets\[0\].interval.accuracy must be \[lo, hi\] with lo <= hi"),
        ("attacker", "distill", r"targets\[0\].attacker must be an object or null"),
        ("kind", "loss", r"targets\[0\].kind must be one of .*got 'loss'"),
    ]:
        bad_cfg = _minimal(built)
        bad_cfg["targets"][0][key] = bad
        with pytest.raises(ConfigError, match=match):
            validate_config(bad_cfg)
    surrogate = _minimal(built)
    surrogate["targets"][0]["kind"] = "surrogate-retention"
    with pytest.raises(ConfigError, match=r"needs an 'attacker' object"):
        validate_config(surrogate)
    surrogate["targets"][0]["attacker"] = {"recipe": "distillation", "seeds": [0, 1]}
    validate_config(surrogate)


# --------------------------------------------------------------------------- errors


def _minimal(built):
    return copy.deepcopy(built[3])


def test_wrong_schema_is_rejected(built):
    cfg = _minimal(built)
    cfg["schema"] = "caliber.config/v0"
    with pytest.raises(ConfigError, match=r"schema must be 'caliber.config/v2', got 'caliber.config/v0'"):
        load_config(cfg)
    del cfg["schema"]
    with pytest.raises(ConfigError, match=r"got None"):
        load_config(json.dumps(cfg))


@pytest.mark.parametrize("field", ["model", "n_classes", "n_samples", "statistic", "scale", "fit", "targets"])
def test_missing_field_is_rejected(built, field):
    cfg = _minimal(built)
    del cfg[field]
    with pytest.raises(ConfigError, match=rf"missing field\(s\): {field}"):
        load_config(json.dumps(cfg))


@pytest.mark.parametrize("field", ["kind", "accuracy", "retention", "v", "sigma"])
def test_missing_target_field_is_rejected(built, field):
    cfg = _minimal(built)
    del cfg["targets"][2][field]
    with pytest.raises(ConfigError, match=rf"targets\[2\] is missing field\(s\): {field}"):
        validate_config(cfg)


@pytest.mark.parametrize("sigma, shown", [(-0.5, "-0.5"), ("1.0", "'1.0'"), (float("nan"), "nan"),
                                          (None, "None"), (float("inf"), "inf")])
def test_bad_sigma_is_rejected(built, sigma, shown):
    cfg = _minimal(built)
    cfg["targets"][1]["sigma"] = sigma
    with pytest.raises(ConfigError, match=rf"targets\[1\].sigma must be a finite number >= 0, got {shown}"):
        validate_config(cfg)


def test_negative_sigma_in_a_file_is_rejected(built, tmp_path):
    text = config_to_json(built[3]).replace(f'"sigma": {built[3]["targets"][0]["sigma"]!r}', '"sigma": -1.0', 1)
    assert '"sigma": -1.0' in text
    path = tmp_path / "neg.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"targets\[0\].sigma must be a finite number >= 0, got -1.0"):
        load_config(path)


@pytest.mark.parametrize("scale", [0.0, -2.0, None, "3"])
def test_bad_scale_is_rejected(built, scale):
    cfg = _minimal(built)
    cfg["scale"] = scale
    with pytest.raises(ConfigError, match=r"scale must be a positive number"):
        validate_config(cfg)


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"schema": "caliber.config/v2", ', r"not valid JSON \(line 1: "),
        ("{nope}", r"not valid JSON"),
        (b"\xff\xfe{", r"not valid JSON"),
    ],
)
def test_bad_json_is_rejected(text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(text)


def test_bad_json_file_is_rejected(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"schema": "caliber.config/v1",\n "model": }', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"not valid JSON \(line 2: "):
        load_config(path)


def test_non_object_json_and_bad_sources_are_rejected(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"must be a JSON object, got list"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"cannot read config"):
        load_config(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match=r"must be a path, JSON text or a dict, got int"):
        load_config(42)
    cfg = {"schema": SCHEMA, "model": "m", "n_classes": 10, "n_samples": 5, "statistic": "median",
           "scale": 1.0, "fit": {}, "targets": {"not": "a list"}}
    with pytest.raises(ConfigError, match=r"'targets' must be a list"):
        validate_config(cfg)
    cfg["targets"] = [3]
    with pytest.raises(ConfigError, match=r"targets\[0\] must be an object"):
        validate_config(cfg)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_an_invalid_config_is_not_saved(built, tmp_path):
    cfg = _minimal(built)
    cfg["scale"] = -1.0
    path = tmp_path / "never.json"
    with pytest.raises(ConfigError, match=r"scale"):
        save_config(cfg, path)
    assert not path.exists()


def test_boolean_sigma_is_rejected(built):
    cfg = _minimal(built)
    cfg["targets"][0]["sigma"] = True
    with pytest.raises(ConfigError, match=r"targets\[0\].sigma must be a finite number"):
        validate_config(cfg)


# --------------------------------------------------------------------------- the loaded Config


def test_a_loaded_config_is_read_only_and_never_parsed_again(built, tmp_path):
    import caliber_core.config as config_module
    from caliber_core.config import Config, config_digest, sigma_to_serve

    _, _, _, config = built
    loaded = load_config(config)
    assert isinstance(loaded, Config) and loaded == config and json.loads(json.dumps(loaded)) == config
    assert load_config(loaded) is loaded and config_digest(loaded) == config_digest(config) == loaded.digest
    with pytest.raises(TypeError, match="a loaded Config is read-only"):
        loaded["model"] = "other"
    with pytest.raises(TypeError, match="a loaded FrozenDict is read-only"):
        loaded["targets"][0]["sigma"] = 0.0
    with pytest.raises(TypeError, match="a loaded FrozenList is read-only"):
        loaded["targets"].append({})
    with pytest.raises(TypeError, match="read-only"):
        loaded.digest = "0" * 64
    plain = copy.deepcopy(loaded)  # the way to an editable copy
    plain["targets"][0]["sigma"] = 0.0
    assert type(plain) is dict and loaded["targets"][0]["sigma"] == config["targets"][0]["sigma"]

    validated = []
    original = config_module.validate_config
    try:
        config_module.validate_config = lambda c: validated.append(type(c).__name__) or original(c)
        sigma_to_serve(loaded, target=1), config_digest(loaded), config_module.target_records(loaded)
        assert validated == []  # a Config is taken as it is
        sigma_to_serve(config, target=1)
        assert validated == ["dict"]  # today's dict: validated once, at the door
    finally:
        config_module.validate_config = original


def test_the_perturber_validates_a_dict_config_once(built, monkeypatch):
    import caliber_core.config as config_module
    from caliber_core import Perturber

    _, _, _, config = built
    calls = []
    original = config_module.validate_config
    monkeypatch.setattr(config_module, "validate_config", lambda c: calls.append(1) or original(c))
    Perturber.from_config(config, key=b"sixteen byte key", target=1)
    assert len(calls) == 1
