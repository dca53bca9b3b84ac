"""ATen ops torch has no decomposition for, spelled in ops emmy lowers.

Each is checked against torch's own kernel in the tests (tests/test_ops.py, test_backward_ops.py).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def embedding_renorm(weight, indices, max_norm: float, norm_type: float):
    """The functional form of nn.Embedding's max_norm (torch.export writes the new table back as a
    parameter update): each row `indices` names whose norm is above max_norm is scaled by
    max_norm / (norm + 1e-7), as torch's kernel does: the norm in the table's type, the scale worked
    out in double and rounded to that type; the other rows are kept."""
    named = torch.zeros(weight.shape[0], dtype=torch.bool, device=weight.device)
    named = named.index_put((indices.reshape(-1),), torch.ones((), dtype=torch.bool, device=weight.device))
    norms = torch.linalg.vector_norm(weight, norm_type, dim=1)
    wide = norms.to(torch.float64)
    # number / tensor would be a reciprocal times the number, an ulp off the kernel's division
    scale = (torch.full_like(wide, max_norm) / (wide + 1e-7)).to(weight.dtype)  # as its Scalar, cast to the type
    scaled = weight * scale[:, None]
    return torch.where((named & (norms > max_norm))[:, None], scaled, weight)


def uncovered_decompositions() -> dict:
    """ATen op -> emmy's decomposition, for the ops torch's tables leave out."""
    from emmy.capture.grid_sampling import grid_sampler
    from emmy.capture.polynomials import polynomial_decompositions

    return {aten.embedding_renorm.default: embedding_renorm, aten.grid_sampler_3d.default: grid_sampler,
            **polynomial_decompositions()}
