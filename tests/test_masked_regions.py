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


class MaskedTokenHead(torch.nn.Module):
    """A masked-LM style head: the labelled tokens of (batch, time) hidden states (a 2-D mask)
    through a linear layer into cross entropy, and a softmax's peak over them."""

    def __init__(self):
        super().__init__()
        self.head, self.other = torch.nn.Linear(6, 5), torch.nn.Linear(6, 5, bias=False)

    def forward(self, hidden, labels):
        labelled = labels != -100
        return (F.cross_entropy(self.head(hidden[labelled]), labels[labelled]),
                self.other(hidden[labelled]).softmax(-1).amax(-1).sum())


def active_tokens(logits, labels, attention):
    """Token classification as HF's older heads compute it: flattened, then the attended tokens."""
    active = attention.view(-1) == 1
    return F.cross_entropy(logits.view(-1, logits.shape[-1])[active], labels.view(-1)[active])


def ignored_minus_one(logits, labels):
    """Labels of -1 left out by a mask, not by ignore_index: the unselected rows' labels are no class,
    and a gather computed on every row must not read at them."""
    kept = labels >= 0
    return (F.cross_entropy(logits[kept], labels[kept], label_smoothing=0.1),
            F.nll_loss(logits[kept].log_softmax(1), labels[kept], reduction="sum"))


def normalized_rows(x, score):
    rows = x[score > 0]
    return (rows / rows.sum(-1, keepdim=True)).amax(1).mean()


class SparseMixture(torch.nn.Module):
    """Mixtral's dispatch (HF's sparse MoE block): each expert's tokens found by torch.where on the
    routing mask, run through it, weighted and index_add_-ed back."""

    def __init__(self, experts: int = 4, top: int = 2, width: int = 8):
        super().__init__()
        self.top, self.experts_count = top, experts
        self.gate = torch.nn.Linear(width, experts, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.SiLU(),
                                                               torch.nn.Linear(16, width)) for _ in range(experts))

    def forward(self, x):
        batch, steps, width = x.shape
        x = x.view(-1, width)
        weights, chosen = torch.topk(F.softmax(self.gate(x), dim=1, dtype=torch.float), self.top, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros((batch * steps, width), dtype=x.dtype)
        routed = F.one_hot(chosen, num_classes=self.experts_count).permute(2, 1, 0)
        for e in range(self.experts_count):
            slot, token = torch.where(routed[e])
            y = self.experts[e](x[None, token].reshape(-1, width)) * weights[token, slot, None]
            out.index_add_(0, token, y.to(x.dtype))
        return out.reshape(batch, steps, width)


def labels_as_positions(table, labels, values):
    """Selected labels used as positions: an embedding of them and an index_add at them. The labels
    not selected (-100) are no positions; computed in place, they must not be read at."""
    kept = labels != -100
    out = torch.zeros(5, 3).index_add_(0, labels[kept], values[kept])
    return table[labels[kept]].sum(0), out


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
    "masked_token_head": (MaskedTokenHead().eval(), (torch.randn(2, 4, 6), torch.tensor([[1, -100, 3, 0],
                                                                                          [-100, 4, 2, -100]]))),
    "active_tokens": (active_tokens, (torch.randn(2, 4, 5), torch.randint(0, 5, (2, 4)),
                                      torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]))),
    "ignored_minus_one": (ignored_minus_one, (torch.randn(6, 5), torch.tensor([1, -1, 3, 0, -1, 4]))),
    "normalized_rows": (normalized_rows, (torch.rand(5, 4) + 0.1, torch.randn(5))),
    "sparse_mixture": (SparseMixture().eval(), (torch.randn(2, 6, 8),)),
    "labels_as_positions": (labels_as_positions, (torch.randn(5, 3), torch.tensor([4, -100, 0, 2, -100, 4]),
                                                  torch.randn(6, 3))),
    "one_expert_each": (SparseMixture(experts=8, top=1).eval(), (torch.randn(1, 7, 8),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_masked_region_runs_right_in_the_simulator(name):
    function, inputs = CASES[name]
    program = emmy.optimize(function, *inputs)
    with torch.no_grad():
        want = function(*inputs)
    got_all = program(*inputs, sim_mode="asan")
    pairs = zip(got_all, want) if isinstance(want, tuple) else [(got_all, want)]
    for got, expected in pairs:
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


def test_ops_along_the_selected_rows_are_planned_row_wise():
    """A linear layer, log_softmax and the label gather of cross entropy treat the selected axis as a
    batch axis: computed at the mask's shape, their axes moved past the mask's two."""
    captured = capture(MaskedTokenHead().eval(), torch.randn(2, 4, 6), torch.tensor([[1, -100, 3, 0], [0, 4, 2, 1]]))
    graph = captured.exported.graph
    regions = masked_regions(graph)
    targets = {n.name: str(n.target) for n in graph.nodes}
    assert {"aten.addmm.default", "aten.mm.default", "aten._log_softmax.default", "aten.gather.default"} <= \
        {targets[n] for n in regions.row_wise}
    assert set(regions.row_wise.values()) == {2}


@pytest.mark.parametrize("function", [lambda x: x[x > 0], lambda x: x[x > 0].cumsum(0).sum(),
                                      lambda x: x[x > 0].sum() / x[x > 0].numel(),
                                      lambda x: x[x > 0].sort()[0].sum()],
                         ids=["returned", "scanned_along_the_selection", "size_as_a_number", "sorted: a tuple"])
def test_a_selection_whose_size_the_program_needs_is_still_refused(function):
    with pytest.raises(emmy.EmmyError, match="depends on tensor values|branches or loops on tensor values"):
        emmy.optimize(function, torch.randn(6), stop_after="tensor")


def test_a_mixture_s_dispatch_is_planned_as_coordinates_of_its_routing_mask():
    captured = capture(SparseMixture(experts=2).eval(), torch.randn(1, 5, 8))
    graph = captured.exported.graph
    regions = masked_regions(graph)
    targets = {n.name: str(n.target) for n in graph.nodes}
    assert [targets[n] for n in regions.coordinates] == ["aten.nonzero.default"] * 2
    assert [targets[n] for n in regions.sinks] == ["aten.index_put.default"] * 2
    assert {(2, 5)} == {regions.shapes[n][:-1] for n in regions.coordinates}  # (top, tokens), then the rank
    # the slot and token columns are positions everywhere: read at without masking
    assert {targets[n] for n in regions.positions} == {"aten.slice.Tensor", "aten.squeeze.dims"}


def test_coordinates_whose_rows_the_program_needs_are_still_refused():
    # written without accumulating, they are emmy.capture.value_sized's (tests/test_value_sized.py)
    with pytest.raises(emmy.EmmyError, match="depends on tensor values"):
        emmy.optimize(lambda x: torch.nonzero(x > 0), torch.randn(6), stop_after="tensor")


def test_a_product_of_the_selected_rows_by_another_selection_is_still_refused():
    """mm's second operand selected too (rows times rows) is no batch product: refused."""
    with pytest.raises(emmy.EmmyError, match="depends on tensor values"):
        emmy.optimize(lambda x: (x[x[:, 0] > 0] @ x[x[:, 0] > 0].T).sum(), torch.randn(5, 5), stop_after="tensor")
