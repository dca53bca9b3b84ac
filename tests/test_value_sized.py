"""Value-sized selections kept at full size with a validity vector (emmy.capture.value_sized): graph
layers that drop and add edges before they aggregate compile once and run right, checked against
eager torch in the simulator under ASan, on edge lists with any number of dropped edges; programs
that need where the kept elements sit stay refused with their line."""

import pytest
import torch

import emmy
from emmy.capture import capture
from emmy.decompose.masked_regions import sized_by_values

NODES, EDGES = 6, 14


def _without_self_loops(edge_index):
    keep = edge_index[0] != edge_index[1]
    return edge_index[:, keep]


def _with_self_loops(edge_index, nodes):
    loops = torch.arange(nodes).view(1, -1).repeat(2, 1)
    return torch.cat([_without_self_loops(edge_index), loops], dim=1)


class GraphConvolution(torch.nn.Module):
    """Kipf and Welling's layer as torch_geometric's GCNConv computes it: self loops replaced by one
    per node, symmetric degree normalization, messages summed into their targets."""

    def __init__(self, features=5, out=4):
        super().__init__()
        self.linear = torch.nn.Linear(features, out)

    def forward(self, x, edge_index):
        edge_index = _with_self_loops(edge_index, x.shape[0])
        source, target = edge_index[0], edge_index[1]
        weight = torch.ones(edge_index.size(1))
        degree = torch.zeros(x.shape[0]).scatter_add(0, target, weight)
        norm = degree.pow(-0.5)
        norm = norm.masked_fill(norm == float("inf"), 0)
        weight = norm[source] * weight * norm[target]
        messages = self.linear(x).index_select(0, source) * weight.view(-1, 1)
        index = target.view(-1, 1).expand_as(messages)
        return torch.zeros(x.shape[0], messages.shape[1]).scatter_add(0, index, messages)


class GraphAttention(torch.nn.Module):
    """One attention head over the edges, self loops added: a softmax over each node's incoming
    edges, its maximum by scatter_reduce (amax, the node's own value left out)."""

    def __init__(self, features=5, out=4):
        super().__init__()
        self.linear = torch.nn.Linear(features, out, bias=False)
        self.source_score = torch.nn.Parameter(torch.randn(out))
        self.target_score = torch.nn.Parameter(torch.randn(out))

    def forward(self, x, edge_index):
        edge_index = _with_self_loops(edge_index, x.shape[0])
        source, target = edge_index[0], edge_index[1]
        h = self.linear(x)
        score = torch.nn.functional.leaky_relu((h * self.source_score).sum(-1)[source]
                                               + (h * self.target_score).sum(-1)[target], 0.2)
        top = torch.zeros(x.shape[0]).scatter_reduce(0, target, score, "amax", include_self=False)
        score = (score - top[target]).exp()
        total = torch.zeros(x.shape[0]).index_add(0, target, score)
        alpha = score / total[target]
        return torch.zeros_like(h).index_add(0, target, h[source] * alpha[:, None])


class EdgeHeads(torch.nn.Module):
    """Per-edge features of two heads through a linear layer (the edge axis merged with the heads'
    for the matrix product, then split back) and a layer norm, a batched product per edge, each
    head's largest channel and variance, and a sum over the edge and head axes merged."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(5, 4)

    def forward(self, x, edge_index):
        edge_index = _with_self_loops(edge_index, x.shape[0])
        h = torch.nn.functional.layer_norm(self.linear(torch.stack([x[edge_index[0]], x[edge_index[1]]], 1)), (4,))
        scores = torch.bmm(h, h.transpose(1, 2)).softmax(-1)
        messages = torch.bmm(scores, h).sum(1) * h.max(dim=-1).values[:, :1] + h.var(-1).mean(-1, keepdim=True)
        # summed over the merged axis: each head's row is valid where its edge is
        return torch.zeros(x.shape[0], 4).index_add(0, edge_index[1], messages), h.reshape(-1, 4).sum(0)


def padded_edges(x, edge_index, weight):
    """Edges padded to a fixed count with a node past the last, dropped before self loops are
    added: the padding's indices are out of range, and a read at them would leave the tensor."""
    real = edge_index[0] < x.shape[0]
    edge_index = torch.cat([edge_index[:, real], torch.arange(x.shape[0]).repeat(2, 1)], dim=1)
    weight = torch.cat([weight[real], torch.full((x.shape[0],), 0.5)])
    source, target = edge_index[0], edge_index[1]
    out = torch.zeros(x.shape[0], x.shape[1]).index_put((target,), x[source] * weight[:, None], accumulate=True)
    return out, weight.sum(), (weight * x[source, 0]).amax(), (weight * x[source, 1]).amin()


