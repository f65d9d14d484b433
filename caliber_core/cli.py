"""The command line: ``python -m caliber_core {calibrate,check,fleet,attack,extract,keygen,throttle} ...``.

A user error (a bad file, an impossible target) prints one line on stderr and
exits with status 2; an unexpected failure prints one line and exits 1 (set
CALIBER_DEBUG=1 for the traceback). ``check`` exits 3 when new traffic no
longer fits a config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from .check_command import confidence_level
from .config import CALIBRATED_KINDS, SIDES

EXIT_USER_ERROR = 2
EXIT_INTERNAL = 1


# The option that asks for each kind of target calibrate solves.
_TARGET_FLAGS = {
    "retention": ("--retention", "fraction of the clean accuracy A0"),
    "accuracy": ("--target-accuracy", "absolute accuracy"),
    "agreement": ("--agreement", "agreement with the clean prediction"),
}


class _OrderedTarget(argparse.Action):
    """Collect --target-accuracy/--retention/--agreement into one list, in command-line order."""

    def __call__(self, parser, namespace, values, option_string=None):
        targets = getattr(namespace, "targets", None) or []
        for value in values:
            targets.append((self.const, value))
        namespace.targets = targets


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value > 1.0 and value <= 100.0:
        value /= 100.0  # accept 80 as 80%
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1] or a percentage, got {text}")
    return value


def _add_max_elements(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-elements", type=int, default=None, metavar="N",
                        help="refuse logits files declaring more elements than this "
                        "(default: caliber_core.loading.DEFAULT_MAX_ELEMENTS)")


def _load(path, args, labels_path=None):
    from .loading import DEFAULT_MAX_ELEMENTS, load_logits

    limit = DEFAULT_MAX_ELEMENTS if args.max_elements is None else args.max_elements
    return load_logits(path, labels_path=labels_path, max_elements=limit)


def _add_seeding(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeding", choices=("per-input", "consistent"), default="per-input",
                        help="per-input: noise drawn per request id (default); consistent: a keyed smooth "
                        "function of the logits, calibrated for the key in --key-file")
    parser.add_argument("--key-file", help="the serving key (hex, one line); consistent seeding only")
    parser.add_argument("--length-scale", type=float, default=None, metavar="L",
                        help="consistent noise's correlation length in units of S (default 4)")
    parser.add_argument("--noise-id", default=None, metavar="HEX",
                        help="consistent seeding: reuse this noise identity (default: a new random one)")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m caliber_core",
        description="Calibrate Gaussian logit noise against model extraction (Caliber).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    cal = sub.add_parser("calibrate", help="calibrate one model file and write its config JSON")
    cal.add_argument("file", help="logits file (.npz, .npy, .pt, .safetensors, .csv, .parquet), an lm-eval "
                     "samples file or a top-k logprob log (.jsonl/.json)")
    cal.add_argument("--labels", help="labels file for .npy logits")
    for kind in CALIBRATED_KINDS:
        flag, what = _TARGET_FLAGS[kind]
        cal.add_argument(flag, nargs="+", type=_fraction, action=_OrderedTarget, const=kind,
                         dest="targets", metavar="X", help=f"target(s) as {what}")
    cal.add_argument("--margin-stat", choices=("median", "mean", "trimmed"), default="median")
    cal.add_argument("--seed", type=int, default=0)
    cal.add_argument("--realizations", type=int, default=None,
                     help="noise draws per input (default: chosen from N)")
    cal.add_argument("--inversion", choices=("curve", "logistic"), default="curve",
                     help="invert the measured curve (default) or the fitted logistic")
    cal.add_argument("--side", choices=SIDES, default="point",
                     help="point: sigma* itself (default); at-least / at-most: the sigma at which the "
                     "lower / upper confidence bound of each target's quantity equals the target")
    cal.add_argument("--confidence", type=confidence_level, default=0.95,
                     help="level of every target's interval and of the side's bound (default 0.95)")
    cal.add_argument("--saturate", action="store_true",
                     help="an unreachable target serves the largest sigma the sweep measured "
                     "(marked saturated, with a warning) instead of failing")
    cal.add_argument("--out", help="write the config JSON here (default: print it)")
    cal.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _add_seeding(cal)
    _add_max_elements(cal)
    cal.add_argument("--vocab-size", type=int, default=None, metavar="V",
                     help="top-k logprob logs: the model's vocabulary size (the unseen tail has V - k classes)")
    cal.add_argument("--multi-token", action="store_true",
                     help="lm-eval samples: accept choices of several tokens (their summed scores are not "
                     "logits under the served noise; a warning says so)")

    fleet = sub.add_parser("fleet", help="shared fit and leave-one-out table over several models")
    fleet.add_argument("files", nargs="+")
    fleet.add_argument("--margin-stat", choices=("median", "mean", "trimmed"), default="median")
    fleet.add_argument("--seed", type=int, default=0)
    fleet.add_argument("--out", help="write the shared fit and tables as JSON here")
    _add_max_elements(fleet)

    att = sub.add_parser("attack", help="simulate the averaging attack at a sigma")
    att.add_argument("file")
    att.add_argument("--labels")
    group = att.add_mutually_exclusive_group(required=True)
    group.add_argument("--sigma", type=float)
    group.add_argument("--config", help="a config JSON; uses its --target entry's sigma")
    att.add_argument("--target", type=int, default=0, help="index into the config's targets")
    att.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    att.add_argument("--seed", type=int, default=0)
    _add_max_elements(att)
    from .check_command import add_parser as add_check_parser
    from .extraction.command import add_parser as add_extract_parser

    _add_max_elements(add_check_parser(sub))

    add_extract_parser(sub)
    from .serving.keys import add_keygen_parser

    add_keygen_parser(sub)
    from .throttle.command import add_parser as add_throttle_parser

    add_throttle_parser(sub)
    return parser


def _progress(enabled: bool):
    if not enabled or not sys.stderr.isatty():
        return None

    def report(fraction: float) -> None:
        print(f"\rsweeping noise: {fraction:5.0%}", end="" if fraction < 1 else "\n", file=sys.stderr)

    return report


def _cmd_calibrate(args) -> int:
    from .calibration.pipeline import DEFAULT_TARGETS, config_for
    from .calibration.target_intervals import interval_notes
    from .config import config_to_json, saturation_message

    if str(args.file).lower().endswith((".jsonl", ".json")):
        return _cmd_calibrate_llm(args)
    data = _load(args.file, args, labels_path=args.labels)
    for warning in data.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    targets = getattr(args, "targets", None) or list(DEFAULT_TARGETS)
    _, results, config = config_for(
        data, targets, statistic=args.margin_stat, seed=args.seed,
        realizations=args.realizations, inversion=args.inversion, saturate=args.saturate,
        side=args.side, confidence=args.confidence, progress=_progress(not args.quiet),
    )
    if args.seeding == "consistent" or args.key_file or args.length_scale is not None or args.noise_id:
        config = _consistent(config, data, args)
    text = config_to_json(config)
    for result in results:
        if result.saturated:
            print(f"warning: {saturation_message(result)}", file=sys.stderr)
    advice, wide = interval_notes(config)
    if wide:
        print(f"warning: {wide}", file=sys.stderr)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(_target_table(config))
        if advice:
            print(f"interval half-width, widest target: {advice}")
        print(f"config written to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def _cmd_calibrate_llm(args) -> int:
    """lm-eval samples or a top-k logprob log (``calibration.llm_inputs``)."""
    from .calibration.llm_inputs import config_for_llm_file
    from .calibration.pipeline import DEFAULT_TARGETS
    from .calibration.llm_inputs import read_llm_file
    from .config import config_to_json

    if args.labels or args.seeding != "per-input" or args.key_file:
        raise ValueError("--labels and consistent seeding do not apply to lm-eval samples or logprob logs")
    content = read_llm_file(args.file, max_elements=args.max_elements)
    targets = getattr(args, "targets", None) or list(DEFAULT_TARGETS)
    result = config_for_llm_file(content, args.file, targets, vocab_size=args.vocab_size, side=args.side,
                                 multi_token=args.multi_token, seed=args.seed, confidence=args.confidence,
                                 progress=_progress(not args.quiet))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    text = config_to_json(result.config)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(_target_table(result.config))
        bounds = result.config.get("bounds")
        if bounds:
            widths = ", ".join(f"{w:.4f}" for w in bounds["widths"])
            print(f"certified agreement bounds (k={bounds['k']}, V={bounds['vocab_size']}): "
                  f"width at each target {widths}")
        print(f"config written to {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def _consistent(config, data, args):
    from .calibration.keyed_config import consistent_config
    from .serving.consistent_noise import DEFAULT_LENGTH_SCALE
    from .serving.keys import read_key_file

    if args.seeding != "consistent":
        raise ValueError("--key-file, --length-scale and --noise-id apply to --seeding consistent only")
    if not args.key_file:
        raise ValueError("--seeding consistent needs --key-file KEYFILE (the key the config will serve)")
    if args.side != "point" or args.saturate or args.inversion != "curve":
        raise ValueError("--seeding consistent solves this key's exact curve: --side, --saturate and "
                         "--inversion do not apply")
    length = DEFAULT_LENGTH_SCALE if args.length_scale is None else args.length_scale
    return consistent_config(config, data.logits, data.labels, read_key_file(args.key_file), length_scale=length,
                             seed=args.seed, confidence=args.confidence, noise_id=args.noise_id)


def _target_table(config: dict) -> str:
    a0 = config["clean_accuracy"]
    head = (f"{config['model']}: N={config['n_samples']} K={config['n_classes']} "
            f"S({config['statistic']})={config['scale']:.4g}"
            + (f" A0={a0:.4f}" if a0 is not None else "")
            + f" logistic R2={config['fit']['r2']:.4f}")
    from .calibration.target_intervals import describe_interval

    lines = [head, f"{'target':>22} {'side':>8} {'accuracy':>9} {'guarantee, or delivers on the sample':>36} "
             f"{'v':>10} {'sigma':>10} {'logistic':>10}  method"]
    for t in config["targets"]:
        label = f"{t['kind']} {t['requested']:g}"
        acc = "" if t["accuracy"] is None else f"{t['accuracy']:.4f}"
        slog = "" if t["sigma_logistic"] is None else f"{t['sigma_logistic']:.5g}"
        side = t.get("side", "point")
        # One-sided: the guarantee first (the bound equals the target); the two-sided interval below it.
        # A keyed (consistent) target states the spread of its sigma instead.
        if "sigma_interval" in t:
            first = "sigma in [{:.4g}, {:.4g}]".format(*t["sigma_interval"]["sigma"])
        else:
            first = describe_interval(t) if side == "point" else _guarantee(t)
        lines.append(f"{label:>22} {side:>8} {acc:>9} {first:>36} "
                     f"{t['v']:>10.5g} {t['sigma']:>10.5g} {slog:>10}  {t['method']}")
        if side != "point" and describe_interval(t):
            lines.append(f"{'':>42} two-sided: {describe_interval(t)}")
    lines.append("sigma: the sigma served (sigma* on the point side; one-sided, the sigma whose "
                 "confidence bound equals the target)")
    return "\n".join(lines)


def _guarantee(t: dict) -> str:
    """'retention >= 80.0% (one-sided 95%)' for a one-sided target; '' when saturated (no guarantee)."""
    level = (t.get("interval") or {}).get("level")
    if t.get("saturated") or level is None or t["kind"] not in ("accuracy", "retention", "agreement"):
        return "no guarantee (saturated)" if t.get("saturated") else ""
    sign = ">=" if t["side"] == "at-least" else "<="
    return f"{t['kind']} {sign} {100 * t['requested']:.1f}% (one-sided {level:.0%})"


def _cmd_fleet(args) -> int:
    import numpy as np

    from .calibration.fleet import leave_one_out, margin_ablation, shared_fit
    from .loading import require_labels
    from .calibration.pipeline import calibrate_data

    if len(args.files) < 2:
        raise ValueError(f"fleet needs at least 2 files, got {len(args.files)}")
    cals = []
    for path in args.files:
        data = _load(path, args)
        require_labels(data, "the fleet's accuracy fit")
        cals.append(calibrate_data(data, statistic="median", seed=args.seed))
    fit = shared_fit(cals, statistic=args.margin_stat)
    loo = leave_one_out(cals, statistic=args.margin_stat)
    ablation = margin_ablation(cals)
    print(f"shared logistic ({args.margin_stat}): v50={fit.v50:.4g} p={fit.p:.4g} c={fit.c:.4g} "
          f"R2={fit.r2:.4f} over {len(cals)} models")
    print(f"{'model':>28} {'S':>9} {'in-sample %':>12} {'held-out %':>11}")
    for r in loo:
        print(f"{r['model']:>28} {r['scale']:>9.4g} {r['in_sample_error']:>12.2f} {r['held_out_error']:>11.2f}")
    print(f"{'mean':>28} {'':>9} {np.mean([r['in_sample_error'] for r in loo]):>12.2f} "
          f"{np.mean([r['held_out_error'] for r in loo]):>11.2f}")
    print("margin-statistic ablation (mean |relative error| %, shared fit):")
    for r in ablation:
        print(f"{r['statistic']:>10}  R2={r['r2']:.4f}  in-sample {r['in_sample_error']:.2f}  "
              f"held-out {r['held_out_error']:.2f}")
    if args.out:
        doc = {
            "schema": "caliber.fleet/v1",
            "statistic": args.margin_stat,
            "shared_fit": fit.to_dict(),
            "models": [{"model": c.name, "n_classes": c.n_classes, "clean_accuracy": c.clean_accuracy,
                        "scales": c.scales} for c in cals],
            "leave_one_out": loo,
            "margin_ablation": ablation,
        }
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        print(f"fleet report written to {args.out}")
    return 0


def _cmd_attack(args) -> int:
    from .config import SaturatedTargetWarning, sigma_to_serve
    from .simulation.attack import format_attack_table, simulate_averaging_attack

    data = _load(args.file, args, labels_path=args.labels)
    if args.config:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SaturatedTargetWarning)
            sigma = sigma_to_serve(args.config, target=args.target)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
    else:
        sigma = args.sigma
    table = simulate_averaging_attack(data.logits, data.labels, sigma=sigma, m_values=tuple(args.m),
                                      seed=args.seed)
    print(f"{data.name}: averaging attack at sigma={sigma:.5g} (N={data.n_samples}, K={data.n_classes})")
    print(format_attack_table(table))
    return 0


def main(argv: list[str] | None = None) -> int:
    from .config import ConfigError
    from .loading import LogitsFileError

    args = _build_parser().parse_args(argv)
    from .check_command import run as _cmd_check
    from .extraction.command import run as _cmd_extract
    from .serving.keys import run_keygen
    from .throttle.command import run as _cmd_throttle

    handlers = {"calibrate": _cmd_calibrate, "fleet": _cmd_fleet, "attack": _cmd_attack, "extract": _cmd_extract,
                "check": _cmd_check, "keygen": run_keygen, "throttle": _cmd_throttle}
    try:
        return handlers[args.command](args)
    except (LogitsFileError, ConfigError, ValueError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for the user; the traceback on request
        if os.environ.get("CALIBER_DEBUG"):
            raise
        print(f"error: unexpected {type(exc).__name__}: {_one_line(exc)} "
              "(set CALIBER_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_INTERNAL


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
