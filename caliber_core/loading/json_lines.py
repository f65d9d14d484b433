"""JSON Lines records for the LLM inputs: one JSON value a line, or one JSON array holding them.

lm-eval writes ``samples_<task>_<time>.jsonl`` one object a line (0.4.0--0.4.2
wrote one JSON array instead); API logs are one response object a line, or one
array of ``logprobs.content`` entries. :func:`records` yields ``(line number,
value)`` either way, and :func:`kind_of` tells the two inputs apart from the
first record. Every parse error is one :class:`LogitsFileError` naming the line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

from .safety import fail

JSON_EXTENSIONS = (".jsonl", ".json")
KINDS = ("lm-eval-samples", "logprob-logs")


def _parse(text: str, src: str, line_no: int):
    try:
        return json.loads(text)  # NaN/Infinity literals parse as floats; the readers refuse NaN
    except json.JSONDecodeError as err:
        where = line_no + err.lineno - 1
        raise fail(src, f"line {where}: not valid JSON ({err.msg}; truncated?)") from None
    except RecursionError:
        raise fail(src, f"line {line_no}: JSON nested too deeply") from None
    except ValueError:  # an integer of more digits than int() converts (sys.int_info.default_max_str_digits)
        raise fail(src, f"line {line_no}: not valid JSON (a number too long to read)") from None


def records(content: bytes, src: str) -> Iterator[tuple[int, object]]:
    """Each record of the file with its 1-based line number.

    A file whose first non-blank character is ``[`` is one JSON array, and its
    elements are the records (line numbers: where each element starts is not
    kept by ``json``, so the array's first line is given for all of them); any
    other file holds one JSON value a non-blank line.

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name.

    Yields
    ------
    line_no : int
    record : object
        The parsed JSON value.

    Raises
    ------
    LogitsFileError
        Text that is not UTF-8, no records, or a line (or the array) that is not valid JSON.
    """
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise fail(src, f"not UTF-8 text (byte {err.start})") from None
    stripped = text.lstrip()
    if not stripped:
        raise fail(src, "the file holds no JSON records")
    if stripped.startswith("["):
        first = text[: len(text) - len(stripped)].count("\n") + 1
        value = _parse(text, src, 1)
        for item in value:
            yield first, item
        return
    for i, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield i, _parse(line, src, i)


def finite_number(value, src: str, line_no: int, what: str) -> float:
    """A float from a JSON number or a numeric string (lm-eval writes strings); NaN refused.

    Parameters
    ----------
    value : int, float or str
        The field's value.
    src : str
        The file's display name.
    line_no : int
        The record's line, for the message.
    what : str
        The field, for the message.

    Returns
    -------
    float
        Possibly infinite (a log-probability may be -inf).

    Raises
    ------
    LogitsFileError
        Not a number or numeric string (bools refused), or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise fail(src, f"line {line_no}: {what} must be a number, got {type(value).__name__}")
    try:
        x = float(value)
    except ValueError:
        raise fail(src, f"line {line_no}: {what} is not a number (a {type(value).__name__})") from None
    if math.isnan(x):
        raise fail(src, f"line {line_no}: {what} is NaN")
    return x


def kind_of(content: bytes, src: str) -> str:
    """"lm-eval-samples" or "logprob-logs", from the first record's fields.

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name.

    Returns
    -------
    {"lm-eval-samples", "logprob-logs"}

    Raises
    ------
    LogitsFileError
        No records, or a first record that is neither an lm-eval sample nor a logprobs response.
    """
    for line_no, rec in records(content, src):
        if isinstance(rec, dict) and ("resps" in rec or "filtered_resps" in rec) and "doc_id" in rec:
            return "lm-eval-samples"
        if isinstance(rec, dict) and any(k in rec for k in ("choices", "logprobs", "content",
                                                             "top_logprobs", "response")):
            return "logprob-logs"
        raise fail(src, f"line {line_no}: neither an lm-eval sample (doc_id, resps) nor a "
                   "response with logprobs (choices[].logprobs)")
    raise fail(src, "the file holds no JSON records")
