"""The extraction archive: the thief's query pool and an evaluation split, with inputs.

An ``.npz`` in the layout of the bundled demo files:

=====================  ===========================================================
``inputs``             (N, D) features or flattened pixels of the query pool
``logits``             (N, K) the teacher's cached logits on the pool
``labels``             (N,) true pool labels: the *provider's* calibration only,
                       never shown to the attacker
``heldout_inputs``     (M, D) evaluation split (rows neither trained on nor queried)
``heldout_logits``     (M, K)
``heldout_labels``     (M,)
=====================  ===========================================================

The evaluation split may come from a second file instead (``eval_path``),
holding either the ``heldout_*`` arrays or plain ``inputs``/``logits``/``labels``.
A file without what extraction needs is refused with one line naming the
missing arrays. Members are read through the loader's npz reader, so the same
safety rules hold (no pickles; sizes checked before anything is inflated).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np

from ..loading import DEFAULT_MAX_ELEMENTS, LogitsFileError, load_logits_bytes
from ..loading import checks, npz, safety

POOL_ARRAYS = ("inputs", "logits", "labels")
EVAL_ARRAYS = ("heldout_inputs", "heldout_logits", "heldout_labels")


@dataclass(frozen=True, eq=False)
class Split:
    """Inputs, cached teacher logits and labels of one split.

    Attributes
    ----------
    inputs : ndarray of shape (n_samples, n_features), float32
    logits : ndarray of shape (n_samples, n_classes), float64
    labels : ndarray of shape (n_samples,), int64
    """

    inputs: np.ndarray
    logits: np.ndarray
    labels: np.ndarray

    @property
    def n_samples(self) -> int:
        """N, the split's rows."""
        return int(self.logits.shape[0])


@dataclass(frozen=True, eq=False)
class ExtractionArchive:
    """A validated pool and evaluation split.

    Attributes
    ----------
    name : str
    source : str
    sha256 : str
        Of the pool file's bytes (and of the evaluation file's, when separate).
    pool, evaluation : Split
    eval_source : str
        Where the evaluation split came from.
    """

    name: str
    source: str
    sha256: str
    pool: Split
    evaluation: Split
    eval_source: str

    @property
    def n_classes(self) -> int:
        """K, the number of classes."""
        return int(self.pool.logits.shape[1])

    @property
    def n_features(self) -> int:
        """D, the number of input features."""
        return int(self.pool.inputs.shape[1])


