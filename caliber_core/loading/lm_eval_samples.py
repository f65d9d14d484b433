"""lm-evaluation-harness ``--log_samples`` files of a multiple-choice task, as labelled logits.

``EvaluationTracker.save_results_samples`` writes ``samples_<task>_<time>.jsonl``:
one object per document with ``doc_id``, ``doc``, ``target``, ``arguments``,
``resps`` and ``filtered_resps``. For a multiple-choice task ``filtered_resps``
holds one ``[loglikelihood, is_greedy]`` pair per choice, every leaf a string
from 0.4.x's ``sanitize_list`` (0.4.0--0.4.2 wrote one JSON array with native
numbers: both are read). ``filtered_resps`` is preferred over ``resps``
(whose pairs sit one level deeper).

For single-token choices (MMLU's " A".." D") the loglikelihoods are the
answer tokens' log-softmax values: their differences are logit differences,
so one document is one row of K logits and the target its label. Choices of
several tokens sum several log-softmax values, which are not logits under the
served noise: they are accepted only with ``multi_token=True`` and a warning.
"""

from __future__ import annotations

import re

import numpy as np

from .json_lines import finite_number, kind_of, records
from .safety import DEFAULT_MAX_ELEMENTS, Unvalidated, clean_name, display_name, fail

#: Most choices one document may have (MMLU 4, HellaSwag 4, the widest common tasks ~100).
MAX_CHOICES = 1024
_SAMPLES_NAME = re.compile(r"^samples_(?P<task>.+?)_(?P<time>\d{4}-\d{2}-\d{2}T[0-9.\-]+)$")
# A scored continuation that is one short word (" A", " yes", " 7") is taken as one token;
# anything with inner whitespace or longer than this is treated as several tokens.
_SHORT_CHOICE = 8


def task_name(filename: str) -> str:
    """The task of ``samples_<task>_<time>.jsonl`` (else the file's stem).

    Parameters
    ----------
    filename : str
        The file's name or path.

    Returns
    -------
    str
        A clean display name; "samples" when nothing is left.
    """
    base = str(filename).replace("\\", "/").rsplit("/", 1)[-1]
    stem = base.rsplit(".", 1)[0] if "." in base[1:] else base
    m = _SAMPLES_NAME.match(stem)
    return clean_name(m.group("task") if m else stem) or "samples"


def _pairs(rec: dict, src: str, line_no: int) -> list:
    """The per-choice [loglikelihood, is_greedy] entries (filtered_resps preferred)."""
    if "filtered_resps" in rec:
        entries = rec["filtered_resps"]
        nested = False
    elif "resps" in rec:
        entries, nested = rec["resps"], True
    else:
        raise fail(src, f"line {line_no}: no filtered_resps or resps")
    if not isinstance(entries, list) or not entries:
        raise fail(src, f"line {line_no}: filtered_resps/resps must be a non-empty list")
    out = []
    for e in entries:
        if nested and isinstance(e, list) and len(e) == 1 and isinstance(e[0], list):
            e = e[0]
        if not (isinstance(e, list) and len(e) == 2 and not isinstance(e[0], (list, dict))):
            raise fail(src, f"line {line_no}: a generation or perplexity task (responses hold "
                       f"{_kind(e)}, not [loglikelihood, is_greedy] per choice); only multiple-choice "
                       "tasks calibrate")
        out.append(e)
    return out


def _kind(e) -> str:
    if isinstance(e, str):
        return "text"
    if isinstance(e, list):
        return f"a list of {len(e)}"
    return type(e).__name__


def _continuations(rec: dict) -> list[str] | None:
    args = rec.get("arguments")
    if isinstance(args, dict):
        args = [list(a.values()) if isinstance(a, dict) else a for a in args.values()]
    if not isinstance(args, list):
        return None
    out = []
    for a in args:
        if not (isinstance(a, list) and len(a) >= 2 and isinstance(a[1], str)):
            return None
        out.append(a[1])
    return out


def _doc_choices(rec: dict) -> list[str] | None:
    doc = rec.get("doc")
    if not isinstance(doc, dict):
        return None
    for key in ("choices", "options", "endings"):
        c = doc.get(key)
        if isinstance(c, dict):
            c = c.get("text")
        if isinstance(c, list) and all(isinstance(x, str) for x in c):
            return c
    return None


def _target(rec: dict, n_choices: int, src: str, line_no: int) -> tuple[int, bool]:
    """(label index, whether it was mapped from text)."""
    t = rec.get("target")
    if isinstance(t, list):
        raise fail(src, f"line {line_no}: several targets ({len(t)}); one gold choice per document is needed")
    if isinstance(t, bool) or t is None:
        raise fail(src, f"line {line_no}: target {t!r} is not a choice index or text")
    if isinstance(t, (int, float)) or (isinstance(t, str) and re.fullmatch(r"\s*-?\d+\s*", t)):
        idx = int(float(t))
        if float(t) != idx or not 0 <= idx < n_choices:
            raise fail(src, f"line {line_no}: target {t!r} is outside the {n_choices} choices")
        return idx, False
    if not isinstance(t, str):
        raise fail(src, f"line {line_no}: target must be an index or text, got {type(t).__name__}")
    for choices in (_doc_choices(rec), _continuations(rec)):
        if choices and len(choices) == n_choices:
            stripped = [c.strip() for c in choices]
            if t.strip() in stripped:
                return stripped.index(t.strip()), True
    raise fail(src, f"line {line_no}: target text is not one of the document's {n_choices} choices")


