"""Every capture form reaches the same Tensor IR, with named inputs and weights."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import emmy
from emmy.tensor_ir.nodes import Input, Weight
from tests.conftest import check_against_torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x):
        return F.gelu(self.proj(x)) * self.scale


def _kinds(graph):
    return (
        [n.name for n in graph.nodes if isinstance(n, Input)],
        sorted(n.name for n in graph.nodes if isinstance(n, Weight)),
    )


def _body(text: str) -> list[str]:
    # Statements only: provenance comments name different source lines per form.
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_module_parameters_and_buffers_become_named_weights():
    block = Block()
    program = emmy.optimize(block, torch.randn(4, 8))
    inputs, weights = _kinds(program.tensor_ir)
    assert inputs == ["x"]
    assert weights == ["proj_weight", "scale"]
    check_against_torch(program)


def test_function_module_graphmodule_and_exported_program_agree():
    def fn(x, w):
        return torch.softmax(x @ w, dim=-1)

    class M(torch.nn.Module):
        def forward(self, x, w):
            return fn(x, w)

    x, w = torch.randn(4, 6), torch.randn(6, 5)
    forms = {
        "function": emmy.optimize(fn, x, w),
        "module": emmy.optimize(M(), x, w),
        "graph_module": emmy.optimize(torch.fx.symbolic_trace(M()), x, w),
        "exported": emmy.optimize(torch.export.export(M(), (x, w))),
        "code": emmy.optimize("x=torch.randn(4,6); w=torch.randn(6,5); torch.softmax(x @ w, dim=-1)"),
    }
    texts = {name: _body(p.ir("tensor")) for name, p in forms.items()}
    assert all(t == texts["function"] for t in texts.values()), texts
    for name, program in forms.items():
        if name != "code":  # -c code makes its own random inputs
            assert [t.shape for t in program.example_inputs] == [x.shape, w.shape]
        check_against_torch(program)


def test_code_names_inputs_after_their_variables_and_hoists_inline_factories():
    program = emmy.optimize("a=torch.randn(3,4); a @ torch.randn(4,2)")
    inputs, _ = _kinds(program.tensor_ir)
    assert inputs == ["a", "arg1"]
    assert [tuple(t.shape) for t in program.example_inputs] == [(3, 4), (4, 2)]


def test_code_takes_random_permutations_and_normals_as_inputs():
    """torch.randperm, torch.normal and torch.randint_like make example inputs as randn does; they
    are not ops to compile."""
    program = emmy.optimize("x=torch.normal(0.0, 2.0, (3,5)); p=torch.randperm(5); "
                            "k=torch.randint_like(x, 0, 3).long(); x[:, p] + k")
    inputs, _ = _kinds(program.tensor_ir)
    assert inputs == ["x", "p", "k"]
    assert sorted(program.example_inputs[1].tolist()) == list(range(5))
    check_against_torch(program)


def test_code_modules_keep_their_parameters():
    program = emmy.optimize("x=torch.randn(2,8); lin=nn.Linear(8,4); norm=nn.LayerNorm(4); norm(lin(x))")
    _, weights = _kinds(program.tensor_ir)
    assert weights == ["lin_bias", "lin_weight", "norm_bias", "norm_weight"]
    check_against_torch(program)


def test_code_with_helper_functions_loops_and_tuples():
    code = (
        "def block(h):\n"
        "    return torch.tanh(h) * 2\n"
        "x = torch.randn(3, 5)\n"
        "for _ in range(2):\n"
        "    x = block(x)\n"
        "(x.sum(-1), x.amax(0))\n"
    )
    program = emmy.optimize(code)
    assert len(program.tensor_ir.outputs) == 2
    check_against_torch(program)


def test_traced_ops_point_at_their_source_line():
    program = emmy.optimize("x = torch.randn(4)\ny = x.exp()\ny * 2")
    text = program.ir("torch")
    assert "aten.exp.default(x)" in text and "# line 2: `y = x.exp()`" in text
    assert "# line 3: `y * 2`" in text


def test_example_inputs_are_reproducible():
    first = emmy.optimize("x=torch.randn(5); x * 2").example_inputs[0]
    second = emmy.optimize("x=torch.randn(5); x * 2").example_inputs[0]
    assert torch.equal(first, second)


def test_code_converts_modules_and_inputs_with_half_to_and_bfloat16():
    code = ("l = nn.Linear(8, 16).half()\n"
            "m = nn.Linear(16, 4).to(torch.bfloat16)\n"
            "x = torch.randn(4, 8).to(torch.float16)\n"
            "y = torch.randn(4, 16).bfloat16()\n"
            "(l(x), m(y))\n")
    program = emmy.optimize(code)
    inputs = {n.name: n.type for n in program.tensor_ir.inputs}
    assert str(inputs["x"]) == "f16[4,8]" and str(inputs["y"]) == "bf16[4,16]"
    weights = {n.name: n.type for n in program.tensor_ir.weights}
    assert str(weights["l_weight"]) == "f16[16,8]" and str(weights["m_weight"]) == "bf16[4,16]"
    check_against_torch(program)


def test_python_numbers_are_scalar_inputs_that_each_call_may_change():
    from emmy.runtime import run_program

    def scaled(x, s, n):
        return (x * s + n).sum(-1)

    x = torch.randn(6, 40)
    program = emmy.optimize(scaled, x, 2.5, 3)
    kinds = {n.name: str(n.type) for n in program.tensor_ir.inputs}
    assert kinds == {"x": "f32[6,40]", "s": "f32[]", "n": "i64[]"}
    for s, n in [(2.5, 3), (-0.75, 11)]:
        (got,) = run_program(program, [x, s, n], mode="asan").values()
        torch.testing.assert_close(torch.from_numpy(got).reshape(6), scaled(x, s, n), rtol=1e-5, atol=1e-4)


class LastLogits(torch.nn.Module):
    """transformers' `num_logits_to_keep`: an int argument read as a size (a slice's start)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 5)

    def forward(self, hidden, scale, shift: int, num_logits_to_keep: int = 0):
        return self.head(hidden[:, -num_logits_to_keep:, :].roll(shift, 1)) * scale


