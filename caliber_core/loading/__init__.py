"""Reading cached validation logits safely: every supported format, one error type.

Providers upload the logits their classifier produced on a validation set (and
usually the true labels). :func:`load_logits` / :func:`load_logits_bytes` turn
such a file into a validated :class:`LogitsData` or raise
:class:`LogitsFileError` with one short line that names the file, states the
rule and shows the offending value.

Layout: one module per format over a shared safety layer.

=====================  ===========================================================
``safety``             the error type, the one text sanitizer, element and byte
                       budgets, the dtype rules, library-error wrapping, zip opening
``npy``, ``npz``       ``.npy`` arrays; ``.npz`` archives of them
``pt``                 ``.pt``/``.pth`` (``torch.save`` archives)
``safetensors_file``   ``.safetensors``
``csv_file``,          tables: one numeric column per class and an optional
``parquet_file``,      ``label`` column (``columns`` holds what the two share)
``columns``
``labels_file``        a separate labels file (``.npy``, ``.npz``, ``.csv``, ``.txt``)
``checks``             the contents: logits, labels, a positive margin scale
``load``               the entry points, dispatch by extension, :class:`LogitsData`
=====================  ===========================================================

Safety rules, for every format:

* nothing is ever unpickled: object dtypes are refused and numpy reads with
  ``allow_pickle=False``; ``.pt`` files go through ``torch.load(weights_only=True)``
  only; safetensors, CSV and parquet carry no code at all;
* nothing is allocated from a size a file declares before that size has been
  checked against ``max_elements`` (:func:`safety.check_count`), so a header
  claiming a 10**14-element array is refused in microseconds; archive members
  and parquet row groups are checked for their declared unpacked size before
  they are inflated (zip bombs), and files for their size on disk before they
  are read;
* arrays the caller does not need (``inputs``, ``heldout_logits``, ... in the
  demo archives) are never read;
* every error is a :class:`LogitsFileError` on one line.

Whose parser reads what:

* **Libraries.** ``.npy`` headers: ``numpy.lib.format.read_magic`` and
  ``read_array_header_1_0``/``_2_0``; ``.npy`` data: ``numpy.lib.format.read_array``,
  called only once the header's dtype and element count passed (on its own it
  would allocate whatever the header claims before reading any data). Zip
  containers (``.npz``, ``.pt``): zipfile's central directory and streams,
  whose CRC check is kept. ``.pt``: torch's weights-only unpickler, after the
  archive's declared size is checked. CSV: pandas, after a rows × columns
  estimate from the text. Parquet: pyarrow's footer metadata, checked before
  pyarrow reads a column. Safetensors JSON: the standard library's ``json``.
* **Hand-written.** The safetensors header *rules* (length, offsets, byte
  spans, tiling) and the tensor views: the ``safetensors`` package applies the
  same rules, but its only in-memory reader copies every tensor in the file
  (including the ones never used and BF16, which numpy cannot hold), and
  ``safe_open`` needs a file on disk; a test checks that the two agree. The
  one-integer-per-line labels text format, which no library defines.

Validation happens before any numerics: 2-D real logits with at least one row
and two classes, every value finite, integer labels in ``[0, K)`` of matching
length, and a positive median top-two margin (the margin scale S of
``margins.margin_scale``; v = sigma^2 / S^2 is undefined otherwise).
"""

from __future__ import annotations

from ..lazy_names import lazy_names

_NAMES = {
    "DEFAULT_MAX_ELEMENTS": "safety",
    "LABELS_EXTENSIONS": "labels_file:EXTENSIONS",
    "LogitsData": "load",
    "LogitsFileError": "safety",
    "MIN_ROWS_FOR_PRECISION": "load",
    "SUPPORTED_EXTENSIONS": "load",
    "describe": "load",
    "load_logits": "load",
    "load_logits_bytes": "load",
    "require_labels": "load",
    "with_labels_bytes": "load",
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
