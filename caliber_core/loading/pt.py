"""``.pt``/``.pth`` files: ``torch.load(weights_only=True)`` after a zip size check.

``torch.save`` writes a zip archive; its central directory (read by zipfile)
declares every member's unpacked size, and the total must fit the budget
before torch reads anything. torch's weights-only unpickler then rebuilds only
tensors and plain containers: a file that references any other Python object
is refused, never executed. Each tensor's shape is counted against the budget
before it is converted (a zero-stride tensor can claim any shape on one element).
"""

from __future__ import annotations

import io
import re

import numpy as np

from .safety import (
    Unvalidated,
    check_count,
    check_unpacked_size,
    clean_name,
    describe_exception,
    fail,
    library_errors,
    list_keys,
    open_zip,
    optional_library,
    rule,
)

_WEIGHTS_ONLY_HINT = re.compile(r"Unsupported (?:global|class): (?:GLOBAL )?([\w.<>]+)")


def read(content: bytes, src: str, *, max_elements: int) -> Unvalidated:
    """A ``torch.save`` archive of a dict of tensors, or of a bare logits tensor.

    Parameters
    ----------
    content : bytes
        The file's bytes.
    src : str
        The file's display name, for messages.
    max_elements : int
        The element budget, checked before the data are read.

    Returns
    -------
    Unvalidated
        The logits, and the dict's labels and name when present.

    Raises
    ------
    LogitsFileError
        Not the zip format torch.save writes, torch missing, an archive that does not load with ``weights_only=True``, no ``logits`` tensor, or too many elements.
    """
    zf = open_zip(content, src, "torch (.pt zip)")
    infos = zf.infolist()
    if not any(info.filename.endswith("data.pkl") for info in infos):
        raise fail(
            src,
            "not a valid torch archive (no data.pkl; only the zip format torch.save "
            "writes since torch 1.6 is accepted)",
        )
    check_unpacked_size(
        src, sum(info.file_size for info in infos), max_elements, "the archive's members"
    )

    torch = optional_library("torch", extra="torch", src=src)  # lazily: importing torch costs seconds

    obj = _load_weights_only(content, src, torch)
    if isinstance(obj, torch.Tensor):
        return Unvalidated(logits=_to_numpy(obj, src, "logits", max_elements, torch))
    if not isinstance(obj, dict):
        raise fail(
            src, f"expected a dict of tensors with a `logits` key, got {type(obj).__name__}"
        )
    if "logits" not in obj:
        raise fail(src, f"no `logits` tensor in the dict (keys: {list_keys(obj)})")
    logits = _to_numpy(obj["logits"], src, "logits", max_elements, torch)
    labels = None
    if obj.get("labels") is not None:
        labels = _to_numpy(obj["labels"], src, "labels", max_elements, torch)
    name = obj.get("name")
    if name is not None and not isinstance(name, str):
        raise fail(src, f"name must be a string, got {type(name).__name__}")
    return Unvalidated(logits=logits, labels=labels, name=clean_name(name) if name else None)


def _load_weights_only(content: bytes, src: str, torch):
    try:
        return torch.load(io.BytesIO(content), weights_only=True, map_location="cpu")
    except MemoryError:
        raise
    except Exception as err:
        text = str(err)
        if "Weights only load failed" not in text and "WeightsUnpickler" not in text:
            raise fail(src, f"not a valid torch file ({describe_exception(err)})") from None
        hint = _WEIGHTS_ONLY_HINT.search(text)
        what = f" (it references {hint.group(1)})" if hint else ""
        raise fail(
            src,
            f"refused: the file holds Python objects other than tensors{what}; "
            "it would need unpickling arbitrary code, which is never done "
            "(save a dict of tensors)",
        ) from None


def _to_numpy(t, src: str, field: str, max_elements: int, torch) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        raise fail(src, f"{field} is a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided or t.is_quantized:
        raise fail(src, f"{field} is a {t.layout} tensor; save a dense tensor")
    check_count(src, field, t.shape, max_elements)  # before any conversion
    if t.dtype == torch.bool:
        raise fail(src, f"{field} has dtype torch.bool (bool); {rule(field)}")
    if t.is_complex():
        raise fail(src, f"{field} has dtype {t.dtype} (complex); {rule(field)}")
    with library_errors(src, f"{field} tensor of dtype {t.dtype} cannot be read"):
        t = t.detach().cpu()
        if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
            t = t.to(torch.float64)  # bfloat16, float8, ...: numpy has no such dtype
        return t.numpy()
