"""ATen ops torch has no decomposition for, spelled in ops emmy lowers.

Each is checked against torch's own kernel in the tests (tests/test_ops.py, test_backward_ops.py,
test_dense_linalg.py, test_special_functions.py).
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


# matrix_exp: a Taylor polynomial of the matrix scaled to 1-norm at most 1, squared back up
TAYLOR_DEGREE = {torch.float32: 12, torch.float64: 18}  # truncation 1/13! ~ 2e-10, 1/19! ~ 8e-18
MAX_SQUARINGS = 32  # 1-norms up to 2^32; the squarings a matrix does not need are skipped by a select


def matrix_exp(a):
    """torch.linalg.matrix_exp by scaling and squaring: s = ceil(log2(|A|_1)) halvings (none for a
    norm at most 1) bring A to norm <= 1, where a Taylor polynomial (Horner's form) is accurate to the
    type; the result is squared s times. s differs per matrix of a batch and is known only at run
    time, so MAX_SQUARINGS squarings are written and each keeps the product only where it is due.
    torch picks among Taylor-based polynomials of degree 1 to 18 by the norm instead; both are
    accurate to about the type's precision times the squarings' growth."""
    if a.dtype not in TAYLOR_DEGREE:
        return NotImplemented  # complex and half types: torch's kernel
    order = a.shape[-1]
    norm = a.abs().sum(-2).amax(-1)  # the 1-norm of each matrix
    squarings = torch.clamp(torch.ceil(torch.log2(norm)), min=0, max=MAX_SQUARINGS)
    scaled = a / torch.pow(2.0, squarings).to(a.dtype)[..., None, None]
    eye = torch.eye(order, dtype=a.dtype, device=a.device)
    result = eye
    for k in range(TAYLOR_DEGREE[a.dtype], 0, -1):
        result = eye + (scaled @ result) / k
    for step in range(MAX_SQUARINGS):
        result = torch.where((squarings > step)[..., None, None], result @ result, result)
    return result


def uncovered_decompositions() -> dict:
    """ATen op -> emmy's decomposition, for the ops torch's tables leave out."""
    from emmy.capture.grid_sampling import grid_sampler
    from emmy.capture.polynomials import polynomial_decompositions

    return {aten.embedding_renorm.default: embedding_renorm, aten.grid_sampler_3d.default: grid_sampler,
            aten.linalg_matrix_exp.default: matrix_exp, **polynomial_decompositions()}