def laplacian_weights(x, edge_index):
    """ChebConv's scaled Laplacian: edge weights, one per kept edge and self loop, with the loops'
    weight lowered in place (`w[loop] = w[loop] - 1`: a selection of a selection written back)."""
    edge_index = _with_self_loops(edge_index, x.shape[0])
    weight = torch.cat([-torch.ones(edge_index.size(1) - x.shape[0]), torch.full((x.shape[0],), 2.0)])
    loop = edge_index[0] == edge_index[1]
    weight[loop] = weight[loop] - 1
    return torch.zeros(x.shape[0], x.shape[1]).index_add(0, edge_index[1], x[edge_index[0]] * weight[:, None])


def loop_weights(x, edge_index, weight):
    """GCNConv's edge weights with self loops: an existing loop's weight kept for its node (an
    index_put at the dropped edges' sources), every other node's loop weighing 1."""
    loop = edge_index[0] == edge_index[1]
    loop_weight = torch.ones(x.shape[0])
    loop_weight[edge_index[0][loop]] = weight[loop]
    weight = torch.cat([weight[~loop], loop_weight])
    edge_index = torch.cat([edge_index[:, ~loop], torch.arange(x.shape[0]).repeat(2, 1)], dim=1)
    return torch.zeros_like(x).index_add(0, edge_index[1], x[edge_index[0]] * weight[:, None])


def _edges(loops: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, NODES, (2, EDGES), generator=generator)
    edge_index[1, :loops] = edge_index[0, :loops]
    edge_index[1, loops:] = (edge_index[0, loops:] + 1 + edge_index[1, loops:] % (NODES - 1)) % NODES
    return edge_index


def _padded(count: int):
    """The last `count` edges padded (with NODES, one past the last node)."""
    edge_index = _edges(0, seed=count)
    edge_index[:, EDGES - count:] = NODES
    return edge_index


_X = torch.randn(NODES, 5, generator=torch.Generator().manual_seed(1))
_WEIGHT = torch.rand(EDGES, generator=torch.Generator().manual_seed(2))
torch.manual_seed(0)
_CASES = {
    "convolution": (GraphConvolution().eval(), lambda e: (_X, e), _edges),
    "attention": (GraphAttention().eval(), lambda e: (_X, e), _edges),
    "edge_heads": (EdgeHeads().eval(), lambda e: (_X, e), _edges),
    "padded": (padded_edges, lambda e: (_X, e, _WEIGHT), _padded),
    "laplacian": (laplacian_weights, lambda e: (_X, e), _edges),
    "loop_weights": (loop_weights, lambda e: (_X, e, _WEIGHT), _edges),
}


def _run(program, function, inputs):
    got = program(*inputs, sim_mode="asan")
    with torch.no_grad():
        want = function(*inputs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(_CASES))
def test_a_layer_that_drops_and_adds_edges_runs_right_for_any_count_dropped(name):
    function, inputs, edges = _CASES[name]
    program = emmy.optimize(function, *inputs(edges(3)))
    for count in (0, 3, 9, EDGES):  # none dropped ... every edge dropped
        _run(program, function, inputs(edges(count)))


def test_no_value_sized_shape_is_left_for_decomposition():
    captured = capture(GraphConvolution().eval(), _X, _edges(3))
    assert not any(sized_by_values(node.meta.get("val")) for node in captured.exported.graph.nodes)
    targets = [str(node.target) for node in captured.exported.graph.nodes]
    assert "aten.index.Tensor" in targets  # the degree gathered at each edge's ends, not a selection
    assert not any(t.startswith("aten.sym_size") or t == "aten._assert_scalar.default" for t in targets)


