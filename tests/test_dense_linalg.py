"""Small dense linear algebra (emmy.decompose.dense_linalg): solves, inverses, determinants, LU and
Cholesky factors and triangular solves against torch's LAPACK results, the integer outputs
(pivots, info) exactly; the CUDA of one such program ASan-clean in the simulator; and the matrix
exponential (emmy.capture.uncovered) by scaling and squaring."""

import pytest
import torch
import torch.nn as nn

import emmy
from emmy.decompose.dense_linalg import MAX_ORDER
from emmy.errors import UnsupportedOpError


def _spd(n, *batch, dtype=torch.float32):
    a = torch.randn(*batch, n, n, dtype=dtype)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)


class LUFamily(nn.Module):
    """Everything getrf answers: solves (left, right, vector, broadcast), inverse, det, slogdet,
    the packed and the unpacked LU, lu_solve in its three forms."""

    def forward(self, a, b, v, row):
        lu, pivots = torch.linalg.lu_factor(a)
        return (torch.linalg.solve(a, b), torch.linalg.solve(a, v), torch.linalg.solve(a[0], b),
                torch.linalg.solve(a, row, left=False), torch.linalg.inv(a), torch.linalg.det(a),
                *torch.linalg.slogdet(a), *torch.ops.aten._linalg_det(a)[1:], *torch.ops.aten._linalg_slogdet(a.mT)[2:],
                lu, pivots, *torch.linalg.lu(a), torch.linalg.lu_solve(lu, pivots, b),
                torch.linalg.lu_solve(lu, pivots, b, adjoint=True), torch.linalg.lu_solve(lu, pivots, row, left=False),
                torch.linalg.solve_ex(a, b).info)


class CholeskyFamily(nn.Module):
    """potrf and the triangular solves: both triangles, both sides, unit diagonals, the deprecated
    triangular_solve, and cholesky_ex's info on a matrix that is not positive definite."""

    def forward(self, spd, b, t, row, not_spd):
        low = torch.linalg.cholesky(spd)
        up = torch.linalg.cholesky(spd, upper=True)
        return (low, up, torch.cholesky_solve(b, low), torch.cholesky_solve(b, up, upper=True),
                torch.cholesky_inverse(low), torch.linalg.solve_triangular(torch.triu(t), b, upper=True),
                torch.linalg.solve_triangular(torch.tril(t), row, upper=False, left=False, unitriangular=True),
                *torch.triangular_solve(b, torch.tril(t), upper=False, transpose=True),
                torch.linalg.cholesky_ex(not_spd).info, torch.logdet(spd))


def _lu_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return (torch.randn(2, 5, 5, dtype=dtype), torch.randn(2, 5, 3, dtype=dtype), torch.randn(2, 5, dtype=dtype),
            torch.randn(2, 3, 5, dtype=dtype))


def _cholesky_inputs():
    torch.manual_seed(1)
    t = torch.randn(2, 4, 4) + 4 * torch.eye(4)
    not_spd = torch.stack([_spd(4), torch.tensor([[1.0, 2, 0, 0], [2, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])])
    return _spd(4, 2), torch.randn(2, 4, 3), t, torch.randn(2, 3, 4), not_spd


def _check(got, want, tol):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, atol=tol, rtol=tol, msg=lambda m: f"output {k}: {m}")
        else:  # pivots and info: torch's exactly
            assert torch.equal(g, w), (k, g, w)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
def test_the_lu_family_matches_torch(dtype, tol):
    inputs = _lu_inputs(dtype)
    program = emmy.optimize(LUFamily(), *inputs)
    _check(program(*inputs, device="interpret"), LUFamily()(*inputs), tol)


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated")
def test_the_cholesky_family_matches_torch():
    inputs = _cholesky_inputs()
    program = emmy.optimize(CholeskyFamily(), *inputs)
    _check(program(*inputs, device="interpret"), CholeskyFamily()(*inputs), 2e-5)


def test_a_singular_matrix_gives_lapacks_factors_a_zero_determinant_and_its_info():
    """The second column is twice the first: the elimination's second pivot is exactly zero; LAPACK
    leaves that column unscaled, so LU, pivots, det (0) and info (2) are torch's."""
    a = torch.tensor([[[1.0, 2, 3], [2, 4, 7], [1, 2, 1]], [[2.0, 1, 0], [1, 3, 1], [0, 1, 4]]])

    def f(a):
        lu, pivots, info = torch.linalg.lu_factor_ex(a)
        return lu, pivots, info, torch.linalg.det(a), torch.linalg.slogdet(a).sign

    program = emmy.optimize(f, a)
    got, want = program(a, device="interpret"), f(a)
    _check(got, want, 1e-6)
    assert want[2].tolist() == [2, 0] and want[3][0].item() == 0.0  # the case is the one described


