"""Caliber: margin-normalized calibration of logit noise against model extraction.

The package, by purpose:

* :mod:`caliber_core.config`       targets and the versioned config JSON (the shared contract)
* :mod:`caliber_core.serving`      applying a config to served logits: ``runtime`` (Perturber:
  nested levels bound to the config; per-input, fresh and consistent seeding), ``keyed_noise``,
  ``keyed_noise_torch`` and ``normal_table`` (the one keyed generator, numpy and torch),
  ``fused_noise`` (the same noise as one compiled CPU kernel for torch tensors),
  ``compiled_noise`` (the same noise as one torch.compile kernel for CUDA tensors),
  ``keys`` (key files, fingerprints), ``rows`` (row checks, ids), ``consistent_noise`` (the
  keyed smooth function of the logits), ``class_cycle_noise`` (the class-cycle design),
  ``consistent_levels`` (a consistent config's nested levels), ``responses`` (probabilities, top-k
  log-probabilities, HF processor), ``canonical`` (request ids that cannot be multiplied)
  and ``accounts`` (the account of an Authorization header)
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
* :mod:`caliber_core.cli`          the command line, one module per subcommand
* :mod:`caliber_core.target_record`  the frozen record of one target (re-exported by ``config``)

Importing the package loads nothing but its version; every name below is
imported from its module on first use (:mod:`caliber_core.lazy_names`), so
a serving process never loads scipy, pandas or torch, and no submodule
imports back into a package that is still importing it.
"""

from .lazy_names import lazy_names
from .version import __version__

# Public names, each imported on first use: name -> module (relative to this package).
_LAZY = {
    "SCHEMA": "config",
    "TARGET_KINDS": "config",
    "ConfigError": "config",
    "SaturatedTargetWarning": "config",
    "TargetRecord": "config",
    "load_config": "config",
    "save_config": "config",
    "sigma_to_serve": "config",
    "build_config": "calibration.config_build",
    "LogitsProcessorAdapter": "serving.responses",
    "noisy_probabilities": "serving.responses",
    "noisy_top_logprobs": "serving.responses",
    "Perturber": "serving.runtime",
    "per_input_noise": "serving.runtime",
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

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
