"""Mixture-of-experts layers: grouped products (torch._grouped_mm, and transformers' own
`grouped_mm_fallback` op its MoE layers run on f32), routed per input at run time."""

import pytest
import torch
import torch.nn.functional as F

import emmy


def _transformers_fallback_op():
    """transformers' `transformers::grouped_mm_fallback` as its integrations/moe.py registers it
    (rows sorted by group, `offs` the groups' cumulative ends, rows past the last end zero), defined
    here when transformers has not defined it in this process."""
    if not hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        @torch.library.custom_op("transformers::grouped_mm_fallback", mutates_args=())
        def grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
            output = torch.zeros(input.size(0), weight.size(2), dtype=input.dtype)
            start = 0
            for i, end in enumerate(offs.tolist()):
                output[start:end] = input[start:end] @ weight[i]
                start = end
            return output

        @grouped_mm_fallback.register_fake
        def _(input, weight, offs):
            return input.new_empty(input.size(0), weight.size(2))
    return torch.ops.transformers.grouped_mm_fallback


class SparseMoE(torch.nn.Module):
    """A top-2 MoE block as transformers 5 runs its experts (`grouped_mm_experts_forward`): token
    copies sorted by expert, per-expert counts by histc, their running sum the groups' ends, gated
    up and down products per group, the copies put back in token order and summed."""

    def __init__(self, grouped, hidden=16, inner=24, experts=4, top_k=2):
        super().__init__()
        self.grouped, self.experts, self.top_k = grouped, experts, top_k
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, hidden, 2 * inner) * 0.3)
        self.down = torch.nn.Parameter(torch.randn(experts, inner, hidden) * 0.3)

    def forward(self, x):
        tokens, hidden = x.shape
        weights, ids = torch.topk(self.router(x).softmax(-1), self.top_k)
        weights = weights / weights.sum(-1, keepdim=True)
        sorted_ids, perm = torch.sort(ids.reshape(-1))
        rows = x[perm // self.top_k]
        counts = torch.histc(sorted_ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        ends = torch.cumsum(counts, 0, dtype=torch.int32)
        gate, up = self.grouped(rows, self.gate_up, ends).chunk(2, -1)
        out = self.grouped(F.silu(gate) * up, self.down, ends) * weights.reshape(-1)[perm].unsqueeze(-1)
        back = torch.empty_like(perm)
        back[perm] = torch.arange(perm.numel())
        return out[back].view(tokens, self.top_k, hidden).sum(1)


def test_a_moe_block_routes_each_input_at_run_time():
    """Compiled once, run on inputs whose tokens go to other experts: the groups' ends are computed
    from the inputs, and each row reads its expert's matrix by that count (never the example's)."""
    torch.manual_seed(0)
    block = SparseMoE(_transformers_fallback_op()).eval()
    program = emmy.optimize(block, torch.randn(12, 16))
    for seed in range(3):
        x = torch.randn(12, 16, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            torch.testing.assert_close(program(x, sim_mode="asan"), block(x), rtol=1e-4, atol=1e-5)


def test_grouped_products_read_each_row_s_group_and_zero_rows_past_the_last_end():
    torch.manual_seed(0)
    op = _transformers_fallback_op()

    class Grouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 8, 16))

        def forward(self, x, offs):
            return op(x, self.w, offs)

    module = Grouped()
    program = emmy.optimize(module, torch.randn(10, 8), torch.tensor([3, 3, 7, 9], dtype=torch.int32))
    for ends in ([3, 3, 7, 9], [0, 10, 10, 10], [1, 2, 3, 4]):  # an empty group; all in one; rows past the end
        x, offs = torch.randn(10, 8), torch.tensor(ends, dtype=torch.int32)
        with torch.no_grad():
            torch.testing.assert_close(program(x, offs, sim_mode="asan"), module(x, offs), rtol=1e-5, atol=1e-5)


def test_torch_grouped_mm_in_bfloat16_matches_torch():
    class Grouped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 8, 16, dtype=torch.bfloat16))

        def forward(self, x, offs):
            return torch._grouped_mm(x, self.w, offs=offs)

    module = Grouped()
    x, offs = torch.randn(6, 8, dtype=torch.bfloat16), torch.tensor([2, 5, 6], dtype=torch.int32)
    program = emmy.optimize(module, x, offs)
    with torch.no_grad():
        torch.testing.assert_close(program(x, offs, sim_mode="asan"), module(x, offs))


def test_a_grouped_product_of_other_shapes_is_refused_by_name():
    class Grouped(torch.nn.Module):
        def forward(self, x, w, offs):
            return torch._grouped_mm(x, w, offs=offs)

    x, w = torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(16, 8, dtype=torch.bfloat16)
    with pytest.raises(emmy.EmmyError, match="grouped product of shapes"):
        emmy.optimize(Grouped(), x, w.t().contiguous().t(), torch.tensor([8, 16], dtype=torch.int32)).tensor_ir