def test_an_int_read_as_a_size_is_compiled_in_and_a_call_must_pass_the_same(tmp_path):
    """No program can take a slice's length at run time: the capture is made again with the int
    arguments as constants (as bools are), while a float stays an input a call may change."""
    from emmy.errors import InputMismatchError

    torch.manual_seed(0)
    model, hidden = LastLogits(), torch.randn(2, 6, 8)
    program = emmy.optimize(model, hidden, 0.5, 1, example_kwargs={"num_logits_to_keep": 3})
    assert [name for name, _ in program.signature.inputs] == ["hidden", "scale"]
    program.save(tmp_path / "last.emmy")
    for run in (program, emmy.load(tmp_path / "last.emmy")):
        for scale in (0.5, -2.0):
            torch.testing.assert_close(run(hidden, scale, 1, num_logits_to_keep=3), model(hidden, scale, 1, 3))
    with pytest.raises(InputMismatchError, match="keyword 'num_logits_to_keep' was 3 .* got 2"):
        program(hidden, 0.5, 1, num_logits_to_keep=2)
    with pytest.raises(InputMismatchError, match="argument 2 was 1 .* got 0"):
        program(hidden, 0.5, 0, num_logits_to_keep=3)


def test_a_graph_already_in_emmys_ops_skips_the_second_trace():
    from emmy.capture import exporting
    from emmy.capture.code import capture_code

    rms = capture_code("x=torch.randn(4,16); w=torch.randn(16); F.rms_norm(x,(16,),w)", "-c code")
    exported = exporting.export_module(rms.module, rms.example_inputs.shaped())
    assert exporting.decompose(exported) is exported  # rms_norm is kept whole and emmy lowers it
    mlp = capture_code("x=torch.randn(4,8); l=nn.Linear(8,8); F.silu(l(x))", "-c code")
    exported = exporting.export_module(mlp.module, mlp.example_inputs.shaped())
    decomposed = exporting.decompose(exported)
    ops = {str(n.target) for n in decomposed.graph.nodes if n.op == "call_function"}
    assert decomposed is not exported and "aten.linear.default" not in ops and "aten.silu.default" not in ops


