"""What a Perturber accepts: logits (numpy or torch) and one id per row, validated before any draw.

torch is never imported here; a tensor is recognized by its type's module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..validation import is_torch
from . import fused_noise
from .keyed_noise import checked_digests, encode_ids


def encode_row_ids(ids, n_rows: int, *, single_row: bool) -> list[bytes]:
    """One id per row as bytes (:func:`.keyed_noise.encode_ids`).

    Parameters
    ----------
    ids : str, bytes, or sequence of them
        One id per row; a single str/bytes only for one 1-D row.
    n_rows : int
        Rows of the logits.
    single_row : bool
        The logits were 1-D (K,).

    Returns
    -------
    list of bytes
        ``n_rows`` ids.

    Raises
    ------
    TypeError
        A bare str/bytes for a batch, something that is not a sequence, or an id of another type.
    ValueError
        A multi-dimensional id array, or not one id per row.
    """
    if single_row and isinstance(ids, (str, bytes, bytearray, memoryview)):
        return encode_ids([ids])
    if isinstance(ids, (str, bytes, bytearray, memoryview)):
        # A bare string for a batch would otherwise be split into characters.
        raise TypeError(
            f"ids for a batch of {n_rows} rows must be a sequence of str/bytes, "
            f"got a single {type(ids).__name__} {ids!r}"
        )
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"ids must be one-dimensional, got an array of shape {ids.shape}")
        ids = ids.tolist()
    elif not isinstance(ids, Sequence):
        if not (hasattr(ids, "__len__") and hasattr(ids, "__iter__")):  # e.g. a pandas Series passes
            raise TypeError(f"ids must be a sequence of str/bytes, got {type(ids).__name__}")
        ids = list(ids)
    if len(ids) != n_rows:
        raise ValueError(f"need one id per row: got {len(ids)} ids for {n_rows} rows")
    return encode_ids(ids)


def row_shape(logits) -> tuple[int, int, bool]:
    """(n_rows, n_classes, single_row) of numpy or torch logits, after the type and shape checks.

    Parameters
    ----------
    logits : ndarray or torch.Tensor of shape (N, K) or (K,)
        Floating logits.

    Returns
    -------
    n_rows : int
    n_classes : int
    single_row : bool
        The logits are one 1-D row.

    Raises
    ------
    TypeError
        Not a floating dtype (or a torch-module object that is not a tensor).
    ValueError
        Neither 1-D nor 2-D, or fewer than 2 classes.
    """
    if is_torch(logits):
        import torch

        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a numpy array or torch tensor, got {type(logits).__name__}")
        if not logits.is_floating_point():
            raise TypeError(f"logits must have a floating dtype, got {logits.dtype}")
        shape = tuple(logits.shape)
    else:
        arr = np.asarray(logits)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"logits must have a floating dtype, got {arr.dtype}")
        shape = arr.shape
    if len(shape) not in (1, 2):
        raise ValueError(
            f"logits must be (n_samples, n_classes) or a single row (n_classes,), got shape {shape}"
        )
    n_rows, n_classes = (1, shape[0]) if len(shape) == 1 else shape
    if n_classes < 2:
        raise ValueError(f"logits need at least 2 classes, got n_classes={n_classes}")
    return n_rows, n_classes, len(shape) == 1


def check_values(logits, *, limit: float) -> None:
    """Refuse NaN and finite values beyond ``limit`` in magnitude (+-inf, a masked class, passes).

    One pass in the common case (the smallest and largest values within the
    limit: no temporary), more when some class is masked with +-inf; on a
    torch device the answer is two scalars brought to the host at once.

    Parameters
    ----------
    logits : ndarray or torch.Tensor
        Floating logits.
    limit : float
        The largest finite magnitude allowed.

    Raises
    ------
    ValueError
        A NaN, or a finite value beyond ``limit``; the message gives the first one's row and class.
    """
    torch_in = is_torch(logits)
    values = logits.detach() if torch_in else np.asarray(logits)
    if (values.numel() if torch_in else values.size) == 0:
        return
    found = _min_max_in_one_pass(values, torch_in)
    if found is not None:
        smallest, largest = found
    elif torch_in:
        import torch

        smallest, largest = torch.stack(torch.aminmax(values)).tolist()
    else:
        smallest, largest = float(values.min()), float(values.max())
    if -limit <= smallest and largest <= limit:  # a NaN fails both comparisons: it is looked for below
        return
    magnitude = values.abs() if torch_in else np.abs(values)
    largest = float(magnitude.amax() if torch_in else magnitude.max())
    if largest <= limit:
        return
    if largest == math.inf:  # masked classes: the largest finite magnitude decides
        if torch_in:
            largest = float(magnitude.masked_fill(magnitude == math.inf, 0).amax())
        else:
            magnitude[magnitude == np.inf] = 0  # a temporary of ours (a where= reduction is slower)
            largest = float(magnitude.max())
        if largest <= limit:
            return
    rows = values.reshape(-1, values.shape[-1])
    rows = rows.cpu().double().numpy() if torch_in else rows
    nan_at = np.argwhere(np.isnan(rows))
    if nan_at.size:
        raise ValueError(f"logits contain NaN (first at row {nan_at[0][0]}, class {nan_at[0][1]})")
    row, col = np.argwhere(np.isfinite(rows) & (np.abs(rows) > limit))[0]
    raise ValueError(f"logits hold {float(rows[row, col])!r} at row {row}, class {col}: beyond {limit:.4g}, "
                     f"the largest magnitude whose noisy value stays finite in this dtype")


def _min_max_in_one_pass(values, torch_in: bool):
    """(min, max) of CPU rows by the fused kernel's one pass, NaN as a NaN min; None where it does not apply
    (no kernel loaded yet, another device, dtype or layout). torch.aminmax took 3 ms a batch of 8 x 32,000 in
    vLLM's CPU engine, as long as half the noise itself."""
    if not fused_noise.available() or values.ndim not in (1, 2) or 0 in values.shape:
        return None
    if torch_in:
        name = str(values.dtype).rpartition(".")[2]
        if values.device.type != "cpu" or values.stride(-1) != 1 or name not in fused_noise.DTYPE_CODES:
            return None
        pointer, row_stride = values.data_ptr(), values.stride(0) * values.element_size()
    else:
        name = values.dtype.name
        if values.strides[-1] != values.itemsize or not values.dtype.isnative or name not in fused_noise.DTYPE_CODES:
            return None
        pointer, row_stride = values.ctypes.data, values.strides[0]
    shape = (1, values.shape[0]) if values.ndim == 1 else tuple(values.shape)
    smallest, largest, nan = fused_noise.min_max(pointer, shape, row_stride, name)
    return (math.nan if nan else smallest), largest


