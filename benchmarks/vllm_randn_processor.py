"""The bar a Caliber processor is measured against: a vLLM V1 logits processor that only adds ``torch.randn``.

No keys, no levels, no per-request state: noise of sigma 2 on every row, added in
place in one fused scale-and-add (two passes: the draw, then the add), the least
work any noising processor can do. Imported by benchmarks/bench_vllm.py (a module
of its own, so that vLLM's engine process can import the class by name).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor


class RandnNoise(LogitsProcessor):
    """``logits += 2 * torch.randn_like(logits)`` for every row, in place."""

    def __init__(self, vllm_config, device, is_pin_memory: bool):
        self.device = device

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Every request is served: nothing to check."""

    def is_argmax_invariant(self) -> bool:
        """False: the noise changes the argmax, so greedy requests pass through it too."""
        return False

    def update_state(self, batch_update) -> None:
        """No per-request state."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits themselves, noised in place (as Caliber's processor serves them)."""
        return logits.add_(torch.randn_like(logits), alpha=2.0)
