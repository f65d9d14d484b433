"""What an LLM provider already has, to a config: lm-eval samples and top-k logprob logs.

Both are JSON Lines (``.jsonl``/``.json``), told apart by their first record
(:func:`caliber_core.loading.json_lines.kind_of`):

* **lm-eval samples** become an ordinary labelled logits file (one row per
  document, one column per choice) and go through :func:`.pipeline.config_for`;
* **top-k logprob logs** give agreement only, at a sigma certified by
  :mod:`.topk_bounds` (:func:`.topk_config.config_for_logs`).

The command line and the dashboard's Data page both call :func:`config_for_llm_file`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pathlib import Path

from ..loading import LogitsData
from ..loading.json_lines import JSON_EXTENSIONS, kind_of
from ..loading.safety import DEFAULT_MAX_ELEMENTS, describe_exception, display_name, fail, max_file_bytes


@dataclass(frozen=True)
class LLMResult:
    """A calibrated LLM input: which kind it was, its targets and config, and the loader's warnings.

    Attributes
    ----------
    kind : str
        The file's kind, as :func:`caliber_core.loading.json_lines.kind_of` names it.
    records : list of TargetRecord
        One per target.
    config : dict
        The config to save.
    warnings : tuple of str
        What the reader noticed and accepted.
    """

    kind: str
    records: list
    config: dict
    warnings: tuple[str, ...]


def read_llm_file(path, *, max_elements: int | None = None) -> bytes:
    """The bytes of a ``.jsonl``/``.json`` file, after its size is checked against the element budget.

    Parameters
    ----------
    path : str or path-like
    max_elements : int, optional
        The element budget the size limit derives from; default ``DEFAULT_MAX_ELEMENTS``.

    Returns
    -------
    bytes

    Raises
    ------
    LogitsFileError
        Another extension, a missing or unreadable file, or one larger than
        :func:`caliber_core.loading.safety.max_file_bytes` allows.
    """
    src = display_name(path)
    p = Path(path)
    if p.suffix.lower() not in JSON_EXTENSIONS:
        raise fail(src, f"not a JSON Lines file ({p.suffix or 'no extension'}); expected .jsonl or .json")
    limit = max_file_bytes(DEFAULT_MAX_ELEMENTS if max_elements is None else max_elements)
    try:
        if not p.is_file():
            raise fail(src, "no such file" if not p.exists() else "not a regular file")
        size = p.stat().st_size
        if size > limit:
            raise fail(src, f"the file is {size:,} bytes, more than the {limit:,} allowed")
        return p.read_bytes()
    except OSError as err:
        raise fail(src, f"cannot read the file ({describe_exception(err)})") from None


def config_for_llm_file(
    content: bytes,
    filename: str,
    targets: Sequence[tuple[str, float]],
    *,
    vocab_size: int | None = None,
    side: str = "point",
    multi_token: bool = False,
    seed: int = 0,
    confidence: float = 0.95,
    progress: Callable[[float], None] | None = None,
) -> LLMResult:
    """Calibrate an lm-eval samples file or a top-k logprob log.

    Parameters
    ----------
    content : bytes
    filename : str
    targets : sequence of (kind, value)
    vocab_size : int, optional
        V; required for a logprob log, refused for lm-eval samples.
    side : {"point", "at-least", "at-most"}, default "point"
    multi_token : bool, default False
        Accept lm-eval choices longer than one token (with a warning).
    seed, confidence
        As :func:`.pipeline.config_for` (lm-eval samples).
    progress : callable, optional

    Raises
    ------
    LogitsFileError
        A file neither reader accepts, or a bad line (named).
    ValueError
        Options that do not fit the file (no --vocab-size for a log, a
        retention target for a log, ...).
    """
    src = display_name(filename)
    kind = kind_of(content, src)
    if kind == "logprob-logs":
        from ..loading.logprob_logs import read_logprob_log
        from .topk_bounds import TopKRows
        from .topk_config import config_for_logs

        if vocab_size is None:
            raise ValueError(f"{src} is a top-k logprob log: give the model's vocabulary size "
                             "(--vocab-size V); the unseen tail's bound needs it")
        log = read_logprob_log(content, filename)
        try:
            rows = TopKRows.from_logprobs(log.logprobs, vocab_size=vocab_size)
        except ValueError as err:
            raise fail(src, str(err)) from None
        records, config = config_for_logs(rows, targets, name=log.name, side=side, sha256=log.sha256,
                                          source=str(filename), progress=progress)
        return LLMResult(kind, records, config, log.warnings)
    from .pipeline import config_for

    if vocab_size is not None:
        raise ValueError(f"{src} holds lm-eval samples: --vocab-size applies to logprob logs only")
    data = samples_data(content, filename, multi_token=multi_token)
    _, records, config = config_for(data, targets, seed=seed, side=side, confidence=confidence,
                                    progress=progress)
    return LLMResult(kind, records, config, data.warnings)


def samples_data(content: bytes, filename: str, *, multi_token: bool = False) -> LogitsData:
    """An lm-eval samples file as validated :class:`LogitsData` (the loader's checks, ``multi_token`` allowed).

    Parameters
    ----------
    content : bytes
        The file's bytes.
    filename : str
        Its name, for messages and the ``source`` field.
    multi_token : bool, default False
        Accept choices longer than one token (with a warning).

    Returns
    -------
    LogitsData
        With its digest and margins.

    Raises
    ------
    LogitsFileError
        See :func:`caliber_core.loading.lm_eval_samples.parse_samples`, and the loader's checks.
    """
    import hashlib

    from ..loading.checks import check_margin_scale, validate_labels, validate_logits
    from ..loading.lm_eval_samples import parse_samples

    src = display_name(filename)
    raw = parse_samples(content, filename, multi_token=multi_token, max_elements=DEFAULT_MAX_ELEMENTS)
    logits = validate_logits(raw.logits, src, max_elements=DEFAULT_MAX_ELEMENTS)
    labels = validate_labels(raw.labels, src, n_samples=logits.shape[0], n_classes=logits.shape[1],
                             logits_src=src)
    margins = check_margin_scale(logits, src)
    margins.flags.writeable = False
    return LogitsData(name=raw.name, logits=logits, labels=labels, sha256=hashlib.sha256(content).hexdigest(),
                      source=str(filename), labels_source=str(filename), warnings=raw.warnings, margins=margins)
