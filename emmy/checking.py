"""Compare emmy's results with PyTorch's, with per-dtype tolerances.

Every program is judged against a float64 reference: the same captured
program run by torch on inputs widened to float64. Half-precision results
get tolerances about one part in 100 (f16) or 50 (bf16), as a kernel that
keeps f32 accumulators should meet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from emmy.dtypes import DType

# (rtol, atol): PyTorch's defaults for f32; about one part in 100 (f16) or 50 (bf16).
TOLERANCES = {DType.F32: (1.3e-6, 1e-5), DType.F16: (1e-2, 1e-2), DType.BF16: (2e-2, 2e-2)}


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float
    ok: bool


def compare(actual: np.ndarray, expected: np.ndarray, dtype: DType, accumulated: int = 1) -> Comparison:
    """`accumulated`: the longest sequential fold behind the values (a kernel that sums K terms one
    after another in f32 drifts from the float64 reference like a random walk of K roundings), so the
    tolerances grow as sqrt(K) beyond 16 terms; numpy's pairwise sums need no such allowance."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return Comparison(float("inf"), float("inf"), False)
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    scale = max(1.0, float(np.sqrt(accumulated / 16)))
    rtol, atol = rtol * scale, atol * scale
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(a) & (a == e)
    diff = np.where(both_nan | same_inf, 0.0, np.abs(a - e))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.abs(e))
    ok = bool(np.all(diff <= atol + rtol * np.abs(np.where(same_inf | both_nan, 0.0, e))))
    max_abs = float(np.nanmax(diff)) if diff.size else 0.0
    max_rel = float(np.nanmax(rel)) if rel.size else 0.0
    return Comparison(max_abs, max_rel, ok)


def reference_outputs(captured, inputs=None) -> list:
    """The captured program run by torch in float64 (floating inputs and weights widened).

    The exported graph is run op by op with torch's own kernels, so the
    reference does not depend on any of emmy's decompositions.
    """
    import torch

    program = captured.exported
    given = list(inputs if inputs is not None else captured.example_inputs)
    args = []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            value = given.pop(0)
        elif spec.target in program.state_dict:
            value = program.state_dict[spec.target]
        else:
            value = program.constants[spec.target]
        args.append(value.double() if value.is_floating_point() else value)
    with torch.no_grad():
        results = _without_dtype_asserts(program.graph_module)(*args)
    results = list(results) if isinstance(results, (tuple, list)) else [results]
    kinds = [spec.kind.name for spec in program.graph_signature.output_specs]
    return [r.detach().double().numpy() for r, kind in zip(results, kinds) if kind == "USER_OUTPUT"]


def _without_dtype_asserts(graph_module):
    """A copy of the graph without export's dtype assertions, which widening would trip."""
    import copy

    import torch

    module = copy.deepcopy(graph_module)
    for node in list(module.graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            module.graph.erase_node(node)
    module.recompile()
    return module