def _line_of(marker: str) -> int:
    return next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if marker in text)


def test_a_branch_on_tensor_values_in_a_module_names_the_users_line_and_torchs_function():
    """The error names the user's own line (their file, not -c code) and, where torch's library
    branched for them, which function did (a distribution validates its arguments with an if)."""
    import torch

    from emmy.errors import CodeError

    class GaussianLoss(torch.nn.Module):
        def forward(self, a, b):
            return torch.distributions.Normal(a, b.abs() + 1, validate_args=True).log_prob(a)  # marker: library branch

    def branch(x):
        if x.sum() > 0:  # marker: own branch
            return x
        return -x

    with pytest.raises(CodeError) as library:
        emmy.optimize(GaussianLoss(), torch.randn(3, 4), torch.randn(3, 4))
    text = str(library.value)
    assert f"at {__file__}:{_line_of('marker: library branch')}: `return torch.distributions.Normal(" in text, text
    assert "(inside torch's __init__, distributions/distribution.py:" in text, text
    with pytest.raises(CodeError) as own:
        emmy.optimize(branch, torch.randn(3))
    text = str(own.value)
    assert f"at {__file__}:{_line_of('marker: own branch')}: `if x.sum() > 0:" in text, text
    assert "inside torch" not in text, text


def test_a_branch_torch_names_outside_its_own_files_is_not_called_torch_s():
    """torch's message names the branching file relative to its own directory; a library's file
    (transformers' Longformer) comes out clipped ("mp/hf/transformers/...") and is no file of torch:
    it was reported as "inside torch's forward"."""
    from emmy.capture.errors import _library_branch

    library = RuntimeError("Could not guard on data-dependent expression u0 > 0 "
                           "(Caused by: (mp/hf/transformers/models/longformer/modeling_longformer.py:549 in forward))")
    assert _library_branch(library) is None
    own = RuntimeError("Could not guard on data-dependent expression u0 > 0 "
                       "(Caused by: (distributions/distribution.py:70 in __init__))")
    assert _library_branch(own) == "__init__, distributions/distribution.py:70"


def test_a_decomposition_that_branches_on_values_is_a_code_error_not_torchs_exception():
    """torch.take of a 0-d tensor: torch's own decomposition guards on an index value while the
    exported graph is decomposed; that escaped as torch's GuardOnDataDependentSymNode."""
    import torch

    from emmy.errors import CodeError

    with pytest.raises(CodeError, match="data-dependent control flow"):
        emmy.optimize(lambda x, i: torch.take(x, i), torch.tensor(3.0), torch.tensor(0))


def test_torch_functions_that_test_values_are_captured_through_stand_ins():
    """torch.cov, Tensor.corrcoef and F.gaussian_nll_loss test their inputs' values while they
    compute, which a traced program cannot; emmy captures stand-ins with torch's values (checked
    against torch's own functions) and puts torch's back afterwards."""
    originals = (torch.cov, torch.Tensor.corrcoef, F.gaussian_nll_loss)
    program = emmy.optimize("x=torch.randn(3,7); v=torch.rand(4,1); a=torch.randn(4,5); "
                            "(torch.cov(x), torch.cov(x[0], correction=0), x.T.corrcoef(), "
                            "F.gaussian_nll_loss(a, a.flip(0), v + 0.1, full=True), "
                            "nn.GaussianNLLLoss(reduction='none', eps=0.2)(a, a * 2, v[:, 0]))")
    check_against_torch(program)

    class Whitening(torch.nn.Module):
        def forward(self, z):
            return torch.cov(z.T).diagonal().sum()

    check_against_torch(emmy.optimize(Whitening(), torch.randn(16, 5)))
    assert (torch.cov, torch.Tensor.corrcoef, F.gaussian_nll_loss) == originals


