"""Delay-compensated gradients (DC-ASGD, Zheng et al. 2017), spec `training.delayCompensation`.

A pipelined batch was sampled by older weights w_b than the weights w_now the trainer is about to
update. DC-ASGD corrects the gradient to first order in the weight change, approximating the
Hessian by the diagonal of the gradient's outer product:

    g_dc = g + lambda * g * g * (w_now - w_b)          (elementwise)

with lambda >= 0 (0 = off). The batch mixes tokens of several versions; its w_b is the weights of
`behaviour_version`: the token-weighted mean version of the batch's completion tokens, rounded to
the nearest step. Applied to the gradient averaged over ranks, before clipping and the optimizer.

Memory: the trainer keeps the weights of every version a batch can still come from, at most
`pipeline.maxLag + 1` copies of the fp32 parameters on the trainer's device (a 0.5B-parameter
model at maxLag 8: 9 x 2 GB = 18 GB per rank). `WeightHistory` holds them; a version it never saw
(the first steps after a resume) is answered with the oldest one it holds, and reported.

Pure tensor functions plus the bounded history; `engines/ddp_engine.py` applies them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import torch


def compensate(
    grad: torch.Tensor, w_now: torch.Tensor, w_behaviour: torch.Tensor, lam: float
) -> torch.Tensor:
    """g + lam * g * g * (w_now - w_behaviour)."""
    return grad + lam * grad * grad * (w_now - w_behaviour)


def behaviour_version(version_sum: float, tokens: float, trainer_version: int) -> int:
    """The batch's mean token version, rounded; the trainer's own version for a batch without tokens."""
    if tokens <= 0:
        return trainer_version
    return min(trainer_version, round(version_sum / tokens))


class WeightHistory:
    """Copies of the weights of the last `keep` versions (`keep` = maxLag + 1)."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"a weight history must keep at least one version, not {keep}")
        self._keep = keep
        self._versions: collections.OrderedDict[int, list[torch.Tensor]] = collections.OrderedDict()

    def record(self, version: int, params: Iterable[torch.Tensor]) -> None:
        self._versions[version] = [p.detach().clone() for p in params]
        self._versions.move_to_end(version)
        while len(self._versions) > self._keep:
            self._versions.popitem(last=False)

    def weights(self, version: int) -> tuple[int, list[torch.Tensor]]:
        """(the version found, its weights): `version` if held, else the newest older one held, else
        the oldest held. KeyError when nothing is held."""
        if not self._versions:
            raise KeyError("the weight history is empty")
        if version in self._versions:
            return version, self._versions[version]
        older = [v for v in self._versions if v < version]
        found = max(older) if older else min(self._versions)
        return found, self._versions[found]

    @property
    def versions(self) -> list[int]:
        return sorted(self._versions)