def _read_file(path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise LogitsFileError(f"{safety.display_name(os.fspath(path))}: cannot read the file "
                              f"({exc.strerror or type(exc).__name__})") from None


def load_archive(path, *, eval_path=None, max_elements: int = DEFAULT_MAX_ELEMENTS) -> ExtractionArchive:
    """Read an extraction archive (and optionally a separate evaluation file).

    Parameters
    ----------
    path : str or os.PathLike
        ``.npz`` with the pool arrays (and the ``heldout_*`` arrays unless
        ``eval_path`` is given).
    eval_path : str or os.PathLike, optional
    max_elements : int
        Largest array accepted (elements), as for the logits loader.

    Raises
    ------
    LogitsFileError
        One line: an unreadable file, missing arrays (named), or invalid contents.
    """
    eval_content = None if eval_path is None else _read_file(eval_path)
    return load_archive_bytes(
        _read_file(path), os.fspath(path), eval_content=eval_content,
        eval_filename=None if eval_path is None else os.fspath(eval_path), max_elements=max_elements,
    )


def load_archive_bytes(
    content: bytes,
    filename: str,
    *,
    eval_content: bytes | None = None,
    eval_filename: str | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> ExtractionArchive:
    """As :func:`load_archive`, from in-memory bytes (an upload).

    Parameters
    ----------
    content : bytes
        The ``.npz`` archive.
    filename : str
        Its name (must end in ``.npz``), for messages.
    eval_content : bytes, optional
        A separate evaluation ``.npz``; given with ``eval_filename``.
    eval_filename : str, optional
        Its name.
    max_elements : int, default ``DEFAULT_MAX_ELEMENTS``
        The element budget of each array.

    Returns
    -------
    ExtractionArchive

    Raises
    ------
    TypeError
        Only one of ``eval_content`` and ``eval_filename`` given.
    LogitsFileError
        Not an ``.npz``, a missing array, or an array the loader refuses.
    """
    if (eval_content is None) != (eval_filename is None):
        raise TypeError("eval_content and eval_filename must be given together")
    src = safety.display_name(filename)
    if not str(filename).lower().endswith(".npz"):
        raise LogitsFileError(f"{src}: extraction needs an .npz archive with {', '.join(POOL_ARRAYS)} "
                              f"and {', '.join(EVAL_ARRAYS)}, got a {os.path.splitext(str(filename))[1] or 'file without extension'}")
    members = _members(content, src)
    need = list(POOL_ARRAYS) + ([] if eval_content is not None else list(EVAL_ARRAYS))
    missing = [k for k in need if k not in members]
    if missing:
        where = " (or give --eval FILE)" if set(missing) <= set(EVAL_ARRAYS) else ""
        raise LogitsFileError(
            f"{src}: cannot simulate extraction without {', '.join(missing)}{where}; "
            f"an extraction archive holds {', '.join(POOL_ARRAYS)} for the query pool and "
            f"{', '.join(EVAL_ARRAYS)} for evaluation (found: {safety.list_keys(members)})"
        )
    data = load_logits_bytes(content, filename, max_elements=max_elements)
    if data.labels is None:  # pragma: no cover - "labels" was checked above
        raise LogitsFileError(f"{src}: the pool needs labels")
    pool_inputs = _inputs(content, src, "inputs", data.n_samples, max_elements)
    pool = Split(pool_inputs, data.logits, data.labels)
    digest = hashlib.sha256(content)
    if eval_content is None:
        evaluation = _eval_split(content, src, EVAL_ARRAYS, max_elements)
        eval_src = src
    else:
        eval_src = safety.display_name(eval_filename)
        eval_members = _members(eval_content, eval_src)
        names = EVAL_ARRAYS if all(k in eval_members for k in EVAL_ARRAYS) else POOL_ARRAYS
        absent = [k for k in names if k not in eval_members]
        if absent:
            raise LogitsFileError(
                f"{eval_src}: an evaluation file needs {', '.join(EVAL_ARRAYS)} (or "
                f"{', '.join(POOL_ARRAYS)}); missing: {', '.join(absent)} (found: {safety.list_keys(eval_members)})"
            )
        evaluation = _eval_split(eval_content, eval_src, names, max_elements)
        digest.update(hashlib.sha256(eval_content).digest())
    if evaluation.inputs.shape[1] != pool.inputs.shape[1]:
        raise LogitsFileError(f"{eval_src}: evaluation inputs have {evaluation.inputs.shape[1]} features "
                              f"but the pool's have {pool.inputs.shape[1]}")
    if evaluation.logits.shape[1] != pool.logits.shape[1]:
        raise LogitsFileError(f"{eval_src}: evaluation logits have {evaluation.logits.shape[1]} classes "
                              f"but the pool's have {pool.logits.shape[1]}")
    return ExtractionArchive(
        name=data.name, source=str(filename), sha256=digest.hexdigest(), pool=pool,
        evaluation=evaluation, eval_source=str(filename if eval_filename is None else eval_filename),
    )


def _members(content: bytes, src: str) -> dict:
    if not content:
        raise LogitsFileError(f"{src}: the file is empty (0 bytes)")
    zf = safety.open_zip(content, src, "npz")
    return {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}


def _read(content: bytes, src: str, key: str, max_elements: int) -> np.ndarray:
    zf = safety.open_zip(content, src, "npz")
    info = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}[key]
    safety.check_unpacked_size(src, info.file_size, max_elements, f"the {key} array")
    return npz.read_member(zf, info, src=src, field=key, max_elements=max_elements)


def _inputs(content: bytes, src: str, key: str, n_rows: int, max_elements: int) -> np.ndarray:
    raw = _read(content, src, key, max_elements)
    if raw.dtype.kind not in "fiu":
        raise LogitsFileError(f"{src}: {key} must hold real numbers, got dtype {raw.dtype}")
    if raw.ndim < 2:
        raise LogitsFileError(f"{src}: {key} must be (n_samples, n_features), got shape {raw.shape}")
    x = np.asarray(raw.reshape(raw.shape[0], -1), dtype=np.float32)  # images flatten to rows
    if x.shape[0] != n_rows:
        raise LogitsFileError(f"{src}: {key} has {x.shape[0]} rows but its logits have {n_rows}")
    finite = np.isfinite(x)
    if not finite.all():
        row, col = divmod(int(np.argmin(finite.ravel())), x.shape[1])
        raise LogitsFileError(f"{src}: {key} row {row}, column {col} is {float(x[row, col])!r} "
                              "(every input must be finite)")
    return np.ascontiguousarray(x)


def _eval_split(content: bytes, src: str, names: tuple[str, str, str], max_elements: int) -> Split:
    x_key, z_key, y_key = names
    logits = checks.validate_logits(_read(content, src, z_key, max_elements), src, max_elements=max_elements)
    n, k = logits.shape
    labels = checks.validate_labels(_read(content, src, y_key, max_elements), src, n_samples=n,
                                    n_classes=k, logits_src=src)
    return Split(_inputs(content, src, x_key, n, max_elements), logits, labels)
