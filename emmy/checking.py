"""Compare emmy's results with PyTorch's: an oracle that follows the problem's conditioning.

Every program is judged against a float64 reference: the same captured program run by torch on
inputs widened to float64. A value's tolerance scales with the magnitude of the terms that made
it, not with the value itself: the program run in float64 on the absolute values of its inputs
and weights gives, for a sum or a dot product, the sum of the absolute terms, which is what error
analysis bounds rounding by (a large dot product that cancels to a small value may differ from
float64 by far more than that value's own ulps). Half-precision results get about one part in 100
(f16) or 50 (bf16) of that scale, f32 results PyTorch's f32 tolerances of it, growing as the square
root of the longest sequential fold.

A result also passes when its largest error is no more than FACTOR times torch's own error in the
same dtype (the program run by torch as captured), which both are judged against; and it fails,
whatever its size, when its errors lean one way: a mean signed error of a quarter of an ulp or
more over many outputs, far beyond what rounding noise and torch's own lean allow (a planted
one-ulp bias on every output of a long sum is not rounding). Without torch's own result there is
no lean to measure against, and no lean test.

Outputs that share a reduced value share its rounding: a softmax row's outputs all divide by one
sum, so one rounding of that sum moves the whole row the same way. The noise a mean error is held
against is therefore measured over groups of outputs as well as over single ones: per output axis
and per run of leading or trailing axes, the spread of the groups' means (`_noise`). Over 64 rows
the shared roundings alone make a mean of a few tenths of an ulp of either sign; a lean is a mean
that every grouping finds far beyond its spread. A scan's outputs share more: each one's error is
the one before's plus a rounding, so along the scanned axis the errors walk and their mean wanders
by ulps; where neighbouring errors are that alike, the walk's spread is the noise (`_walk_noise`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from emmy.dtypes import DType, real_pairs

# (rtol, atol): PyTorch's defaults for f32; about one part in 100 (f16) or 50 (bf16). f64 results
# meet a reference of their own precision, so theirs is some thousands of f64 ulps (torch.testing
# allows 1e-7): a step computed in f32 anywhere (1e-7 of the scale) is still far outside it.
TOLERANCES = {DType.F64: (1e-12, 1e-12), DType.F32: (1.3e-6, 1e-5), DType.F16: (1e-2, 1e-2),
              DType.BF16: (2e-2, 2e-2)}
FACTOR = 4.0  # no worse than this many times torch's own error passes
BIAS_ULPS = 0.25  # a mean signed error beyond this many ulps, when significant, is a lean
BIAS_SAMPLES = 64  # outputs needed before a lean can be told from noise
LEAN_SAMPLE = 1 << 20  # a lean is measured on at most this many outputs, evenly strided (its noise shrinks as
# 1/sqrt(n): a million outputs tell a quarter-ulp lean apart as well as a billion, in a thousandth of the time)


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float  # largest error over the value's scale (the float64 run on absolute values)
    ok: bool
    torch_abs: float | None = None  # torch's own largest error in the same dtype, where known
    bias_ulps: float = 0.0  # mean signed error, in ulps of the output dtype
    why: str = ""  # what failed: "tolerance" (and not near torch's error) or "bias"


def compare(actual: np.ndarray, expected: np.ndarray, dtype: DType, accumulated: int = 1, scale=None,
            torch_actual=None) -> Comparison:
    """`accumulated`: the longest sequential fold behind the values (a sequential f32 sum of K terms
    drifts like a random walk of K roundings: tolerances grow as sqrt(K) beyond 16 terms).
    `scale`: the program's float64 result on absolute inputs (default: |expected|); `torch_actual`:
    torch's result in the program's own dtype."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return Comparison(float("inf"), float("inf"), False, why="shape")
    magnitude = np.abs(e)
    if scale is not None:
        s = np.abs(np.asarray(scale, dtype=np.float64)).reshape(e.shape)
        magnitude = np.where(np.isfinite(s), np.maximum(magnitude, s), magnitude)
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    growth = max(1.0, float(np.sqrt(accumulated / 16)))
    diff = _errors(a, e)
    exact = np.isnan(e) | np.isinf(e)
    ok_each = diff <= (atol + rtol * growth * np.where(exact, 0.0, magnitude))
    within = bool(np.all(ok_each))
    max_abs = float(np.max(diff)) if diff.size else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.where(magnitude > 0, magnitude, np.inf))
    max_rel = float(np.nanmax(rel)) if rel.size else 0.0
    torch_abs = None
    if torch_actual is not None:
        t = np.asarray(torch_actual, dtype=np.float64).reshape(e.shape)
        torch_abs = float(np.max(_errors(t, e))) if e.size else 0.0
    near_torch = torch_abs is not None and np.isfinite(max_abs) and max_abs <= FACTOR * torch_abs
    bias, leans = _lean(a, e, dtype, None if torch_actual is None else np.asarray(torch_actual, np.float64))
    ok = (within or bool(near_torch)) and not leans
    why = "" if ok else ("bias" if leans else "tolerance")
    return Comparison(max_abs, max_rel, ok, torch_abs, bias, why)