def read(content: bytes, src: str, *, max_elements: int) -> Unvalidated:
    """The reader of ``.jsonl``/``.json`` files for :func:`caliber_core.loading.load_logits_bytes`.

    lm-eval samples of single-token choices load as labelled logits; a top-k
    logprob log is refused with what to do instead (it needs the vocabulary size).

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name.
    max_elements : int
        The element budget.

    Returns
    -------
    Unvalidated
        Per-choice scores as logits, and the gold choices as labels.

    Raises
    ------
    LogitsFileError
        A logprob log, or samples that do not parse (:func:`parse_samples`).
    """
    if kind_of(content, src) == "logprob-logs":
        raise fail(src, "a top-k logprob log gives agreement only and needs the vocabulary size: "
                   "calibrate it with `calibrate FILE --agreement X --vocab-size V`")
    return parse_samples(content, src, max_elements=max_elements)


def parse_samples(content: bytes, filename: str, *, multi_token: bool = False,
                  max_elements: int = DEFAULT_MAX_ELEMENTS) -> Unvalidated:
    """Read an lm-eval samples file of one multiple-choice task as labelled logits.

    Parameters
    ----------
    content : bytes
    filename : str
        ``samples_<task>_<time>.jsonl``: the task becomes the model name.
    multi_token : bool, default False
        Accept choices that look longer than one token (a warning says what that means).
    max_elements : int, default DEFAULT_MAX_ELEMENTS

    Returns
    -------
    Unvalidated
        One row per document (``doc_id`` order), one column per choice; labels from
        ``target``; the task as the name. The loader validates it as any other file.

    Raises
    ------
    LogitsFileError
        Truncated JSON, a generation task, rows with different numbers of
        choices, a target outside the choices, a NaN loglikelihood, more than
        ``MAX_CHOICES`` choices, or multi-token choices without ``multi_token``;
        each names its line.
    """
    src = display_name(filename)
    rows: list[tuple[int, list[float], int]] = []
    n_choices = None
    first_filter = None
    mapped = skipped_filters = 0
    multi_line = None
    seen_docs: set = set()
    for line_no, rec in records(content, src):
        if not isinstance(rec, dict):
            raise fail(src, f"line {line_no}: a sample must be a JSON object, got {type(rec).__name__}")
        if "doc_id" not in rec:
            raise fail(src, f"line {line_no}: no doc_id (not an lm-eval sample)")
        filt = rec.get("filter")
        if first_filter is None:
            first_filter = filt
        elif filt != first_filter:
            skipped_filters += 1  # another filter's copy of the same documents
            continue
        pairs = _pairs(rec, src, line_no)
        if len(pairs) > MAX_CHOICES:
            raise fail(src, f"line {line_no}: {len(pairs):,} choices, more than the {MAX_CHOICES} "
                       "a multiple-choice row may have")
        if len(pairs) < 2:
            raise fail(src, f"line {line_no}: {len(pairs)} choice; multiple choice needs at least 2")
        if n_choices is None:
            n_choices = len(pairs)
        elif len(pairs) != n_choices:
            raise fail(src, f"line {line_no}: {len(pairs)} choices where earlier documents have "
                       f"{n_choices} (one task, one number of choices)")
        ll = [finite_number(p[0], src, line_no, f"choice {j} loglikelihood") for j, p in enumerate(pairs)]
        if any(x > 1e-6 for x in ll):
            raise fail(src, f"line {line_no}: a loglikelihood above 0 ({max(ll):g})")
        if any(x == -np.inf for x in ll):
            raise fail(src, f"line {line_no}: a loglikelihood is -inf (every choice needs a finite score)")
        label, from_text = _target(rec, n_choices, src, line_no)
        mapped += from_text
        conts = _continuations(rec)
        if multi_line is None and conts and any(
                len(c.strip()) > _SHORT_CHOICE or len(c.strip().split()) > 1 for c in conts):
            multi_line = line_no
        doc_id = rec["doc_id"]
        key = str(doc_id)
        if key in seen_docs:
            raise fail(src, f"line {line_no}: doc_id {clean_name(key)!r} appears twice (one model, one "
                       "filter per file)")
        seen_docs.add(key)
        rows.append((doc_id if isinstance(doc_id, int) else len(rows), ll, label))
        if len(rows) * n_choices > max_elements:
            raise fail(src, f"more than max_elements={max_elements:,} loglikelihoods (line {line_no})")
    if not rows:
        raise fail(src, "no samples in the file")
    warnings = []
    if multi_line is not None:
        if not multi_token:
            raise fail(src, f"line {multi_line}: choices of several tokens (e.g. whole sentences): their "
                       "summed loglikelihoods are not logits under the served noise; pass --multi-token "
                       "to calibrate them anyway")
        warnings.append("multi-token choices: each choice's score sums several tokens' log-softmax, so "
                        "sigma is calibrated on summed scores, not on the logits the noise is added to")
    if mapped:
        warnings.append(f"{mapped} target(s) given as answer text were mapped to their choice's index")
    if skipped_filters:
        warnings.append(f"{skipped_filters} line(s) of other filters than {first_filter!r} skipped")
    rows.sort(key=lambda r: r[0])
    if len(rows) < 200:
        warnings.append(f"N={len(rows)} documents: calibration precision will be poor")
    return Unvalidated(logits=np.array([r[1] for r in rows], dtype=np.float64),
                       labels=np.array([r[2] for r in rows], dtype=np.int64),
                       name=task_name(filename), warnings=tuple(warnings))
