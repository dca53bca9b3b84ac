"""Why a program came out as it did: `Program.explain()` and `emmy explain`.

Three parts: budgets that ran out (saturation phases, the boundary search), the extraction
decisions (per kernel boundary and per fold form, what the program would cost with the
other choice), and per kernel its chosen knob row with the next cheapest rows, each with
every term of its predicted time (emmy.schedule.cost_model.Breakdown).
"""

from __future__ import annotations

from dataclasses import dataclass

FORMULA = ("total = launch + body + sync + extra; body = max(mem / (hide * spread), compute / (spread * issue)) "
           "/ tail; compute = max(fma, mma, sfu, issue)")

_COLUMNS = (
    ("total us", lambda b: f"{b.total_s * 1e6:.2f}"),
    ("launch", lambda b: f"{b.launch_s * 1e6:.2f}"),
    ("body", lambda b: f"{b.body_s * 1e6:.2f}"),
    ("sync", lambda b: f"{b.sync_s * 1e6:.2f}"),
    ("extra", lambda b: f"{b.extra_s * 1e6:.2f}"),
    ("MB", lambda b: f"{b.bytes / 1e6:.3f}"),
    ("mem us", lambda b: f"{b.memory_s * 1e6:.2f}"),
    ("fma us", lambda b: f"{b.arith_s * 1e6:.2f}"),
    ("mma us", lambda b: f"{b.tensor_s * 1e6:.2f}"),
    ("sfu us", lambda b: f"{b.special_s * 1e6:.2f}"),
    ("issue us", lambda b: f"{b.issue_s * 1e6:.2f}"),
    ("occ", lambda b: f"{b.occupancy:.2f}"),
    ("waves", lambda b: str(b.waves)),
    ("tail", lambda b: f"{b.tail:.2f}"),
    ("spread", lambda b: f"{b.spread:.2f}"),
    ("hide", lambda b: f"{b.hiding:.2f}"),
    ("regs", lambda b: str(b.registers)),
    ("measured", lambda b: "yes" if b.measured else f"x{b.scale:.2f}" if b.scale != 1.0 else "no"),
)


@dataclass(frozen=True)
class KernelRows:
    name: str
    signature: str  # the kernel's canonical signature: what measured times are keyed by
    ranked: tuple  # Breakdown per row, the chosen (cheapest) first, then the next cheapest


@dataclass(frozen=True)
class Explanation:
    target: str
    predicted_seconds: float  # the chosen program, the sum of its kernels' chosen rows
    kernels: tuple[KernelRows, ...]
    decisions: tuple  # emmy.egraph.search.Decision, the closest alternatives first
    warnings: tuple[str, ...]  # budgets that ran out
    search: object = None  # emmy.egraph.search.SearchReport

    def render(self, decisions: int = 20) -> str:
        """The text `emmy explain` prints; `decisions`: how many to list (0: all)."""
        lines = [FORMULA]
        lines += [f"warning: {w}" for w in self.warnings]
        s = self.search
        head = f"=== extraction: {len(self.kernels)} kernels, predicted {self.predicted_seconds * 1e6:.2f} us on " \
               f"{self.target}"
        if s is not None:
            head += f"; search: {s.rounds} rounds, {s.moves_priced} moves priced, {s.moves_kept} kept"
        lines.append(head + " ===")
        shown = self.decisions if decisions == 0 else self.decisions[:decisions]
        if shown:
            lines.append("decisions: what the program would cost with the other choice (closest first)")
            lines += table(["kind", "value", "chosen", "alternative", "program us", "delta us", ""],
                           [[d.kind, d.subject, d.chosen, d.alternative,
                             "-" if d.seconds is None else f"{d.seconds * 1e6:.2f}",
                             "-" if d.delta_seconds is None else f"{d.delta_seconds * 1e6:+.2f}",
                             d.tie_text()] for d in shown],
                           right=(4, 5))
            if len(shown) < len(self.decisions):
                lines.append(f"  ({len(self.decisions) - len(shown)} more; --decisions 0 shows all)")
        for index, kernel in enumerate(self.kernels):
            lines.append(f"=== {index}: {kernel.name} on {self.target} (signature {kernel.signature}) ===")
            rows = [["chosen" if i == 0 else f"alt {i}", str(b.row), *(f(b) for _, f in _COLUMNS)]
                    for i, b in enumerate(kernel.ranked)]
            lines += table(["", "row", *(c for c, _ in _COLUMNS)], rows)
        return "\n".join(lines) + "\n"


def table(header: list[str], rows: list[list[str]], right: tuple[int, ...] = ()) -> list[str]:
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return ["  " + "  ".join(cell.rjust(w) if c in right else cell.ljust(w)
                             for c, (cell, w) in enumerate(zip(r, widths))).rstrip()
            for r in [header, *rows]]


def closest_first(decisions) -> tuple:
    """Decisions ordered by how little the alternative would cost more (unpriceable ones last)."""
    return tuple(sorted(decisions, key=lambda d: (d.delta_seconds is None, d.delta_seconds or 0.0,
                                                  d.subject, d.alternative)))
