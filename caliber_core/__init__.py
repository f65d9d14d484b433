"""Caliber: margin-normalized calibration of logit noise against model extraction.

The pieces, one concept per module:

* :mod:`margins`  top-two margins, the scale S, normalized axes v and A~
* :mod:`sweep`    Monte-Carlo accuracy/agreement under noise, all sigma in one pass
* :mod:`survival` exact survival probabilities by quadrature, the corridor
* :mod:`fit`      the logistic decay law and its closed-form inverse
* :mod:`calibrate` one model: sweep, fit, target -> sigma*
* :mod:`fleet`    shared per-task fits, leave-one-architecture-out, S ablation
* :mod:`cost`     Proposition 2: queries an averaging attacker needs
* :mod:`config`   the versioned config JSON
* :mod:`loading`  safe reading of every supported logits format
* :mod:`runtime`  applying a config to served logits (per-input seeding)
* :mod:`attack`   Monte-Carlo simulation of the averaging attack
"""

__version__ = "0.1.0"

from .calibration.calibrate import Calibration, TargetResult, calibrate_model, sigma_for_target  # noqa: E402
from .config import SCHEMA, ConfigError, build_config, load_config, save_config  # noqa: E402
from .calibration.fit import LogisticFit, fit_logistic, invert_logistic, logistic_decay  # noqa: E402
from .loading import LogitsData, LogitsFileError, load_logits, load_logits_bytes  # noqa: E402
from .calibration.margins import margin_scale, normalized_noise, normalized_utility, top_two_margins  # noqa: E402
from .serving.responses import LogitsProcessorAdapter, noisy_probabilities, noisy_top_logprobs  # noqa: E402
from .serving.runtime import Perturber, per_input_noise, sigma_from_config  # noqa: E402

__all__ = [
    "Calibration", "ConfigError", "LogisticFit", "LogitsData", "LogitsFileError",
    "LogitsProcessorAdapter", "Perturber", "SCHEMA", "TargetResult", "build_config",
    "calibrate_model", "fit_logistic", "format_attack_table", "invert_logistic",
    "load_config", "load_logits", "load_logits_bytes", "logistic_decay", "margin_scale",
    "noisy_probabilities", "noisy_top_logprobs", "normalized_noise", "normalized_utility",
    "per_input_noise", "save_config", "sigma_for_target", "sigma_from_config",
    "simulate_averaging_attack", "top_two_margins",
]


def __getattr__(name):
    # The attack simulation needs pandas; load it only when asked (keeps the CLI start fast).
    if name in ("simulate_averaging_attack", "format_attack_table"):
        from . import attack

        return getattr(attack, name)
    raise AttributeError(f"module 'caliber_core' has no attribute {name!r}")
