"""What :meth:`~caliber_core.throttle.throttle.Throttle.respond` returns: the served logits and how they were decided."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Response:
    """What ``respond`` returns. Send ``logits`` to the client, nothing else.

    Attributes
    ----------
    logits : ndarray or torch.Tensor
        The served logits (the input's type, dtype, device and shape).
    level : int
        The highest level decided for the request's rows (0: clean).
    sigma : float
        The sigma of that level (what was added, unless ``shadow``).
    shadow : bool
        The policy is in shadow mode: decided and counted, served clean.
    segments : tuple of (level, rows)
        Row ranges in order; more than one when the request crossed a threshold.
    counted : bool
        False when the store could not be reached and ``on_store_error`` is "last-known"
        (the rows are tallied in the ledger's ``uncounted`` record once it answers).
    """

    logits: object
    level: int
    sigma: float
    shadow: bool
    segments: tuple
    counted: bool = True
    _ticket: object = field(default=None, repr=False, compare=False)  # what Throttle.void needs