def largest_value(dtype) -> float:
    """The largest finite value of a numpy or torch floating dtype.

    Parameters
    ----------
    dtype : numpy.dtype or torch.dtype
        A floating dtype.

    Returns
    -------
    float
    """
    if isinstance(dtype, np.dtype):
        return float(np.finfo(dtype).max)
    import torch

    return float(torch.finfo(dtype).max)


def check_request(logits, ids, *, n_classes: int | None, seeding: str, noise_bound: float, source: str,
                  digests=None):
    """Every check of a request, before any draw.

    Parameters
    ----------
    logits : ndarray or torch.Tensor of shape (N, K) or (K,)
        The request's logits.
    ids : str, bytes, sequence of them, or None
        One id per row; None only for fresh seeding.
    n_classes : int or None
        The config's K (None: any).
    seeding : str
        The Perturber's seeding; "per-input" needs ids.
    noise_bound : float
        The largest noise the served levels can add, so that no finite logit turns infinite.
    source : str
        What sets that bound, named in the message.
    digests : array_like of shape (N, 32), uint8, optional
        The ids' digests in their place (``keyed_noise.row_digests``): checked here, one row each.

    Returns
    -------
    n_rows : int
    n_classes : int
    single_row : bool
    encoded_ids : list of bytes or None
    is_torch : bool

    Raises
    ------
    TypeError
        A non-floating dtype or malformed ids.
    ValueError
        K differs from the config's, per-input seeding without ids, not one
        id (or digest) per row, both ids and digests, a noise bound beyond
        half the dtype's range, or NaN or a value too large to stay finite once noised.
    """
    n_rows, k, single_row = row_shape(logits)
    if n_classes is not None and k != n_classes:
        raise ValueError(f"logits have n_classes={k}, but the config was calibrated for n_classes={n_classes}")
    if digests is not None:
        if ids is not None:
            raise ValueError("pass ids or their digests, not both")
        checked_digests(digests, n_rows)
    elif ids is None and seeding == "per-input":
        raise ValueError("per-input seeding needs ids (one str/bytes per row), got ids=None")
    encoded = None if ids is None else encode_row_ids(ids, n_rows, single_row=single_row)
    torch_in = is_torch(logits)
    largest = largest_value(logits.dtype if torch_in else np.asarray(logits).dtype)
    if noise_bound >= largest / 2:
        raise ValueError(f"{source} can add noise up to {noise_bound:.3g}, beyond "
                         f"half the largest {logits.dtype} value ({largest:.3g})")
    check_values(logits, limit=largest - noise_bound)
    return n_rows, k, single_row, encoded, torch_in
