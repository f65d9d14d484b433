"""The thief's surrogate models: an MLP D-128-K (default) or a linear model.

Students are held as a *batch*: S independent models of one architecture
whose parameters are stacked along a leading axis, so S training runs share
every Python-level step (``torch.baddbmm`` does S small matrix products in
one call). Each student's parameters are drawn from its own seed, so a
student's numbers do not depend on which other students share its batch.

torch is imported lazily by the callers' first use; this module imports it
at import time, so import it only when an extraction is actually run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

ARCHITECTURES = ("mlp", "linear")
DEFAULT_HIDDEN = 128


@dataclass(frozen=True)
class StudentShape:
    """Architecture of a student: ``mlp`` (D-hidden-K, ReLU) or ``linear`` (D-K).

    Attributes
    ----------
    architecture : {"mlp", "linear"}
    n_features : int
        D, the input width.
    n_classes : int
        K, the output width.
    hidden : int
        Width of the MLP's hidden layer (ignored for ``linear``).
    """

    architecture: str
    n_features: int
    n_classes: int
    hidden: int = DEFAULT_HIDDEN

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        for name in ("n_features", "n_classes", "hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {self.n_classes}")

    def layer_sizes(self) -> list[tuple[int, int]]:
        """(fan_in, fan_out) of each linear layer."""
        if self.architecture == "linear":
            return [(self.n_features, self.n_classes)]
        return [(self.n_features, self.hidden), (self.hidden, self.n_classes)]


class StudentBatch:
    """S students of one shape, parameters stacked as (S, fan_in, fan_out) and (S, 1, fan_out).

    Parameters
    ----------
    shape : StudentShape
    seeds : sequence of int
        One seed per student; student s's initial weights are a pure function
        of ``seeds[s]`` (torch's default ``nn.Linear`` law, U(-1/sqrt(fan_in),
        1/sqrt(fan_in)) for weights and biases, drawn by numpy's SFC64).
    """

    def __init__(self, shape: StudentShape, seeds: Sequence[int]):
        if len(seeds) < 1:
            raise ValueError("a student batch needs at least one seed, got none")
        self.shape = shape
        self.size = len(seeds)
        weights: list[list[np.ndarray]] = [[] for _ in shape.layer_sizes()]
        biases: list[list[np.ndarray]] = [[] for _ in shape.layer_sizes()]
        for seed in seeds:
            gen = np.random.Generator(np.random.SFC64(np.random.SeedSequence([int(seed), 0x57D])))
            for layer, (fan_in, fan_out) in enumerate(shape.layer_sizes()):
                bound = 1.0 / math.sqrt(fan_in)
                weights[layer].append(gen.uniform(-bound, bound, size=(fan_in, fan_out)))
                biases[layer].append(gen.uniform(-bound, bound, size=(1, fan_out)))
        self.params: list[torch.Tensor] = []
        for w, b in zip(weights, biases):
            self.params.append(torch.from_numpy(np.stack(w).astype(np.float32)).requires_grad_(True))
            self.params.append(torch.from_numpy(np.stack(b).astype(np.float32)).requires_grad_(True))

    @classmethod
    def from_params(cls, shape: StudentShape, params: Sequence[torch.Tensor]) -> "StudentBatch":
        """A batch holding trained parameters (stacked as in ``params``), e.g. joined from two batches.

        Parameters
        ----------
        shape : StudentShape
        params : sequence of torch.Tensor
            Two tensors (weight, bias) per layer, each with the students on axis 0.

        Returns
        -------
        StudentBatch

        Raises
        ------
        ValueError
            Not two tensors per layer.
        """
        expected = 2 * len(shape.layer_sizes())
        if len(params) != expected:
            raise ValueError(f"a {shape.architecture} student has {expected} parameter tensors, got {len(params)}")
        batch = cls.__new__(cls)
        batch.shape = shape
        batch.size = int(params[0].shape[0])
        batch.params = list(params)
        return batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of every student.

        Parameters
        ----------
        x : Tensor of shape (S, n, D)
            One block of rows per student.

        Returns
        -------
        Tensor of shape (S, n, K)
        """
        out = x
        n_layers = len(self.params) // 2
        for layer in range(n_layers):
            w, b = self.params[2 * layer], self.params[2 * layer + 1]
            out = torch.baddbmm(b, out, w)
            if layer < n_layers - 1:
                out = torch.relu(out)
        return out

    @torch.no_grad()
    def predict_logits(self, x: torch.Tensor, *, chunk: int = 4096) -> torch.Tensor:
        """Every student's logits on the same rows ``x``.

        Parameters
        ----------
        x : torch.Tensor of shape (n, D)
        chunk : int, default 4096
            Rows per forward pass.

        Returns
        -------
        torch.Tensor of shape (S, n, K)
        """
        outs = []
        for start in range(0, x.shape[0], chunk):
            block = x[start:start + chunk]
            outs.append(self.forward(block.unsqueeze(0).expand(self.size, -1, -1)))
        return torch.cat(outs, dim=1)
