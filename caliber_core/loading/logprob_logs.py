"""Top-k logprob logs of an OpenAI-compatible API: one row per generated position.

Shapes read, one per line (or one JSON array of ``logprobs.content`` entries):

* chat completions: ``choices[i].logprobs.content[j].top_logprobs`` =
  ``[{"token", "logprob", "bytes"}, ...]``;
* legacy completions: ``choices[i].logprobs.top_logprobs[j]`` = ``{token: logprob}``;
* a bare ``logprobs`` object (``{"content": [...]}``), a bare list of content
  entries, and a batch-output line (``{"response": {"body": {...}}}``).

Each position keeps its shown logprobs only. The sampled token's own
``logprob`` is not added when it falls outside the top k: treating it as
unseen keeps every bound valid (it is one of the classes at or below the k-th).
The vocabulary size V is the caller's: a line naming another model than the
first (another vocabulary) is refused.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from .json_lines import finite_number, records
from .safety import clean_name, display_name, fail

#: Most logprobs one position may show (OpenAI's API caps top_logprobs at 20; vLLM's
#: default --max-logprobs is 20): a longer list is not a top-k log.
MAX_SHOWN = 1024
MAX_POSITIONS = 2_000_000


@dataclass(frozen=True, eq=False)
class LogprobLog:
    """The shown logprobs of every generated position of one log file.

    Attributes
    ----------
    logprobs : ndarray of shape (n_positions, k), float64
        Each position's shown logprobs, descending; -inf pads a position that shows fewer.
    name : str
        The ``model`` the responses name, else the file stem.
    sha256, source : str
    n_responses : int
    warnings : tuple of str
    """

    logprobs: np.ndarray
    name: str
    sha256: str
    source: str
    n_responses: int
    warnings: tuple[str, ...] = ()

    @property
    def n_positions(self) -> int:
        """The number of generated positions read."""
        return int(self.logprobs.shape[0])

    @property
    def k(self) -> int:
        """k, the number of top logprobs kept per position."""
        return int(self.logprobs.shape[1])


def _entries(rec, src: str, line_no: int) -> list[list[float]]:
    """The shown logprobs of every position of one record."""
    if isinstance(rec, dict) and isinstance(rec.get("response"), dict):
        rec = rec["response"].get("body", rec["response"])
    if isinstance(rec, list):
        return [_chat_position(e, src, line_no, j) for j, e in enumerate(rec)]
    if not isinstance(rec, dict):
        raise fail(src, f"line {line_no}: a response must be a JSON object, got {type(rec).__name__}")
    if "top_logprobs" in rec and "choices" not in rec and "content" not in rec:
        if isinstance(rec.get("top_logprobs"), list) and "token" in rec:  # one content entry
            return [_chat_position(rec, src, line_no, 0)]
        return _legacy(rec, src, line_no)
    if "content" in rec and "choices" not in rec:
        return _content(rec["content"], src, line_no)
    choices = rec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise fail(src, f"line {line_no}: no choices[] with logprobs in the response")
    out = []
    for i, choice in enumerate(choices):
        lp = choice.get("logprobs") if isinstance(choice, dict) else None
        if not isinstance(lp, dict):
            raise fail(src, f"line {line_no}: choices[{i}] has no logprobs (request logprobs=true "
                       "and top_logprobs=k)")
        out.extend(_content(lp["content"], src, line_no) if "content" in lp else _legacy(lp, src, line_no))
    return out


def _content(content, src: str, line_no: int) -> list[list[float]]:
    if not isinstance(content, list):
        raise fail(src, f"line {line_no}: logprobs.content must be a list, got {type(content).__name__}")
    return [_chat_position(e, src, line_no, j) for j, e in enumerate(content)]


def _chat_position(entry, src: str, line_no: int, j: int) -> list[float]:
    top = entry.get("top_logprobs") if isinstance(entry, dict) else None
    if not isinstance(top, list) or not top:
        raise fail(src, f"line {line_no}: position {j} has no top_logprobs (request top_logprobs=k)")
    _check_count(len(top), src, line_no, j)
    out = []
    for t in top:
        if not isinstance(t, dict) or "logprob" not in t:
            raise fail(src, f"line {line_no}: position {j}: a top_logprobs entry has no logprob")
        out.append(_logprob(t["logprob"], src, line_no, j))
    return out


def _legacy(lp: dict, src: str, line_no: int) -> list[list[float]]:
    tops = lp.get("top_logprobs")
    if not isinstance(tops, list) or not tops:
        raise fail(src, f"line {line_no}: logprobs.top_logprobs is missing or empty (request logprobs=k)")
    out = []
    for j, top in enumerate(tops):
        if not isinstance(top, dict) or not top:
            raise fail(src, f"line {line_no}: position {j} has no top_logprobs (request logprobs=k)")
        _check_count(len(top), src, line_no, j)
        out.append([_logprob(v, src, line_no, j) for v in top.values()])
    return out


def _check_count(count: int, src: str, line_no: int, j: int) -> None:
    if count > MAX_SHOWN:
        raise fail(src, f"line {line_no}: position {j} shows {count:,} logprobs, more than the "
                   f"{MAX_SHOWN} a top-k log holds")


def _logprob(value, src: str, line_no: int, j: int) -> float:
    x = finite_number(value, src, line_no, f"position {j}: logprob")
    if x > 1e-6 or x == math.inf:
        raise fail(src, f"line {line_no}: position {j}: logprob {x:g} is above 0")
    return x


def read_logprob_log(content: bytes, filename: str, *, max_positions: int = MAX_POSITIONS) -> LogprobLog:
    """Read an API log's positions.

    Parameters
    ----------
    content : bytes
    filename : str
        For messages and the default name.
    max_positions : int, default MAX_POSITIONS

    Returns
    -------
    LogprobLog

    Raises
    ------
    LogitsFileError
        Truncated JSON, a position without top_logprobs, a NaN or positive
        logprob, a position showing more than ``MAX_SHOWN``, a line naming
        another model than the first, or a shown mass above 1; each names its line.
    """
    src = display_name(filename)
    rows: list[list[float]] = []
    model = None
    n_responses = 0
    for line_no, rec in records(content, src):
        body = rec.get("response", {}).get("body", rec) if isinstance(rec, dict) and isinstance(
            rec.get("response"), dict) else rec
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            if model is None:
                model = body["model"]
            elif body["model"] != model:
                raise fail(src, f"line {line_no}: model {clean_name(body['model'])!r} differs from "
                           f"{clean_name(model)!r} on an earlier line (one model, one vocabulary, per file)")
        positions = _entries(rec, src, line_no)
        for j, p in enumerate(positions):
            if sum(math.exp(x) for x in p) > 1.0 + 1e-3:
                raise fail(src, f"line {line_no}: position {j}'s shown probabilities sum above 1")
            if sum(1 for x in p if x > -math.inf) < 2:
                raise fail(src, f"line {line_no}: position {j} shows fewer than 2 finite logprobs")
        rows.extend(positions)
        n_responses += 1
        if len(rows) > max_positions:
            raise fail(src, f"more than {max_positions:,} positions (line {line_no})")
    if not rows:
        raise fail(src, "no generated positions in the file")
    k = max(len(r) for r in rows)
    lp = np.full((len(rows), k), -np.inf)
    for i, r in enumerate(rows):
        lp[i, : len(r)] = sorted(r, reverse=True)
    stem = clean_name(str(filename).replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]) or "logs"
    return LogprobLog(logprobs=lp, name=clean_name(model) if model else stem,
                      sha256=hashlib.sha256(content).hexdigest(), source=str(filename),
                      n_responses=n_responses)
