"""Stand-ins for torch functions that test their inputs' values while they compute, which no
traced program can: torch.cov and torch.corrcoef (an `equal` of the weights),
F.gaussian_nll_loss (`any(var < 0)`, to raise) and torch.combinations (a masked_select of a grid,
value-sized for torch.export though its count depends on the length alone). While emmy captures a
program these names call versions built from plain tensor ops that compute the same values for the
inputs torch accepts; what torch would reject by value (a negative variance) is not detected. Calls
torch's own version where an argument takes a path the stand-in does not (cov's frequency or
analytic weights). Packed sequences (pack_padded_sequence, an RNN over one, pad_packed_sequence)
are kept padded with a mask (emmy.capture.packed_sequences). Likewise torch.distributions' default
argument validation (an RL policy's Categorical checks its probabilities with an `if`) is off while
capturing; a distribution made with validate_args=True still validates, and so fails to capture.
"""

from __future__ import annotations

import contextlib
import itertools
import math

import torch
import torch.nn.functional as F

from emmy.capture import packed_sequences

_TORCH_COV, _TORCH_CORRCOEF, _TORCH_GAUSSIAN_NLL = torch.cov, torch.corrcoef, F.gaussian_nll_loss
_TORCH_COMBINATIONS = torch.combinations
_TENSOR_COV, _TENSOR_CORRCOEF = torch.Tensor.cov, torch.Tensor.corrcoef


def covariance(input: torch.Tensor, *, correction: int = 1, fweights=None, aweights=None) -> torch.Tensor:
    """torch.cov of the variables in input's rows (observations in columns), unweighted."""
    if fweights is not None or aweights is not None:
        return _TORCH_COV(input, correction=correction, fweights=fweights, aweights=aweights)
    rows = input.reshape(1, -1) if input.dim() < 2 else input
    centred = rows - rows.mean(dim=1, keepdim=True)
    dof = max(rows.shape[1] - correction, 0)  # torch divides by 0 here too (inf, nan), after a warning
    result = centred @ centred.transpose(0, 1).conj() / dof
    return result.reshape(()) if rows.shape[0] == 1 else result


def correlation(input: torch.Tensor) -> torch.Tensor:
    """torch.corrcoef: the covariance over the outer product of the standard deviations, in [-1, 1]."""
    c = covariance(input)
    if c.dim() == 0:
        return c / c
    deviation = torch.diagonal(c).sqrt()
    return (c / deviation[:, None] / deviation[None, :]).clamp(-1, 1)


def gaussian_nll(input, target, var, full: bool = False, eps: float = 1e-6, reduction: str = "mean"):
    """F.gaussian_nll_loss: 0.5 * (log(max(var, eps)) + (input - target)^2 / max(var, eps)), plus
    0.5 * log(2 pi) when `full`; var may omit input's last axis or hold one value per row of it."""
    if not isinstance(var, torch.Tensor):
        var = torch.full_like(input, float(var))
    if var.shape != input.shape and tuple(var.shape) == tuple(input.shape[:-1]):
        var = var.unsqueeze(-1)
    elif var.shape != input.shape and not (var.shape[:-1] == input.shape[:-1] and var.shape[-1] == 1):
        return _TORCH_GAUSSIAN_NLL(input, target, var, full=full, eps=eps, reduction=reduction)  # torch's error
    if reduction not in ("none", "mean", "sum"):
        return _TORCH_GAUSSIAN_NLL(input, target, var, full=full, eps=eps, reduction=reduction)
    held = var.clamp(min=eps)  # torch clamps without a gradient; emmy compiles the forward only
    loss = 0.5 * (torch.log(held) + (input - target) ** 2 / held)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def combinations(input: torch.Tensor, r: int = 2, with_replacement: bool = False) -> torch.Tensor:
    """torch.combinations: the r-element combinations of a vector's entries, in torch's
    (lexicographic) order. torch builds them by masking a grid (a value-sized masked_select,
    which torch.export cannot trace); their positions depend on the length alone, so here they are
    a constant table the entries are gathered by."""
    if input.dim() != 1 or r < 0:
        return _TORCH_COMBINATIONS(input, r=r, with_replacement=with_replacement)  # torch's error
    if r == 0:
        return input.new_empty((0,))
    choose = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    table = list(choose(range(input.shape[0]), r))
    positions = torch.tensor(table, dtype=torch.long, device=input.device).reshape(len(table), r)
    return input[positions]


@contextlib.contextmanager
def substituted():
    """torch's value-testing functions replaced by the stand-ins, for the length of a capture."""
    from torch.distributions import Distribution

    validating = Distribution._validate_args
    torch.cov, torch.corrcoef, F.gaussian_nll_loss = covariance, correlation, gaussian_nll
    torch.Tensor.cov, torch.Tensor.corrcoef = covariance, correlation
    torch.combinations = combinations
    Distribution.set_default_validate_args(False)
    packed_sequences.install()
    try:
        yield
    finally:
        torch.cov, torch.corrcoef, F.gaussian_nll_loss = _TORCH_COV, _TORCH_CORRCOEF, _TORCH_GAUSSIAN_NLL
        torch.Tensor.cov, torch.Tensor.corrcoef = _TENSOR_COV, _TENSOR_CORRCOEF
        torch.combinations = _TORCH_COMBINATIONS
        packed_sequences.uninstall()
        Distribution.set_default_validate_args(validating)
