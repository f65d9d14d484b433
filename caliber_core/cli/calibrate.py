"""``caliber calibrate FILE``: sweep, fit and solve each target; write the config JSON."""

from __future__ import annotations

import argparse
import sys

from ..target_record import CALIBRATED_KINDS, SIDES
from .arguments import add_confidence, add_max_elements, fraction, load, progress

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


def _add_seeding(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeding", choices=("per-input", "consistent"), default="per-input",
                        help="per-input: noise drawn per request id (default); consistent: a keyed smooth "
                        "function of the logits, calibrated for the key in --key-file")
    parser.add_argument("--key-file", help="the serving key (hex, one line); consistent seeding only")
    parser.add_argument("--length-scale", type=float, default=None, metavar="L",
                        help="consistent noise's correlation length in units of S (default 4)")
    parser.add_argument("--noise-id", default=None, metavar="HEX",
                        help="consistent seeding: reuse this noise identity (default: a new random one)")


def add_parser(sub) -> argparse.ArgumentParser:
    """Register ``calibrate`` and its options on an argparse subparsers object.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        What ``ArgumentParser.add_subparsers()`` returned.

    Returns
    -------
    argparse.ArgumentParser
        The ``calibrate`` parser.
    """
    cal = sub.add_parser("calibrate", help="calibrate one model file and write its config JSON")
    cal.add_argument("file", help="logits file (.npz, .npy, .pt, .safetensors, .csv, .parquet), an lm-eval "
                     "samples file or a top-k logprob log (.jsonl/.json)")
    cal.add_argument("--labels", help="labels file for .npy logits")
    for kind in CALIBRATED_KINDS:
        flag, what = _TARGET_FLAGS[kind]
        cal.add_argument(flag, nargs="+", type=fraction, action=_OrderedTarget, const=kind,
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
    add_confidence(cal, "level of every target's interval and of the side's bound")
    cal.add_argument("--saturate", action="store_true",
                     help="an unreachable target serves the largest sigma the sweep measured "
                     "(marked saturated, with a warning) instead of failing")
    cal.add_argument("--out", help="write the config JSON here (default: print it)")
    cal.add_argument("--quiet", action="store_true",
                     help="no progress bar on stderr; the table, the advice line and warnings still print")
    _add_seeding(cal)
    add_max_elements(cal)
    cal.add_argument("--vocab-size", type=int, default=None, metavar="V",
                     help="top-k logprob logs: the model's vocabulary size (the unseen tail has V - k classes)")
    cal.add_argument("--multi-token", action="store_true",
                     help="lm-eval samples: accept choices of several tokens (their summed scores are not "
                     "logits under the served noise; a warning says so)")
    return cal


def run(args) -> int:
    """Run ``calibrate``: sweep the file, solve each target for sigma, write or print the config.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``calibrate`` options.

    Returns
    -------
    int
        0; warnings (saturated targets, wide intervals) go to stderr.

    Raises
    ------
    caliber_core.loading.LogitsFileError
        A logits, labels or log file the loader refuses.
    ValueError
        Missing labels for an accuracy or retention target, an unreachable
        target without ``--saturate``, or a bad seeding option (errors
        propagate to the CLI's handler: one line, exit 2).
    OSError
        ``--out`` cannot be written.

    Notes
    -----
    Eq. util-norm, Eq. logistic-decay and Eq. inverse-v (``--inversion logistic``).
    """
    if str(args.file).lower().endswith((".jsonl", ".json")):
        return _run_llm(args)
    from ..loading.early_digest import begin_digest

    early = begin_digest(args.file)  # a large dump's SHA-256 starts now, beside the imports and the header
    try:
        if is_full_vocabulary(args.file):
            return _run_full_vocab(args, early)
    finally:
        if early is not None:
            early.close()  # not a dump, or it failed: nothing left running (a no-op once taken over)
    from ..calibration.pipeline import DEFAULT_TARGETS, calibrate_data, config_from_calibration
    from ..config import saturation_message
    from ..loading import require_labels

    data = load(args.file, args, labels_path=args.labels)
    for warning in data.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    targets = getattr(args, "targets", None) or list(DEFAULT_TARGETS)
    if any(kind != "agreement" for kind, _ in targets):  # before the sweep, not after it
        asked = getattr(args, "targets", None)
        defaults = ", ".join(f"{v:g}" for _, v in DEFAULT_TARGETS)
        require_labels(data, "an accuracy or retention target" if asked else
                       f"each default target (retention {defaults})",
                       instead="ask for agreement targets, which need none: --agreement 0.9 0.8")
    cal = calibrate_data(data, statistic=args.margin_stat, seed=args.seed, realizations=args.realizations,
                         progress=progress(not args.quiet, "sweeping noise"))
    results, config = config_from_calibration(cal, data, targets, inversion=args.inversion,
                                              saturate=args.saturate, side=args.side, confidence=args.confidence)
    if args.seeding == "consistent" or args.key_file or args.length_scale is not None or args.noise_id:
        config = _consistent(config, data, args)
    for result in results:
        if result.saturated:
            print(f"warning: {saturation_message(result)}", file=sys.stderr)
    return _write(config, args.out)


def _write(config: dict, out: str | None) -> int:
    """Every input's ending: the wide-interval warning, then the config written (with its table and
    advice line) or printed. The advice and the warning come from one rule,
    :func:`caliber_core.calibration.target_intervals.interval_notes`."""
    from ..calibration.target_intervals import interval_notes
    from ..config import config_to_json

    text = config_to_json(config)
    advice, wide = interval_notes(config)
    if wide:
        print(f"warning: {wide}", file=sys.stderr)
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(_target_table(config))
        if advice:
            print(advice)
        print(f"config written to {out}")
    else:
        sys.stdout.write(text)
    return 0


def _run_llm(args) -> int:
    """lm-eval samples or a top-k logprob log (``calibration.llm_inputs``)."""
    from ..calibration.llm_inputs import config_for_llm_file
    from ..calibration.pipeline import DEFAULT_TARGETS
    from ..calibration.llm_inputs import read_llm_file

    if args.labels or args.seeding != "per-input" or args.key_file:
        raise ValueError("--labels and consistent seeding do not apply to lm-eval samples or logprob logs")
    content = read_llm_file(args.file, max_elements=args.max_elements)
    targets = getattr(args, "targets", None) or list(DEFAULT_TARGETS)
    result = config_for_llm_file(content, args.file, targets, vocab_size=args.vocab_size, side=args.side,
                                 multi_token=args.multi_token, seed=args.seed, confidence=args.confidence,
                                 progress=progress(not args.quiet, "sweeping noise"))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return _write(result.config, args.out)


def is_full_vocabulary(path) -> bool:
    """A .npy/.safetensors/.pt/.npz matrix of at least STREAM_MIN_CLASSES classes: streamed, never loaded."""
    from ..calibration.full_vocab import STREAM_MIN_CLASSES
    from ..loading.early_digest import STREAM_EXTENSIONS
    from ..loading.row_stream import declared_shape

    if not str(path).lower().endswith(STREAM_EXTENSIONS):
        return False
    shape = declared_shape(path)
    return shape is not None and shape[1] >= STREAM_MIN_CLASSES


def _run_full_vocab(args, early_digest=None) -> int:
    """A full-vocabulary dump, streamed (``calibration.full_vocab``)."""
    import importlib
    import threading

    from ..calibration.full_vocab import config_for_vocab_file
    from ..calibration.heap_reuse import keep_freed_heap
    from ..loading import DEFAULT_MAX_ELEMENTS

    if args.seeding != "per-input" or args.key_file:
        raise ValueError("a full-vocabulary dump is calibrated per-input: consistent seeding does not apply")
    targets = getattr(args, "targets", None)
    if not targets:  # the sweep's module only for its defaults: it takes 0.1-0.2 s to import
        from ..calibration.pipeline import DEFAULT_TARGETS

        targets = list(DEFAULT_TARGETS)
    keep_freed_heap()  # this process exits when done: the solve's arrays reuse freed pages instead of faulting
    # What writing the config needs (the interval notes: 0.1-0.3 s of imports) loads while the file streams.
    threading.Thread(target=importlib.import_module, args=("caliber_core.calibration.target_intervals",),
                     daemon=True).start()
    _, config = config_for_vocab_file(
        args.file, targets, side=args.side, progress=progress(not args.quiet, "streaming rows"),
        max_elements=DEFAULT_MAX_ELEMENTS if args.max_elements is None else args.max_elements,
        labels_path=args.labels, early_digest=early_digest)
    status = _write(config, args.out)
    if args.out:
        widths = ", ".join(f"{w:.2g}" for w in config["bounds"]["widths"])
        what = "agreement" if config["clean_accuracy"] is None else "certified"
        print(f"full vocabulary streamed (V={config['n_classes']}, top {config['bounds']['k']} gaps exact, "
              f"the rest binned): {what} bound width at each target {widths}")
    return status


def _consistent(config, data, args):
    from ..calibration.keyed_config import consistent_config
    from ..serving.consistent_noise import DEFAULT_LENGTH_SCALE
    from ..serving.keys import read_key_file

    if args.seeding != "consistent":
        raise ValueError("--key-file, --length-scale and --noise-id apply to --seeding consistent only")
    if not args.key_file:
        raise ValueError("--seeding consistent needs --key-file KEYFILE (the key the config will serve)")
    if args.side != "point" or args.saturate or args.inversion != "curve":
        raise ValueError("--seeding consistent solves this key's exact curve: --side, --saturate and "
                         "--inversion do not apply")
    length = DEFAULT_LENGTH_SCALE if args.length_scale is None else args.length_scale
    return consistent_config(config, data.logits, data.labels, read_key_file(args.key_file), design="field",
                             length_scale=length, seed=args.seed, confidence=args.confidence,
                             noise_id=args.noise_id)


def _target_table(config: dict) -> str:
    a0 = config["clean_accuracy"]
    head = (f"{config['model']}: N={config['n_samples']} K={config['n_classes']} "
            f"S({config['statistic']})={config['scale']:.4g}"
            + (f" A0={a0:.4f}" if a0 is not None else "")
            + f" logistic R2={config['fit']['r2']:.4f}")
    from ..calibration.target_intervals import describe_interval, is_certified

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
            what = "bounds" if is_certified(t.get("interval") or {}) else "two-sided"
            lines.append(f"{'':>42} {what}: {describe_interval(t)}")
    lines.append("sigma: the sigma served (sigma* on the point side; one-sided, the sigma whose "
                 "confidence bound equals the target)")
    return "\n".join(lines)


def _guarantee(t: dict) -> str:
    """'retention >= 80.0% (one-sided 95%)' for a one-sided target; '' when saturated (no guarantee)."""
    level = (t.get("interval") or {}).get("level")
    if t.get("saturated") or level is None or t["kind"] not in ("accuracy", "retention", "agreement"):
        return "no guarantee (saturated)" if t.get("saturated") else ""
    sign = ">=" if t["side"] == "at-least" else "<="
    if "certified" in str((t.get("interval") or {}).get("method", "")) or "streamed" in str(t.get("method", "")):
        return f"{t['kind']} {sign} {100 * t['requested']:.1f}% (certified bound)"
    return f"{t['kind']} {sign} {100 * t['requested']:.1f}% (one-sided {level:.0%})"
