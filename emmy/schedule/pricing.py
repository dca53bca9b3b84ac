"""The price of a kernel: its cheapest offered row's predicted (or measured) time on a target.

This is what extraction minimises, and the same object then gives the final Tile IR its rows, so a
kernel's rows are found, checked and ranked once. Prices are memoized by the kernel's canonical
signature (emmy.loop_ir.signature: operations, dtypes, index maps, extents and buffer types, not
names), so the kernels of repeated layers are priced once; a measured time is looked up by the same
signature. Legal rows come from emmy.schedule.space (built once per unnamed shape).

A row is offered only where the Kernel IR lowering takes it. That check belongs to a later stage,
so it is passed in: `lowers(kernel, shape, row, types, memo) -> bool` (emmy.kernel_ir.lower.lowers_row),
called at most once per row and kernel signature; `memo` is kept across one kernel's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from emmy.loop_ir.nodes import Kernel
from emmy.loop_ir.signature import canonical, signature_of
from emmy.schedule.choose import loop_cost, ranked_rows
from emmy.schedule.cost_model import predict
from emmy.schedule.knobs import Schedule
from emmy.schedule.measured import current
from emmy.schedule.shape import kernel_shape
from emmy.schedule.space import legal_rows, unnamed
from emmy.tensor_ir.nodes import TensorType

Lowers = Callable[..., bool]  # (Kernel, KernelShape, Schedule, buffer types, memo) -> whether it is lowered


@dataclass(frozen=True)
class KernelPrice:
    """What a kernel costs: its predicted (or measured) seconds under its best row, the bytes it
    moves, and the kernels it launches. `seconds` None: no row fits (the pins leave none)."""
    seconds: float | None
    bytes: float
    launches: int = 1
    signature: str = ""
    detail: str = ""  # the row, or the model that priced it
    compute_seconds: float = 0.0  # the row's predicted arithmetic (the slowest pipe): what breaks a tie

    def key(self) -> tuple:
        """Lower is better: unpriceable kernels first, then time, bytes, launches, and arithmetic (of
        two memory-bound forms of equal time, the one that computes less: a row softmax's
        multi-pass form over a row held in registers, whose numerators and normaliser share
        every exp, over the one-pass form's rescaled sums)."""
        return (0 if self.seconds is not None else 1, self.seconds or 0.0, self.bytes, self.launches,
                self.compute_seconds)


class _Rows:
    """One kernel signature's legal rows and which of them the lowering takes (the same for every
    kernel of the signature: names change neither)."""

    def __init__(self, legal: tuple[Schedule, ...]):
        self.legal = legal
        self.lowered: dict[Schedule, bool] = {}


class KernelPricer:
    """Callable on [(Kernel, buffer types)] -> [KernelPrice], for one target and set of pins; also the
    offered rows (`offered`) and their ranking (`ranked`) of any kernel it has seen."""

    def __init__(self, target, lowers: Lowers, pins: Schedule = Schedule(), schedule_rules: tuple = ()):
        self.target = target
        self.lowers = lowers
        self.pins = pins
        self.schedule_rules = schedule_rules  # the user's emmy.rules.ScheduleRuleGroup
        self.prices: dict[tuple, KernelPrice] = {}
        self.priced = 0  # distinct kernels priced (the memo's misses)
        self._rows: dict[tuple, _Rows] = {}  # canonical key -> its rows
        self._rankings: dict[tuple, list] = {}  # (unnamed shape, loop cost) -> every legal row's Breakdown, cheapest first

    def __call__(self, items: list[tuple[Kernel, dict[str, TensorType]]]) -> list[KernelPrice]:
        keys = self._see(items)
        for key, (kernel, types) in zip(keys, items):
            if key not in self.prices:
                self.prices[key] = self._price(key, kernel, types)
                self.priced += 1
        return [self.prices[key] for key in keys]

    def _see(self, items) -> list[tuple]:
        """Canonical keys of the kernels; the legal rows of those not seen yet, in one space build."""
        keys = [canonical(kernel, types) for kernel, types in items]
        new = {}
        for key, (kernel, _) in zip(keys, items):
            if key not in self._rows and key not in new:
                new[key] = kernel_shape(kernel)
        if new:
            legal = legal_rows(list(new.values()), self.target, self.pins, self.schedule_rules)
            for key, rows in zip(new, legal):
                self._rows[key] = _Rows(rows)
        return keys

    def _takes(self, rows: _Rows, row: Schedule, kernel: Kernel, shape, types, memo: dict) -> bool:
        """Whether the lowering takes `row`, asked once per signature; `memo`: kept across one kernel's rows."""
        if row not in rows.lowered:
            rows.lowered[row] = self.lowers(kernel, shape, row, types, memo)
        return rows.lowered[row]

    def offered(self, kernel: Kernel, types: dict, strict: bool = False) -> tuple[Schedule, ...]:
        """The legal rows the Kernel IR lowering takes. When it takes none (a kind of kernel not lowered
        yet), all legal rows (the kernel then stops at Tile IR and the lowering says why), or none when
        `strict` (extraction prices such a kernel as unavailable)."""
        (key,) = self._see([(kernel, types)])
        rows, shape, memo = self._rows[key], kernel_shape(kernel), {}
        kept = tuple(row for row in rows.legal if self._takes(rows, row, kernel, shape, types, memo))
        return kept if kept or strict else rows.legal

    def ranked(self, kernel: Kernel, types: dict) -> list:
        """The offered rows' cost breakdowns, cheapest first."""
        return ranked_rows(kernel, kernel_shape(kernel), self.offered(kernel, types), self.target, types)

    def _price(self, key, kernel: Kernel, types) -> KernelPrice:
        rows, shape = self._rows[key], kernel_shape(kernel)
        signature = signature_of(key)
        if not rows.legal:
            return KernelPrice(None, 0.0, 1, signature, "no legal row within the pins")
        if current().has_signature(self.target.key, signature):  # measured rows: rank them all
            offered = self.offered(kernel, types, strict=True)
            best = ranked_rows(kernel, shape, offered, self.target, types)[0] if offered else None
        else:  # the cheapest predicted row the lowering takes: rows are ranked once per shape and cost
            ranking, memo = self._ranking(shape, rows.legal, loop_cost(kernel, types)), {}
            best = next((b for b in ranking if self._takes(rows, b.row, kernel, shape, types, memo)), None)
        if best is None:
            return KernelPrice(None, 0.0, 1, signature, "no legal row is lowered to Kernel IR")
        launches = 2 if best.row.reduce.split > 1 else 1  # a split adds its fill or finishing kernel
        return KernelPrice(best.total_s, best.bytes, launches, signature, str(best.row), best.compute_s)

    def _ranking(self, shape, rows, cost) -> list:
        key = (unnamed(shape), cost)
        if key not in self._rankings:
            predicted = [predict(key[0], row, self.target, cost) for row in rows]  # names change no prediction
            self._rankings[key] = [predicted[i] for i in sorted(range(len(rows)), key=lambda i: (predicted[i].total_s, i))]
        return self._rankings[key]