def test_combinations_capture_as_a_constant_table_of_positions():
    """torch.combinations masks a grid (masked_select: torch.export fails with a pending unbacked
    symbol); the stand-in gathers by a table of positions, in torch's order."""
    from emmy.capture.substitutes import combinations

    for n, r, with_replacement in [(6, 2, False), (5, 3, True), (3, 4, False), (4, 0, False), (1, 2, True)]:
        x = torch.randn(n)
        assert torch.equal(combinations(x, r, with_replacement), torch.combinations(x, r, with_replacement))
    original = torch.combinations
    program = emmy.optimize("a=torch.randn(6); b=torch.randint(0, 9, (4,)); "
                            "(torch.combinations(a), torch.combinations(b, 3, with_replacement=True).prod(-1))")
    check_against_torch(program)
    assert torch.combinations is original


def test_a_policy_s_distributions_capture_without_value_validation():
    """An RL policy's Categorical and Normal validate their arguments with an `if` by default;
    capture turns the default off (and back on), so log_prob and entropy compile."""
    from torch.distributions import Categorical, Distribution, Normal

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6, 4)
            self.log_std = torch.nn.Parameter(torch.full((2,), -0.5))

        def forward(self, obs, action, move):
            logits = self.net(obs)
            choice, spread = Categorical(logits=logits), Normal(logits[:, :2], self.log_std.exp())
            return choice.log_prob(action), choice.entropy(), spread.log_prob(move).sum(-1), spread.entropy().sum(-1)

    validating = Distribution._validate_args
    program = emmy.optimize(Policy(), torch.randn(5, 6), torch.randint(0, 4, (5,)), torch.randn(5, 2))
    check_against_torch(program)
    assert Distribution._validate_args == validating


def _draw_noise(x):
    return x + torch.randn(x.shape)  # marker: helper's draw


class NoisyLayers(torch.nn.Module):
    """An op made in a helper a forward calls, and one made inside a `with torch.no_grad():` block
    (which torch.export wraps in a grad-mode region whose ops lost their lines when decomposed)."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where

    def forward(self, x):
        if self.where == "helper":
            return _draw_noise(x.relu())
        with torch.no_grad():
            y = x.relu() * torch.rand(x.shape)  # marker: no_grad draw
        return y + 1


@pytest.mark.parametrize("where, marker", [("helper", "helper's draw"), ("no_grad", "no_grad draw")])
def test_an_unsupported_op_in_a_helper_or_a_no_grad_block_names_its_own_line(where, marker):
    with pytest.raises(emmy.EmmyError) as refused:
        emmy.optimize(NoisyLayers(where), torch.randn(3))
    assert f"{__file__}:{_line_of('marker: ' + marker)}:" in str(refused.value), str(refused.value)


def test_a_statement_written_over_several_lines_is_named_whole():
    """A branch on values in the second line of a multi-line `if (...)` was shown as its first line
    alone (`if (mask is not None`), which names the wrong test; a call split over lines lost its
    arguments. The statement is shown whole, as one line."""
    from emmy.errors import CodeError

    def gate(x, mask):
        if (
            mask is not None
            and (mask.sum() > 0)
        ):
            return x * mask
        return x

    with pytest.raises(CodeError) as refused:
        emmy.optimize(gate, torch.randn(3), torch.ones(3))
    assert "`if mask is not None and mask.sum() > 0:`" in str(refused.value), str(refused.value)
    code = "x = torch.randn(4)\ny = torch.where(x > 0,\n                x, x.max().item())  # a read\ny"
    with pytest.raises(emmy.EmmyError, match=r"line 3: `y = torch\.where\(x > 0, x, x\.max\(\)\.item\(\)\)`"):
        emmy.optimize(code)


def test_a_statement_too_long_to_quote_is_named_by_its_own_line():
    """An op inside a long statement over many lines (a table of lambdas) was quoted as the
    statement's first 200 characters, which show its start and not the op; its own line is quoted."""
    code = "\n".join([
        "x = torch.randn(4)",
        "table = {",
        *[f"    'op{i}': lambda v: v + {i},  # a filler entry long enough" for i in range(8)],
        "    'bad': lambda v: torch.frexp(v)[0],",
        "}",
        "table['bad'](x)",
    ])
    with pytest.raises(emmy.EmmyError, match=r"line 11: `'bad': lambda v: torch\.frexp\(v\)\[0\],`"):
        emmy.optimize(code)
