"""torch's multi-tensor ops (emmy.capture.foreach), each spelled as its per-tensor op: checked in
eager torch against the op itself over the overloads optimizers use."""

import pytest
import torch

from emmy.capture.foreach import foreach_decompositions

aten = torch.ops.aten


def _lists(count=3):
    torch.manual_seed(0)
    shapes = [(4, 3), (5,), ()][:count]
    return ([torch.rand(s) + 0.5 for s in shapes], [torch.rand(s) + 0.5 for s in shapes],
            [torch.rand(s) + 0.5 for s in shapes])


CALLS = {
    "add.Scalar": lambda a, b, c: (a, 2.5),
    "add.List": lambda a, b, c: (a, b),
    "add.List_alpha": lambda a, b, c: ((a, b), {"alpha": -0.3}),
    "add.ScalarList": lambda a, b, c: (a, [0.5, -1.0, 2.0]),
    "add.Tensor": lambda a, b, c: ((a, torch.tensor(1.5)), {"alpha": 2.0}),
    "sub.List": lambda a, b, c: (a, b),
    "mul.Scalar": lambda a, b, c: (a, 0.9),
    "mul.Tensor": lambda a, b, c: (a, torch.tensor(0.7)),
    "mul.ScalarList": lambda a, b, c: (a, [0.1, 0.2, 0.3]),
    "div.List": lambda a, b, c: (a, b),
    "div.Scalar": lambda a, b, c: (a, 3.0),
    "pow.Scalar": lambda a, b, c: (a, 2.0),
    "pow.List": lambda a, b, c: (a, b),
    "pow.ScalarAndTensor": lambda a, b, c: (0.9, a),
    "maximum.List": lambda a, b, c: (a, b),
    "minimum.Scalar": lambda a, b, c: (a, 0.8),
    "maximum.ScalarList": lambda a, b, c: (a, [0.6, 0.9, 1.2]),
    "clamp_min.Scalar": lambda a, b, c: (a, 0.9),
    "clamp_max.List": lambda a, b, c: (a, b),
    "lerp.Scalar": lambda a, b, c: (a, b, 0.1),
    "lerp.List": lambda a, b, c: (a, b, c),
    "addcmul.Scalar": lambda a, b, c: (a, b, c, 0.5),
    "addcmul.ScalarList": lambda a, b, c: (a, b, c, [0.5, 1.0, -2.0]),
    "addcdiv.Scalar": lambda a, b, c: (a, b, c, -0.01),
    "addcdiv.Tensor": lambda a, b, c: (a, b, c, torch.tensor([0.5, 1.0, -2.0])),
    "sqrt.default": lambda a, b, c: (a,),
    "reciprocal.default": lambda a, b, c: (a,),
    "neg.default": lambda a, b, c: (a,),
    "sign.default": lambda a, b, c: ([t - 1 for t in a],),
    "exp.default": lambda a, b, c: (a,),
    "norm.Scalar": lambda a, b, c: (a, 2),
    "norm.Scalar_inf": lambda a, b, c: (a, float("inf")),
    "max.default": lambda a, b, c: (a,),
    "zero.default": lambda a, b, c: (a,),
    "copy.default": lambda a, b, c: (a, b),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_each_foreach_op_is_its_per_tensor_op_tensor_by_tensor(call):
    table = foreach_decompositions()
    name, overload = call.split(".")
    overload = overload.split("_")[0] if overload.startswith(("List_", "Scalar_")) else overload
    op = getattr(getattr(aten, f"_foreach_{name}"), overload)
    made = CALLS[call](*_lists())
    args, kwargs = made if isinstance(made[-1], dict) else (made, {})
    want = op(*args, **kwargs)
    got = table[op](*args, **kwargs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_every_functional_foreach_op_has_a_decomposition():
    names = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("aten::_foreach_") and not s.name.endswith("_")}
    covered = {str(op).split(".")[1] for op in foreach_decompositions()}
    assert names - covered <= {"_foreach_powsum", "_foreach_mm"}
