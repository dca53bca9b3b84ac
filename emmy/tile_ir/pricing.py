"""The price of a kernel: its cheapest offered row's predicted (or measured) time on a target.

This is what extraction minimises. Prices are memoized by the kernel's canonical signature
(emmy.loop_ir.signature: operations, dtypes, index maps, extents and buffer types, not names),
so the kernels of repeated layers are priced once; a measured time is looked up by the same
signature. Legal rows depend only on a kernel's shape without names, and the schedule space for
every new shape of a batch is built in one e-graph run; spaces are kept for the process (the
schedule rules do not change while it runs).
"""

from __future__ import annotations

from emmy.egraph.kernels import KernelPrice
from emmy.knobs import KnobRow
from emmy.loop_ir.nodes import Kernel
from emmy.loop_ir.signature import canonical, signature_of
from emmy.tensor_ir.nodes import TensorType

_SPACES: dict[tuple, tuple[KnobRow, ...]] = {}  # (target, pins, unnamed shape) -> legal rows


class KernelPricer:
    """Callable on [(Kernel, buffer types)] -> [KernelPrice], for one target and set of pins."""

    def __init__(self, target, pins: KnobRow = KnobRow(), schedule_rules: tuple = ()):
        self.target = target
        self.pins = pins
        self.schedule_rules = schedule_rules  # the user's emmy.rules.ScheduleRuleGroup
        self.prices: dict[tuple, KernelPrice] = {}
        self.priced = 0  # distinct kernels priced (the memo's misses)
        self._rankings: dict[tuple, list] = {}  # (space key, loop cost) -> every legal row's Breakdown, cheapest first

    def __call__(self, items: list[tuple[Kernel, dict[str, TensorType]]]) -> list[KernelPrice]:
        from emmy.tile_ir.shape import kernel_shape

        keys = [canonical(kernel, types) for kernel, types in items]
        todo = {}
        for key, (kernel, types) in zip(keys, items):
            if key not in self.prices and key not in todo:
                todo[key] = (kernel, types, kernel_shape(kernel))
        if todo:
            self._build_spaces([shape for _, _, shape in todo.values()])
            for key, (kernel, types, shape) in todo.items():
                self.prices[key] = self._price(key, kernel, types, shape)
                self.priced += 1
        return [self.prices[key] for key in keys]

    def _space_key(self, shape) -> tuple:
        from emmy.tile_ir.build import _unnamed

        return (self.target.key, str(self.pins), self.schedule_rules, _unnamed(shape))

    def _build_spaces(self, shapes) -> None:
        import dataclasses

        from emmy.egraph.schedules import build_space

        missing = {}
        for shape in shapes:
            key = self._space_key(shape)
            if key not in _SPACES and key not in missing:
                missing[key] = dataclasses.replace(key[-1], kernel=f"shape{len(missing)}")
        if missing:
            space = build_space(list(missing.values()), self.target, self.pins, rules=self.schedule_rules)
            for key, stand_in in missing.items():
                _SPACES[key] = space.rows[stand_in.kernel]

    def _price(self, key, kernel: Kernel, types, shape) -> KernelPrice:
        from emmy.extract.loop_cost import kernel_cost
        from emmy.extract.measured import current
        from emmy.tile_ir.build import offered_rows, ranked_rows, supported

        rows = _SPACES[self._space_key(shape)]
        signature = signature_of(key)
        if not rows:
            return KernelPrice(None, 0.0, 1, signature, "no legal row within the pins")
        if current().has_signature(self.target.key, signature):  # measured rows: rank them all
            offered = offered_rows(kernel, shape, rows, types, strict=True)
            best = ranked_rows(kernel, shape, offered, self.target, types)[0] if offered else None
        else:  # the cheapest predicted row the lowering takes: rows are ranked once per shape and cost
            cost = kernel_cost(kernel, {name: (t.numel, t.dtype.itemsize) for name, t in types.items()})
            ranking = self._ranking(shape, rows, cost)
            memo: dict = {}  # what `supports` keeps across this kernel's rows
            best = next((b for b in ranking if supported(kernel, shape, b.row, types, memo)), None)
        if best is None:
            return KernelPrice(None, 0.0, 1, signature, "no legal row is lowered to Kernel IR")
        launches = 2 if best.row.REDUCE.startswith("g") else 1  # a split adds its fill or finishing kernel
        return KernelPrice(best.total_s, best.bytes, launches, signature, str(best.row))

    def _ranking(self, shape, rows, cost) -> list:
        from emmy.extract.cost_model import predict

        key = (self._space_key(shape), cost)
        if key not in self._rankings:
            unnamed = key[0][-1]  # names change nothing in a prediction, and keep geometry's cache warm
            predicted = [predict(unnamed, row, self.target, cost) for row in rows]
            self._rankings[key] = [predicted[i] for i in sorted(range(len(rows)), key=lambda i: (predicted[i].total_s, i))]
        return self._rankings[key]
