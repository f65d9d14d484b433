"""Caliber: margin-normalized calibration of logit noise against model extraction.

The package, by purpose:

* :mod:`caliber_core.config`       targets and the versioned config JSON (the shared contract)
* :mod:`caliber_core.serving`      applying a config to served logits: ``runtime`` (Perturber:
  nested levels bound to the config; per-input, fresh and consistent seeding), ``keyed_noise``,
  ``keyed_noise_torch`` and ``normal_table`` (the one keyed generator, numpy and torch),
  ``keys`` (key files, fingerprints), ``rows`` (row checks, ids), ``consistent_noise`` (the
  keyed smooth function of the logits) and ``responses`` (probabilities, top-k
  log-probabilities, HF processor)
* :mod:`caliber_core.throttle`     serving a config to flagged accounts: the policy file, the
  ledger and its SQLite and Redis stores, ``Throttle``, audit, simulation, metrics
* :mod:`caliber_core.calibration`  the numerics, one concept per module:

  - ``sample``    one file's logits and labels validated once, with their derived arrays
  - ``margins``   top-two margins, the scale S, the normalized axes v and A~
  - ``draws``     the sweep's noise draws (the shared pool) and per-draw survival intervals
  - ``sweep``     the Monte-Carlo sweep over every sigma at once, its standard errors
  - ``survival``  Proposition 1 by quadrature, per row
  - ``engine``    the one engine: per-row survival (exact or Monte Carlo by one cost
    policy) and every curve that is a mean of it
  - ``corridor``  agreement, accuracy and the Corollary 1 corridor on a sigma grid
  - ``fit``       the logistic law and its bounded least-squares fit
  - ``inversion`` every target -> sigma map (curves, bounds, the law's closed form)
  - ``calibrate`` one model: sweep + fit + sigma* per target
  - ``intervals``, ``target_intervals`` the row bootstrap; each target's interval and side
  - ``drift``     a config against a new sample
  - ``review``    a saved config against a model calibrated now
  - ``cost``      Proposition 2: queries an averaging attacker needs
  - ``fleet``     the shared law over several models, leave-one-out, the margin ablation
  - ``pipeline``  file -> config, shared by the CLI and the dashboard
  - ``calibration_arrays`` a finished calibration as plain arrays and back
  - ``keyed_curve``, ``keyed_config`` one key's realized curve (consistent seeding) and its config
* :mod:`caliber_core.loading`      safe reading of every supported logits format
* :mod:`caliber_core.simulation`   the averaging attack, the one majority-vote rule (``votes``),
  the reference argmax Monte Carlo, synthetic large-K logits
* :mod:`caliber_core.extraction`   the thief: surrogates distilled from noisy answers,
  the defense frontier, the ``extract`` experiment, adaptive thieves (prior correction,
  recalibration), per-input against consistent seeding, the tuned peer attacker
* :mod:`caliber_core.validation`   input checks shared by all of the above
* :mod:`caliber_core.cli`, :mod:`caliber_core.check_command`  the command line
* :mod:`caliber_core.target_record`  the frozen record of one target (re-exported by ``config``)

Importing the package loads only the serving path and the config contract
(numpy and the standard library); every other name below is imported on first
use, so a serving process never loads scipy, pandas or torch.
"""

__version__ = "0.1.0"

from .config import (  # noqa: E402
    SCHEMA,
    TARGET_KINDS,
    ConfigError,
    SaturatedTargetWarning,
    TargetRecord,
    build_config,
    load_config,
    save_config,
    sigma_to_serve,
)
from .serving.responses import LogitsProcessorAdapter, noisy_probabilities, noisy_top_logprobs  # noqa: E402
from .serving.runtime import Perturber, per_input_noise  # noqa: E402

# Public names imported on first use: name -> module (relative to this package).
_LAZY = {
    "Calibration": "calibration.calibrate",
    "calibrate_model": "calibration.calibrate",
    "sigma_for_target": "calibration.calibrate",
    "LogisticFit": "calibration.fit",
    "fit_logistic": "calibration.fit",
    "invert_logistic": "calibration.inversion",
    "logistic_decay": "calibration.fit",
    "margin_scale": "calibration.margins",
    "normalized_noise": "calibration.margins",
    "normalized_utility": "calibration.margins",
    "sigma_from_v": "calibration.margins",
    "top_two_margins": "calibration.margins",
    "LogitSample": "calibration.sample",
    "CurveEngine": "calibration.engine",
    "LogitsData": "loading",
    "LogitsFileError": "loading",
    "load_logits": "loading",
    "load_logits_bytes": "loading",
    "simulate_averaging_attack": "simulation.attack",
    "format_attack_table": "simulation.attack",
}

__all__ = sorted([
    "SCHEMA", "TARGET_KINDS", "ConfigError", "SaturatedTargetWarning", "TargetRecord",
    "build_config", "load_config", "save_config", "sigma_to_serve",
    "LogitsProcessorAdapter", "noisy_probabilities", "noisy_top_logprobs",
    "Perturber", "per_input_noise", *_LAZY,
])


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'caliber_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