def test_the_cuda_of_camera_poses_and_a_gaussian_process_runs_asan_clean():
    """A program of the kind that calls these ops: world-to-camera matrices as the inverses of 4x4
    poses, points moved by them, and a Gaussian process's posterior mean and log marginal term by a
    Cholesky factor, through the simulator with ASan."""

    def f(poses, points, x, y):
        view = torch.linalg.inv(poses)
        moved = (view[:, None, :3, :3] @ points[None, ..., None]).squeeze(-1) + view[:, None, :3, 3]
        kernel = torch.exp(-torch.cdist(x, x) ** 2) + 0.1 * torch.eye(x.shape[0])
        low = torch.linalg.cholesky(kernel)
        alpha = torch.cholesky_solve(y[:, None], low)
        return moved, kernel @ alpha, 2 * torch.log(torch.diagonal(low)).sum() + (y[:, None] * alpha).sum()

    torch.manual_seed(2)
    rotation = torch.linalg.qr(torch.randn(3, 3, 3)).Q
    poses = torch.zeros(3, 4, 4)
    poses[:, :3, :3], poses[:, :3, 3], poses[:, 3, 3] = rotation, torch.randn(3, 3), 1.0
    inputs = (poses, torch.randn(5, 3), torch.randn(6, 2), torch.randn(6))
    program = emmy.optimize(f, *inputs)
    _check(program(*inputs, sim_mode="asan"), f(*inputs), 1e-4)


def test_an_order_past_the_unrolled_limit_is_refused_with_the_limit():
    n = MAX_ORDER + 1
    with pytest.raises(UnsupportedOpError, match=f"order {n}; emmy unrolls .* at most {MAX_ORDER}"):
        emmy.optimize(f"a=torch.randn({n},{n}); torch.linalg.inv(a)")


def test_training_through_torch_compile_gives_eagers_gradients(fresh_dynamo):
    """The backward graphs read the forward's LU and pivots (det's and slogdet's are of A^T, as
    torch factors a contiguous matrix), and solve by linalg_lu_solve, adjoint too."""

    def loss(a, b):
        return (torch.linalg.solve(a, b).sum() + torch.linalg.det(a).sum() + torch.linalg.inv(a).square().sum()
                + torch.linalg.slogdet(a).logabsdet.sum())

    torch.manual_seed(3)
    a, b = torch.randn(2, 4, 4) + 3 * torch.eye(4), torch.randn(2, 4, 2)
    eager = [t.clone().requires_grad_() for t in (a, b)]
    loss(*eager).backward()
    compiled = [t.clone().requires_grad_() for t in (a, b)]
    torch.compile(loss, backend="emmy", dynamic=False, options={"simulate": True})(*compiled).backward()
    for mine, theirs in zip(compiled, eager):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_matrix_exp_by_scaling_and_squaring_matches_torch(dtype, tolerance):
    """Norms from 0 to ~60, general and skew-symmetric (an orthogonal result), in one batch: each
    matrix squares back as often as its own norm needs. In f32 torch's polynomials and these differ
    by up to ~4e-6 of the largest entry, each as far from the f64 result as the other."""
    from emmy.capture.uncovered import matrix_exp

    torch.manual_seed(0)
    a = torch.randn(6, 5, 5, dtype=dtype) * torch.tensor([0.0, 1e-3, 0.2, 1.0, 4.0, 12.0], dtype=dtype)[:, None, None]
    for m in (a, a - a.transpose(-1, -2)):
        want = torch.linalg.matrix_exp(m)
        scale = want.abs().amax((-2, -1), keepdim=True)
        assert ((matrix_exp(m) - want).abs() / scale).max() < tolerance


class OrthogonalLayer(nn.Module):
    """torch.nn.utils.parametrizations.orthogonal: the weight is the matrix exponential of a
    skew-symmetric matrix, computed in every forward."""

    def __init__(self):
        super().__init__()
        self.layer = nn.utils.parametrizations.orthogonal(nn.Linear(6, 6))

    def forward(self, x):
        return self.layer(x)


def test_an_orthogonally_parametrized_layer_runs_right_in_the_simulator():
    torch.manual_seed(0)
    model, x = OrthogonalLayer().eval(), torch.randn(3, 6)
    program = emmy.optimize(model, x)
    with torch.no_grad():
        torch.testing.assert_close(program(x, sim_mode="asan"), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape,reflectors", [((5, 3), 3), ((2, 6, 4), 2), ((4, 4), 4), ((3, 5, 1), 1)])
def test_householder_product_matches_torch(shape, reflectors):
    from emmy.capture.uncovered import householder_product

    torch.manual_seed(0)
    a = torch.randn(shape, dtype=torch.float64)
    tau = torch.rand(*shape[:-2], reflectors, dtype=torch.float64)
    torch.testing.assert_close(householder_product(a, tau), torch.linalg.householder_product(a, tau))


def test_a_householder_parametrized_layer_runs_right_in_the_simulator():
    """orthogonal(..., orthogonal_map="householder") computes linalg.householder_product every forward:
    torch has no decomposition for it, and emmy refused the op."""
    torch.manual_seed(0)
    model = nn.utils.parametrizations.orthogonal(nn.Linear(6, 5), orthogonal_map="householder").eval()
    x = torch.randn(3, 6)
    program = emmy.optimize(model, x)
    with torch.no_grad():
        torch.testing.assert_close(program(x, sim_mode="asan"), model(x), atol=1e-5, rtol=1e-5)