class SubsetUpdate(torch.nn.Module):
    """A layer applied to the rows a mask picks by their positions (`nonzero`, `torch.where`), written
    back by index_copy (twice, into one tensor) and by an index_put; and a 2-D mask's coordinates
    written at in two axes."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(5, 5)

    def forward(self, x, degree):
        copied = torch.zeros_like(x)
        for value in (2, 3):  # one write after another (MFConv's layer per degree)
            rows = (degree == value).nonzero().view(-1)
            copied = copied.index_copy(0, rows, self.linear(x.index_select(0, rows)) * value)
        out = x.clone()
        picked = torch.where(degree > 1)[0]
        out[picked] = self.linear(x[picked]).relu()
        i, j = torch.where(x > 0.5)
        added = torch.zeros_like(x).index_put((i, j), x[i, j] * 2, accumulate=True)
        written = torch.zeros_like(x)
        written[i, j] = x[i, j] + degree[i].float()
        return copied, out, added, written


@pytest.mark.parametrize("degree", [[0, 2, 2, 1, 3, 2], [0] * NODES, [2] * NODES])
def test_rows_picked_by_their_positions_run_right_for_any_count_picked(degree):
    torch.manual_seed(0)
    layer = SubsetUpdate().eval()
    program = emmy.optimize(layer, _X, torch.tensor([0, 2, 2, 1, 3, 2]))
    for x in (_X, torch.zeros(NODES, 5), torch.ones(NODES, 5)):
        _run(program, layer, (x, torch.tensor(degree)))


def test_values_selected_by_a_mask_written_at_its_coordinates_run_right():
    """The k-th True position gets the k-th selected value: at full size, each position its own."""
    def written(x):
        return torch.zeros(6).index_put((torch.where(x > 0)[0],), x[x > 0] * 2)

    program = emmy.optimize(written, torch.randn(6))
    for x in (torch.randn(6), -torch.ones(6), torch.ones(6)):
        _run(program, written, (x,))


def _written_under_twin_masks(x):
    """`x[:, 0] > 0` written three times: three selections, one count."""
    out = torch.zeros(6)
    kept = torch.cat([x[:, 1][x[:, 0] > 0], torch.ones(1)])
    out[x[:, 0] > 0] = x[:, 1][x[:, 0] > 0] * 2
    return torch.zeros(3).index_add(0, (kept > 1).long(), kept), out


def test_selections_by_masks_computed_alike_share_one_count():
    program = emmy.optimize(_written_under_twin_masks, torch.randn(6, 2))
    for seed in range(3):
        _run(program, _written_under_twin_masks, (torch.randn(6, 2, generator=torch.Generator().manual_seed(seed)),))


def _means_of_kept_rows(x):
    kept = torch.cat([x[x[:, 0] > 0], x[:2]])
    return kept.mean(0), (kept ** 2).mean(), kept.mean(0, keepdim=True)


def test_a_mean_over_the_kept_elements_divides_by_their_count():
    program = emmy.optimize(_means_of_kept_rows, torch.randn(6, 3))
    for x in (torch.randn(6, 3), -torch.ones(6, 3), torch.ones(6, 3)):  # some, none, all kept
        _run(program, _means_of_kept_rows, (x,))


def _writes_under_another_mask(x, edge_index):
    out = torch.zeros(x.shape[0])
    out[x[:, 0] > 0] = x[:, 1][x[:, 1] > 0]
    kept = torch.cat([x[:, 1][x[:, 1] > 0], torch.ones(1)])
    return torch.zeros(3).index_add(0, (kept > 1).long(), kept), out


def _returns_the_selection(x, edge_index):
    return _without_self_loops(edge_index).float().sum(0)


def _counts_as_a_value(x, edge_index):
    kept = _without_self_loops(edge_index)
    return x * kept.size(1)


def _numbers_the_kept_edges(x, edge_index):
    kept = _without_self_loops(edge_index)
    return torch.zeros(x.shape[0]).index_add(0, kept[0], torch.arange(kept.size(1)).float())


def _reverses_the_kept_edges(x, edge_index):
    kept = _without_self_loops(edge_index)
    return torch.zeros(x.shape[0]).index_add(0, kept[0].flip(0), x[kept[1], 0])


def _pairs_two_selections(x, edge_index):
    a, b = x[:, 0][x[:, 0] > 0], x[:, 1][x[:, 1] > 0]
    torch._check(a.shape[0] == b.shape[0])
    return torch.zeros(3).index_add(0, torch.zeros_like(a, dtype=torch.long), a * b)


def _checks_two_counts(x, edge_index):
    a, b = x[:, 0][x[:, 0] > 0], x[:, 1][x[:, 1] > 0]
    torch._check(a.shape[0] <= b.shape[0])  # eager raises where it fails: never dropped
    return torch.zeros(2).index_add(0, (a > 1).long(), a) + torch.zeros(2).index_add(0, (b > 1).long(), b)


def _checks_two_counts_then_adds(x, edge_index):
    a, b = x[:, 0][x[:, 0] > 0], x[:, 1][x[:, 1] > 0]
    torch._check(a.shape[0] <= b.shape[0])
    a, b = torch.cat([a, torch.ones(2)]), torch.cat([b, torch.ones(2)])  # a cat: emmy.capture.value_sized's
    return torch.zeros(2).index_add(0, (a > 1).long(), a) + torch.zeros(2).index_add(0, (b > 1).long(), b)


@pytest.mark.parametrize("function", [_returns_the_selection, _counts_as_a_value, _numbers_the_kept_edges,
                                      _reverses_the_kept_edges, _pairs_two_selections, _checks_two_counts,
                                      _checks_two_counts_then_adds, _writes_under_another_mask])
def test_a_program_that_needs_where_the_kept_elements_sit_is_still_refused(function):
    with pytest.raises(emmy.EmmyError, match="depends on tensor values|branches or loops on tensor values") as err:
        emmy.optimize(function, _X, _edges(3))
    assert "test_value_sized.py" in str(err.value)  # the line that made the selection


def test_a_size_holding_another_pass_count_is_refused_not_a_crash():
    import sympy

    from emmy.capture.value_sized_plan import Refused, _Planner

    ours, theirs = sympy.Symbol("u0"), sympy.Symbol("u1")
    planner = _Planner(torch.fx.Graph(), frozenset())
    planner.plan.dense[ours] = 30
    assert planner.dense(ours + 10) == 40 and planner.dense(ours) == 30
    with pytest.raises(Refused, match="u1"):
        planner.dense(ours + theirs)
