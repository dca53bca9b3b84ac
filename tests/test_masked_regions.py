"""Masked selections computed in place (emmy.decompose.masked_regions): `out[mask] = f(a[mask])` and
reductions of `x[mask]` run at the mask's shape, checked against eager torch in the simulator under
ASan; selections whose size the program needs stay refused."""

import pytest
import torch
import torch.nn.functional as F

import emmy
from emmy.capture import capture
from emmy.decompose.masked_regions import masked_regions


def overlap_and_union(boxes, others):
    """The intersection-over-union terms of box regression losses (torchvision's IoU losses compute
    them so): the overlap written only where the boxes overlap."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    u1, v1, u2, v2 = others.unbind(-1)
    left, top, right, bottom = torch.max(x1, u1), torch.max(y1, v1), torch.min(x2, u2), torch.min(y2, v2)
    overlap = torch.zeros_like(x1)
    meets = (bottom > top) & (right > left)
    overlap[meets] = (right[meets] - left[meets]) * (bottom[meets] - top[meets])
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - overlap
    return overlap, 1 - overlap / union


def masked_losses(pred, target):
    """A regression loss over the labelled entries only (-100: no label), as segmentation and
    token-level code writes it, with its largest error and a column sum kept as (1, n)."""
    labelled = target != -100
    return (F.mse_loss(pred[labelled], target[labelled].float()), (pred[labelled] - target[labelled]).abs().max(),
            pred[labelled].sum(dim=0, keepdim=True))


def selected_rows(boxes, scores):
    """A mask over the leading axis of (n, 4) boxes: the selected rows keep their trailing axis."""
    keep = scores > 0.3
    return (boxes[keep] * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum(0), boxes[keep].mean(), scores[keep].sum()


def written_back(x, y):
    out = x.clone()
    out[y > 0] = y[y > 0] * 2
    added = x.clone().index_put_((y > 1,), y[y > 1].exp(), accumulate=True)
    x = x.clone()
    x[x < 0] += 1  # index_put(x, [m], x[m] + 1)
    return out, x, added


def objectness(pred, obj):
    """YOLO-style: the positive anchors' boxes and confidences, selected by a mask over three axes."""
    positive = obj > 0.5
    return pred[..., :2][positive].sigmoid().sum(), (pred[..., 4][positive] - 1).pow(2).mean()


def integers_and_halves(a, h):
    return a[a > 3].sum(), a[a % 2 == 0].amin(), h[h > 0].mean(), h[h > 0].sum()


def nothing_selected(x):
    return x[x > 100].mean(), x[x > 100].sum()  # NaN (0 / 0) and 0, as torch


torch.manual_seed(0)
_BOXES = torch.rand(6, 4) * 10
_BOXES[:, 2:] += _BOXES[:, :2] + 1

CASES = {
    "overlap_and_union": (overlap_and_union, (_BOXES, _BOXES.flip(0))),
    "masked_losses": (masked_losses, (torch.randn(3, 5), torch.where(torch.rand(3, 5) > 0.3,
                                                                     torch.randint(0, 4, (3, 5)), -100))),
    "selected_rows": (selected_rows, (torch.randn(7, 4), torch.rand(7))),
    "written_back": (written_back, (torch.randn(5, 6), torch.randn(5, 6))),
    "objectness": (objectness, (torch.randn(2, 3, 4, 5), torch.rand(2, 3, 4))),
    "integers_and_halves": (integers_and_halves, (torch.randint(0, 9, (5, 5)), torch.randn(40).half())),
    "nothing_selected": (nothing_selected, (torch.randn(6),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_masked_region_runs_right_in_the_simulator(name):
    function, inputs = CASES[name]
    program = emmy.optimize(function, *inputs)
    want = function(*inputs)
    for got, expected in zip(program(*inputs, sim_mode="asan"), want):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, equal_nan=True, atol=1e-5, rtol=1e-4)


def test_the_region_is_planned_from_its_selections_to_its_sinks():
    captured = capture(overlap_and_union, _BOXES, _BOXES.flip(0))
    graph = captured.exported.graph
    regions = masked_regions(graph)
    targets = {n.name: str(n.target) for n in graph.nodes}
    assert {targets[n] for n in regions.selections} == {"aten.index.Tensor"} and len(regions.selections) == 4
    assert [targets[n] for n in regions.sinks] == ["aten.index_put.default"]
    assert {targets[n] for n in regions.computed} == {"aten.sub.Tensor", "aten.mul.Tensor"}
    assert {"aten.sym_size.int", "aten._assert_scalar.default"} <= {targets[n] for n in regions.dropped}
    assert set(regions.shapes.values()) == {(6,)}  # computed at the mask's shape


@pytest.mark.parametrize("function", [lambda x: x[x > 0], lambda x: x[x > 0].reshape(-1, 1).sum(0),
                                      lambda x: x[x > 0].sum() / x[x > 0].numel()],
                         ids=["returned", "reshaped", "size_as_a_number"])
def test_a_selection_whose_size_the_program_needs_is_still_refused(function):
    with pytest.raises(emmy.EmmyError, match="depends on tensor values|branches or loops on tensor values"):
        emmy.optimize(function, torch.randn(6), stop_after="tensor")