def _errors(a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """|a - e|, with NaN where both are NaN and equal infinities counted as no error."""
    with np.errstate(invalid="ignore"):  # inf - inf: fixed up below
        diff = np.abs(a - e)
    odd = ~np.isfinite(diff)  # few or none: the fix-ups touch only those
    if odd.any():
        both_nan = np.isnan(a[odd]) & np.isnan(e[odd])
        same_inf = np.isinf(a[odd]) & (a[odd] == e[odd])
        diff[odd] = np.where(both_nan | same_inf, 0.0, np.inf)
    return diff


def _ulps(e: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.F16:
        return np.spacing(np.abs(e).astype(np.float16)).astype(np.float64)
    spacing = np.spacing(np.abs(e).astype(np.float32)).astype(np.float64)
    return spacing * 65536 if dtype is DType.BF16 else spacing


def _lean(a: np.ndarray, e: np.ndarray, dtype: DType, t: np.ndarray | None) -> tuple[float, bool]:
    """(mean signed error in ulps, whether it is a lean no rounding explains)."""
    if dtype not in (DType.F32, DType.F16, DType.BF16) or t is None:
        return 0.0, False  # without torch's own lean to measure against, rounding cannot be told apart
    a, e, t = _structured_sample(a, e, np.asarray(t, np.float64).reshape(e.shape))
    keep = np.isfinite(a) & np.isfinite(e) & (e != 0)
    if int(keep.sum()) < BIAS_SAMPLES:
        return 0.0, False
    ulp = np.where(keep, _ulps(np.where(keep, e, 1.0), dtype), 1.0)
    z = np.where(keep, (a - e) / ulp, np.nan)
    mean = float(np.nanmean(z))
    theirs = abs(float(np.nanmean(np.where(keep, (t - e) / ulp, np.nan))))
    return mean, bool(abs(mean) > BIAS_ULPS and abs(mean) > 8 * _noise(z) and abs(mean) > 2 * theirs + 0.1)


def _structured_sample(a: np.ndarray, e: np.ndarray, t: np.ndarray) -> tuple:
    """At most about LEAN_SAMPLE outputs, taken by an even stride along the longest axes (so the
    sample keeps its axes, which `_noise` groups by)."""
    shape, steps = list(e.shape), [1] * e.ndim
    while int(np.prod(shape)) > LEAN_SAMPLE:
        axis = int(np.argmax(shape))
        step = min(shape[axis], max(2, -(-int(np.prod(shape)) // LEAN_SAMPLE)))
        steps[axis] *= step
        shape[axis] = -(-shape[axis] // step)
    index = tuple(slice(None, None, s) for s in steps)
    return a[index], e[index], t[index]


def _noise(z: np.ndarray) -> float:
    """The spread of the mean of `z` (NaN where not counted): the largest of the plain estimate
    (independent errors) and, for each grouping of the outputs (per axis, per run of leading or
    trailing axes), the spread of the groups' means over the root of their count. A rounding
    shared by a group's outputs shows in the second; a lean, the same in every group, in neither."""
    counted = int(np.sum(~np.isnan(z)))
    noises = [float(np.nanstd(z)) / np.sqrt(counted)]
    rank = z.ndim
    groupings = {(axis,) for axis in range(rank)} | {tuple(range(k, rank)) for k in range(1, rank)} | \
        {tuple(range(k)) for k in range(1, rank)}
    for axes in groupings:
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a group with nothing counted: its mean is NaN
            means = np.nanmean(z, axis=axes)
        means = means[~np.isnan(means)]
        if means.size >= 2:
            noises.append(float(np.std(means, ddof=1)) / np.sqrt(means.size))
    noises += [_walk_noise(z, axis) for axis in range(rank) if z.shape[axis] >= WALK_FROM]
    return max(noises)


WALK_FROM = 32  # outputs along an axis before its errors can be seen to walk (independent errors: alike ~ 0 +- 0.18)
WALK_CORRELATION = 0.5  # neighbours' errors this alike along an axis: they accumulate (a scan)


def _walk_noise(z: np.ndarray, axis: int) -> float:
    """The spread of the mean of `z` when its errors walk along `axis`, as a scan's do (each output's
    error is the one before's plus a rounding: cumsum, cumprod): the mean of an n-step walk spreads
    as a step times the root of n / 3, over the root of the walks' count. 0 where neighbours' errors
    are not alike (independent errors, or a lean the same everywhere: its rows' means are removed
    first), so a planted lean is still caught."""
    n = z.shape[axis]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        centred = z - np.nanmean(z, axis=axis, keepdims=True)
        later, earlier = np.take(centred, range(1, n), axis), np.take(centred, range(n - 1), axis)
        alike = float(np.nansum(later * earlier)) / max(float(np.nansum(centred * centred)), 1e-300)
        if alike < WALK_CORRELATION:
            return 0.0
        step = float(np.nanstd(np.diff(z, axis=axis)))
    return step * np.sqrt(n / 3) / np.sqrt(max(z.size // n, 1))


def reference_outputs(captured, inputs=None, mode: str = "float64", device: str = "cpu") -> list:
    """The captured program run by torch: `float64` (floating inputs and weights widened: the
    reference), `absolute` (widened and made non-negative: each value's scale, the magnitude of the
    terms it sums) or `native` (as captured, in its own dtypes: torch's own rounding).

    The exported graph is run op by op with torch's own kernels, so the
    reference does not depend on any of emmy's decompositions. `device`: where torch runs it
    ("cuda" on a GPU machine: a large program's float64 reference in seconds, not minutes).
    """
    if mode == "native":
        try:
            return _run_reference(captured, inputs, mode, device)
        except (NotImplementedError, RuntimeError) as err:
            if "not implemented for" not in str(err):
                raise
            # torch has no CPU kernel for a half type here (cdist in f16): its own result is then taken
            # as float32 math rounded to the outputs' dtypes, as a GPU kernel would compute it
            return _run_reference(captured, inputs, "float32", device)
    return _run_reference(captured, inputs, mode, device)


def _run_reference(captured, inputs, mode: str, device: str) -> list:
    import torch
    from torch.utils import _pytree

    program = captured.exported
    # nested inputs (an LSTM cell's (h, c)) in torch.export's order, flags (bools: constants of the
    # exported program) left out, as emmy.capture.flat_inputs gives them
    fixed_ints = getattr(captured, "fixed_ints", False)  # ints are constants too (emmy.capture.is_flag)
    given = [leaf for leaf in _pytree.tree_leaves(list(inputs if inputs is not None else captured.example_inputs))
             if not (isinstance(leaf, bool) or (fixed_ints and type(leaf) is int))]
    args = []
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT" and type(spec.arg).__name__ == "ConstantArgument":
            args.append(spec.arg.value)  # a flag torch.export made a constant (emmy.capture.flags_of)
            continue
        if spec.kind.name == "USER_INPUT":
            value = given.pop(0)
        elif spec.target in program.state_dict:
            value = program.state_dict[spec.target]
        else:
            value = program.constants[spec.target]
        if value.is_floating_point() and mode == "float32":
            value = value.float()
        elif value.is_floating_point() and mode != "native":
            value = value.double().abs() if mode == "absolute" else value.double()
        elif value.is_complex() and mode not in ("native", "float32"):  # a complex weight, widened alike
            value = value.to(torch.complex128)
            value = torch.complex(value.real.abs(), value.imag.abs()) if mode == "absolute" else value
        args.append(value.to(device))
    widened = {"float32": torch.float32, "native": None}.get(mode, torch.float64)
    with torch.no_grad():
        results = _without_dtype_asserts(program.graph_module, widened).to(device)(*args)
    results = list(results) if isinstance(results, (tuple, list)) else [results]
    specs = program.graph_signature.output_specs
    if mode == "float32":  # rounded to the dtypes the program's outputs have
        nodes = [n for n in program.graph.nodes if n.op == "output"][0].args[0]
        results = [r.to(node.meta["val"].dtype) if hasattr(node, "meta") and "val" in node.meta else r
                   for r, node in zip(results, nodes)]
    # a complex result as the pairs emmy computes it as
    return [real_pairs(r).double().cpu().numpy() for r, spec in zip(results, specs) if spec.kind.name == "USER_OUTPUT"]


def torch_comparison(captured, inputs=None, device: str = "cpu") -> list[tuple]:
    """Per computed output: (float64 reference, scale from the absolute run, torch's own result).
    Outputs with no elements are left out: no kernel computes them (emmy.decompose.empty)."""
    return [row for row in zip(reference_outputs(captured, inputs, device=device),
                               reference_outputs(captured, inputs, "absolute", device),
                               reference_outputs(captured, inputs, "native", device)) if row[0].size]


# ops that make a tensor of a dtype they are given: widened with the inputs (a circular padding's
# float32 buffer, copied into, would meet float64 values)
_FACTORIES = ("empty.memory_format", "empty_permuted.default", "empty_strided.default", "full.default",
              "zeros.default", "ones.default", "arange.default", "arange.start", "arange.start_step",
              "scalar_tensor.default", "empty_like.default", "full_like.default", "zeros_like.default",
              "ones_like.default")


def _without_dtype_asserts(graph_module, widened=None):
    """A copy of the graph without export's dtype assertions, which widening would trip; with
    `widened` (a torch dtype), the floating tensors it makes itself are made in that dtype."""
    import copy

    import torch

    module = copy.deepcopy(graph_module)
    factories = {getattr(getattr(torch.ops.aten, name.split(".")[0]), name.split(".")[1]) for name in _FACTORIES}
    for node in list(module.graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            module.graph.erase_node(node)
        elif widened is not None and node.target in factories:
            dtype = node.kwargs.get("dtype")
            if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
                node.kwargs = {**node.kwargs, "dtype": widened}
    module.recompile()
    return module
