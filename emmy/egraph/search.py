"""Choosing kernel boundaries and fold forms by what the kernels cost.

The objective is the one the user pays: the sum over kernels of each kernel's price (its
best legal row under the cost model, or a measured time), with ties broken by fewer bytes,
then fewer kernel launches. The decisions are, per e-class, materialized or fused, and per
fold with a one-pass (twisted) form, one-pass or multi-pass. They are made together by a
local search over moves, each priced by re-lowering only the kernels it changes:

1. Start (`initial_boundaries`): every output; every reduction's result at its *top*, the
   last class of the chain of elementwise and layout work that only it feeds without
   growing (a matmul's bias and activation end up in its kernel); elementwise work that
   several consumers read (a residual stream) computed once; everything else fused
   (elementwise producers recomputed where they are read). Kernels start no bigger than
   the work between reductions, so no move has to lower a kernel the size of the program.
2. Moves, in producer-to-consumer order: toggle a reduction's boundary; toggle its top;
   shift the boundary between the two; materialize or fuse the elementwise work a
   reduction reads through an index map (a contraction's operand prologue: `relu(x) @ w`
   fused keeps SIMT, materialized lets the matmul take tensor cores); materialize or fuse
   shared elementwise work; switch a fold
   between its one-pass and multi-pass form, with the folds that come alive either fused
   or materialized; fuse every reduction a kernel reads into it at once (each alone may
   cost more while all together remove their kernels); and, once a round keeps nothing,
   fuse a reduction into the kernel that reads it while cutting another reduction out of
   that kernel (a masked attention: its scores into the flash kernel, its mask's row test
   out of it), where that kernel holds a softmax-weighted sum. Offered only at convergence, the
   search takes the same path as without them up to there, and each one kept lowers the
   price it ends with.
3. A move is kept when it lowers the price; rounds repeat until none does (or the round
   limit or the time budget runs out, which the report says). Each move touches the kernels
   whose region holds the classes it changes, and kernel prices are memoized by signature,
   so the work grows with the program, not with its square.

The last round, in which nothing was kept, priced every move against the final program:
those prices are the explanation (`Decision`), what each alternative would have cost.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field

from emmy.egraph.kernels import LIGHT, ChosenGraph, Kernels
from emmy.schedule.pricing import KernelPrice
from emmy.egraph.representatives import TWISTED
from emmy.egraph.view import ENode

log = logging.getLogger("emmy.egraph")
MAX_ROUNDS = 6
TIME_TOLERANCE = 1e-6  # relative: prices closer than this are a tie (then bytes, launches, arithmetic decide)


def _alike(delta: float, scale: float) -> bool:
    """Whether a change of `delta` seconds against a price of `scale` seconds is within the tolerance."""
    return abs(delta) <= TIME_TOLERANCE * max(scale, 1e-12)


@dataclass(frozen=True)
class Move:
    kind: str  # "boundary" (the classes in `flips` toggle) or "form" (`subject` takes `node`)
    subject: str
    flips: tuple[str, ...] = ()
    node: ENode | None = None
    fuse_new: bool = False  # form moves: reductions that come alive stay fused (else cut at their tops)
    what: str = ""  # how the explanation names it


@dataclass(frozen=True)
class Decision:
    """One choice extraction made, and what the alternative would have cost the whole program."""
    kind: str  # "boundary" | "form"
    subject: str  # the value it is about (a Tensor IR name where the class has one)
    chosen: str
    alternative: str
    seconds: float | None  # the program's predicted seconds with the alternative (None: unpriceable)
    delta_seconds: float | None  # alternative - chosen
    delta_bytes: float
    delta_launches: int
    move: Move | None = field(default=None, compare=False, repr=False)  # what `BoundarySearch.alternative` makes
    delta_compute_seconds: float = 0.0  # the alternative's arithmetic (slowest pipe) minus the chosen's

    def tie_text(self) -> str:
        """How a tie in time was decided ("" when the times differ): bytes, launches, then arithmetic."""
        if self.seconds is None or self.delta_seconds is None or not _alike(self.delta_seconds, self.seconds):
            return ""
        if abs(self.delta_bytes) > 0.5 or self.delta_launches:
            return f"a tie: {self.delta_bytes / 1e6:+.3f} MB, {self.delta_launches:+d} launches"
        return f"a tie: {self.delta_compute_seconds * 1e6:+.2f} us of arithmetic"

    def render(self) -> str:
        if self.seconds is None or self.delta_seconds is None:
            cost = "no row fits within the pins"
        else:
            tie = self.tie_text()
            cost = f"{self.seconds * 1e6:.2f} us ({self.delta_seconds * 1e6:+.2f} us" + (f", {tie})" if tie else ")")
        return f"{self.subject}: {self.chosen}; {self.alternative} would cost {cost}"


@dataclass
class SearchReport:
    rounds: int = 0
    moves_priced: int = 0
    moves_kept: int = 0
    kernels_lowered: int = 0
    kernels_refused: int = 0  # lowerings stopped at the statement budget (a move recomputing too much)
    seconds: float = 0.0
    stopped_by: str = ""  # "rounds" or "seconds" when the search ended before no move helped

    def render(self) -> str:
        state = f"stopped by its {self.stopped_by} budget" if self.stopped_by else "no move helps"
        return (f"boundary search: {self.rounds} rounds, {self.moves_priced} moves priced, {self.moves_kept} kept, "
                f"{self.kernels_lowered} kernels lowered"
                + (f" ({self.kernels_refused} refused as too large)" if self.kernels_refused else "")
                + f", {self.seconds:.3f} s, {state}")

    def warning(self) -> str:
        if not self.stopped_by:
            return ""
        return (f"boundary search stopped by its {self.stopped_by} budget after {self.rounds} rounds "
                f"({self.moves_kept} moves kept): the program is the best found so far")


@dataclass
class SearchResult:
    kernels: Kernels
    decisions: tuple[Decision, ...]
    report: SearchReport = field(default_factory=SearchReport)
    search: object = None  # the BoundarySearch, for alternatives


def top_of(chosen: ChosenGraph, cid: str) -> str:
    """Where a reduction's kernel ends: up through elementwise and layout work that only it
    feeds, while the value does not grow (a broadcast into another reduction stops it)."""
    roots = chosen.roots()
    current = cid
    while current not in roots:
        parents = chosen.parents(current)
        if len(parents) != 1:
            break
        parent = parents[0]
        if chosen.choice[parent].kind not in LIGHT or chosen.numel(parent) > chosen.numel(current):
            break
        current = parent
    return current


def operands_of(chosen: ChosenGraph, cid: str) -> list[str]:
    """The elementwise work a reduction reads through an index map (a contraction's operands,
    attention's q, k, v): the classes under each layout map, and under their casts."""
    found = []
    choice = chosen.choice
    for body in choice[cid].children:
        layouts = [body] if choice[body].kind == "reindex" else \
            [c for c in choice[body].children if choice[c].kind == "reindex"]
        for layout in layouts:
            operand = choice[layout].args[0]
            while choice[operand].kind in ("unary", "binary", "select"):
                found.append(operand)
                node = choice[operand]
                if not (node.kind == "unary" and node.args[0] == "cast"):
                    break
                operand = node.children[0]
    return found


def shared(chosen: ChosenGraph, cid: str) -> bool:
    """Elementwise work read by several consumers, counted through index maps (a residual stream
    read by a norm and by the next residual add): fusing it recomputes it in each."""
    if chosen.choice[cid].kind not in ("unary", "binary", "select"):
        return False
    readers: set[str] = set()
    seen, stack = set(), [cid]
    while stack:
        current = stack.pop()
        for parent in chosen.parents(current):
            if parent in seen:
                continue
            seen.add(parent)
            if chosen.choice[parent].kind == "reindex":
                stack.append(parent)
            else:
                readers.add(parent)
        if len(readers) > 1:
            return True
    return False


MAX_CUT_OUT = 3  # fused reductions a kernel's cut-out move takes at once (2 ** n combinations are priced)


def initial_boundaries(chosen: ChosenGraph) -> set[str]:
    """Every reduction's result cut at its top, and shared elementwise work computed once."""
    boundaries = set(chosen.required())
    for cid in chosen.order():
        if chosen.is_heavy(cid) and chosen.optional(cid):
            boundaries.add(top_of(chosen, cid))
        elif chosen.optional(cid) and shared(chosen, cid):
            boundaries.add(cid)
    return boundaries


class BoundarySearch:
    def __init__(self, chosen: ChosenGraph, price, other_forms: dict[str, ENode], seconds: float = 60.0):
        """`price`: [(Kernel, buffer types)] -> [KernelPrice]; `other_forms`: class -> (its
        one-pass node, its multi-pass node): a form move switches to whichever is not current."""
        self.chosen = chosen
        self.other_forms = other_forms
        self.seconds = seconds
        self.kernels = Kernels(chosen, initial_boundaries(chosen), price)
        self.report = SearchReport()
        self.swaps = False  # whether the moves take the two-cut swaps (from the first converged round on)

    # -- moves ----------------------------------------------------------------
    def moves(self) -> list[list[Move]]:
        """The moves against the current program, grouped by the site they decide (a reduction's
        cut, an operand's, a shared value's, a fold's form): the best of a group is kept."""
        chosen = self.chosen
        required = chosen.required()
        groups: list[list[Move]] = []
        seen: set = set()

        def group(*moves: Move) -> None:
            fresh = []
            for move in moves:
                key = (move.kind, move.flips, move.node.id if move.node else "", move.fuse_new)
                if key not in seen:
                    seen.add(key)
                    fresh.append(move)
            if fresh:
                groups.append(fresh)

        def flippable(cid: str) -> bool:
            return self._flippable(cid, required)

        for cid in chosen.order():
            if chosen.is_heavy(cid) and flippable(cid):
                top = top_of(chosen, cid)
                if top != cid and flippable(top):
                    group(Move("boundary", cid, (cid,)), Move("boundary", top, (top,)),
                          Move("boundary", cid, (cid, top), what=f"the cut at {self.name(cid)} or at {self.name(top)}"))
                else:
                    group(Move("boundary", cid, (cid,)))
            if chosen.is_heavy(cid):
                group(*(Move("boundary", operand, (operand,)) for operand in operands_of(chosen, cid)
                        if flippable(operand)))
            elif flippable(cid) and shared(chosen, cid):
                group(Move("boundary", cid, (cid,)))
            forms = self.other_forms.get(cid)
            other = None if forms is None else forms[1] if chosen.choice[cid].id == forms[0].id else forms[0]
            if other is not None and not any(chosen.reaches(child, cid) for child in other.children):
                group(*(Move("form", cid, node=other, fuse_new=fuse_new) for fuse_new in (True, False)))
        # Several reductions one kernel reads, fused into it together: each alone can cost more
        # (its producer kernels stay) where all at once saves their launches and round trips
        # (GroupNorm's two statistics into its normalizing sweep).
        regions = self.kernels.regions  # every live kernel's, kept up to date by the moves
        for root in sorted(regions):
            cuts = tuple(sorted(c for c in regions[root] & self.kernels.boundaries
                                if c != root and c in regions and flippable(c)
                                and any(chosen.is_heavy(m) for m in regions[c])))
            if len(cuts) >= 2:
                group(Move("boundary", root, cuts, what=f"the reductions {self.name(root)} reads, fused into it"))
            # ... and the way back: the reductions fused into a kernel, cut out of it together (a
            # norm's statistics back into a kernel of their own, its sweep a map again)
            # (each cut where the reduction ends or where its kernel would end, every combination)
            sites = []
            for c in sorted(regions[root]):
                if c != root and chosen.is_heavy(c) and c not in self.kernels.boundaries:
                    options = tuple(dict.fromkeys(t for t in (c, top_of(chosen, c))
                                                  if t != root and t not in self.kernels.boundaries and flippable(t)))
                    if options:
                        sites.append(options)
            if 2 <= len(sites) <= MAX_CUT_OUT:
                group(*(Move("boundary", root, tuple(sorted(set(cuts))),
                             what=f"the reductions {self.name(root)} reads, cut out of it")
                        for cuts in itertools.product(*sites)))
        if self.swaps:
            groups += self._swap_groups()
        return groups

    def _flippable(self, cid: str, required: frozenset) -> bool:
        """Whether a class's boundary may toggle (`required`: chosen.required(), built once a call)."""
        return cid not in required and self.chosen.optional(cid)

    def _swap_groups(self) -> list[list[Move]]:
        """A reduction fused into the kernel that reads it while another reduction there is cut out:
        each alone can cost more (two folds in one kernel are no flash attention; the other one alone
        in a kernel of its own saves nothing) where together they make the cheap form (a masked
        attention's scores fused into one flash kernel, its mask's row test a kernel apart)."""
        chosen, regions, groups, required = self.chosen, self.kernels.regions, [], self.chosen.required()

        def flippable(cid: str) -> bool:
            return self._flippable(cid, required)

        for cut in sorted(self.kernels.boundaries):
            if not (cut in regions and flippable(cut) and any(chosen.is_heavy(m) for m in regions[cut])):
                continue  # a kernel with a reduction (cut at the reduction or at its top)
            for reader in sorted(self.kernels.members.get(cut, ()) - {cut}):
                region = regions[reader]
                # a kernel with a softmax-weighted sum (attention): two folds beside it are no flash
                # attention; elsewhere the swaps price many kernels for little
                if not any(chosen.choice[c].kind == "softmax_wsum" for c in region):
                    continue
                swaps = [(cut, other) for c in sorted(region)
                         if c not in (reader, cut) and chosen.is_heavy(c) and c not in self.kernels.boundaries
                         for other in dict.fromkeys((c, top_of(chosen, c)))
                         if other != reader and other not in self.kernels.boundaries and flippable(other)]
                if swaps:
                    groups.append([Move("boundary", cut, flips, what=f"{self.name(cut)} fused into the kernel that "
                                        f"reads it, {self.name(flips[1])} cut out of it") for flips in swaps])
        return groups

    # -- applying and undoing ----------------------------------------------------
    def apply(self, move: Move):
        """Make the move; returns what undoing it needs and the price change (a key tuple)."""
        chosen, kernels = self.chosen, self.kernels
        touched = set(move.flips) | ({move.subject} if move.kind == "form" else set())
        old_roots = kernels.affected(touched)
        before = dict(kernels.prices)
        added_boundaries: list[str] = []
        old_node = None
        if move.kind == "form":
            old_node = chosen.choice[move.subject]
            was_live = {c for c, n in chosen.refs.items() if n > 0}
            chosen.set_choice(move.subject, move.node)
            if not move.fuse_new:
                for cid in chosen.order():
                    if cid not in was_live and chosen.is_heavy(cid) and chosen.optional(cid):
                        top = top_of(chosen, cid)
                        if top not in kernels.boundaries:
                            kernels.boundaries.add(top)
                            added_boundaries.append(top)
        for cid in move.flips:
            kernels.boundaries.symmetric_difference_update({cid})
        kernels.refresh(old_roots)
        after = kernels.prices
        changed = set(old_roots) | (set(after) ^ set(before))
        delta = _sum_keys([after[r] for r in changed if r in after], [before[r] for r in changed if r in before])
        return (move, old_node, added_boundaries, changed), delta

    def undo(self, undo) -> None:
        move, old_node, added_boundaries, changed = undo
        chosen, kernels = self.chosen, self.kernels
        for cid in move.flips:
            kernels.boundaries.symmetric_difference_update({cid})
        for cid in added_boundaries:
            kernels.boundaries.discard(cid)
        if old_node is not None:
            chosen.set_choice(move.subject, old_node)
        kernels.refresh(changed)  # the old kernels again (lowered and priced before: memoized)

    # -- the search -------------------------------------------------------------
    def run(self) -> SearchResult:
        start = time.perf_counter()
        report = self.report
        last: dict = {}
        while True:
            if report.rounds >= MAX_ROUNDS:
                report.stopped_by = "rounds"
                break
            report.rounds += 1
            evaluations = {}
            kept = self._round(self.moves(), evaluations, start)
            if not kept and not report.stopped_by and not self.swaps:
                # converged: now the moves of two cuts at once too, which a search offering them from
                # the start could trade for a worse end (a local search follows its path); from here
                # each one kept lowers the price of the program the search ends with
                self.swaps = True
                kept = self._round(self._swap_groups(), evaluations, start)
            last = evaluations
            if report.stopped_by or not kept:
                break
        report.seconds = time.perf_counter() - start
        report.kernels_lowered = self.kernels.lowered_count
        report.kernels_refused = self.kernels.refused_count
        return SearchResult(self.kernels, self._decisions(last), report, self)

    def _round(self, groups: list[list[Move]], evaluations: dict, start: float) -> int:
        """Price every group's moves against the program, keeping the best improving one of each
        (`evaluations` gets the prices of the groups that kept none); the moves kept."""
        report, kept = self.report, 0
        if groups:
            self._speculate([move for moves in groups for move in moves], start + self.seconds)
            kept += self._repair(groups)
            for moves in groups:
                if time.perf_counter() - start > self.seconds:
                    report.stopped_by = "seconds"
                    break
                total = self.kernels.total()
                priced = []
                for move in moves:
                    if self._still_applies(move):
                        undo, delta = self.apply(move)
                        self.undo(undo)
                        report.moves_priced += 1
                        priced.append((delta, move))
                improving = [(d, m) for d, m in priced if _better(d, total)]
                if improving:
                    delta, best = min(improving, key=lambda t: _order(t[0], total))
                    log.debug("round %d: %s (%s -> %s): %+.3f us", report.rounds, best.what or self.name(best.subject),
                              *self._describe(best), delta[1] * 1e6)
                    self.apply(best)
                    kept += 1
                    report.moves_kept += 1
                    evaluations.clear()  # prices seen so far were against an older program
                else:
                    evaluations.update({move: (delta, total) for delta, move in priced})
        return kept

    def _repair(self, groups: list[list[Move]]) -> int:
        """Kernels no offered row lowers (priced as missing) are fixed first, each by the cheapest
        move among those that change a class of its region and leave fewer such kernels: the
        in-order pass would take the first move that removes one, at any price."""
        kernels = self.kernels
        by_class: dict[str, list[Move]] = {}
        for moves in groups:
            for move in moves:
                for cid in set(move.flips) | {move.subject}:
                    by_class.setdefault(cid, []).append(move)
        kept = 0
        for root in [r for r, p in kernels.prices.items() if p.seconds is None]:
            if root not in kernels.prices or kernels.prices[root].seconds is not None:
                continue  # fixed by an earlier repair
            candidates = {id(m): m for cid in kernels.regions[root] for m in by_class.get(cid, ())}
            total = kernels.total()
            priced = []
            for move in candidates.values():
                if self._still_applies(move):
                    undo, delta = self.apply(move)
                    self.undo(undo)
                    self.report.moves_priced += 1
                    priced.append((delta, move))
            fixing = [(d, m) for d, m in priced if d[0] < 0]
            if fixing:
                delta, best = min(fixing, key=lambda t: _order(t[0], total))
                log.debug("repair: %s (%s -> %s): %+.3f us", best.what or self.name(best.subject),
                          *self._describe(best), delta[1] * 1e6)
                self.apply(best)
                kept += 1
                self.report.moves_kept += 1
        return kept

    def _speculate(self, moves: list[Move], deadline: float) -> None:
        """Lower the kernels every move would make against the current program and price them in
        one batch: the moves are then priced from memos, and new kernel shapes share one
        schedule-space build. Past `deadline` (the search's time budget) the rest are left to be
        priced one by one, as far as the budget lets the search go."""
        kernels = self.kernels
        kernels.deferred = []
        for move in moves:
            if time.perf_counter() > deadline:
                break
            if self._still_applies(move):
                undo, _ = self.apply(move)
                self.undo(undo)
        kernels.price_deferred()

    def _still_applies(self, move: Move) -> bool:
        chosen = self.chosen
        if not chosen.live(move.subject) or any(not chosen.live(c) for c in move.flips):
            return False
        if move.kind == "form":
            return chosen.choice[move.subject].id != move.node.id and not any(
                chosen.reaches(child, move.subject) for child in move.node.children)
        return True

    def alternative(self, decision: Decision):
        """The whole program with a decision's alternative taken instead (a LoopProgram)."""
        undo, _ = self.apply(decision.move)
        try:
            return self.kernels.program()
        finally:
            self.undo(undo)

    # -- explanation ------------------------------------------------------------
    def name(self, cid: str) -> str:
        found = self.chosen.view.names.get(cid)
        if found:
            return found
        node = self.chosen.choice[cid]
        head = node.args[0] if node.kind in ("unary", "binary", "reduce") else node.kind
        return f"{head}[{','.join(map(str, self.chosen.view.type(cid).shape))}]"

    def _decisions(self, evaluations: dict) -> tuple[Decision, ...]:
        final = self.kernels.total()
        out = []
        for move, (delta, total) in evaluations.items():
            if total != final:
                continue
            chosen_text, alternative = self._describe(move)
            unpriced = final[0] + delta[0] > 0
            out.append(Decision(move.kind, move.what or self.name(move.subject), chosen_text, alternative,
                                None if unpriced else final[1] + delta[1], None if unpriced else delta[1],
                                delta[2], int(delta[3]), move, delta[4]))
        return tuple(out)

    def _describe(self, move: Move) -> tuple[str, str]:
        boundaries = self.kernels.boundaries
        if move.kind == "form":
            now = "one-pass" if self.chosen.choice[move.subject].kind in TWISTED else "multi-pass"
            other = "one-pass" if move.node.kind in TWISTED else "multi-pass"
            return (f"{now} fold", f"the {other} fold" + (" with its folds fused" if move.fuse_new
                                                          else " with its folds in kernels of their own"))
        if len(move.flips) == 1:
            (cid,) = move.flips
            now = "materialized" if cid in boundaries else "fused"
            return now, "fused" if now == "materialized" else "materialized"
        cut = [self.name(c) for c in move.flips if c in boundaries]
        other = [self.name(c) for c in move.flips if c not in boundaries]
        return (f"cut at {', '.join(cut) or 'neither'}", f"cut at {', '.join(other) or 'neither'}")


def _sum_keys(plus: list[KernelPrice], minus: list[KernelPrice]) -> tuple:
    keys_plus = [p.key() for p in plus]
    keys_minus = [p.key() for p in minus]
    return tuple(sum(k[i] for k in keys_plus) - sum(k[i] for k in keys_minus) for i in range(5))


def _order(delta: tuple, total: tuple) -> tuple:
    """A sort key among price changes, with times within the tolerance counted as equal."""
    unpriced, seconds, moved, launches, computed = delta
    return (unpriced, 0.0 if _alike(seconds, total[1]) else seconds, moved, launches,
            0.0 if _alike(computed, max(total[4], total[1])) else computed)


def _better(delta: tuple, total: tuple) -> bool:
    """Whether a price change is an improvement: fewer unpriceable kernels; then less time (beyond
    a relative tolerance); then fewer bytes; then fewer launches; then less arithmetic (beyond the
    same tolerance)."""
    unpriced, seconds, moved, launches, computed = delta
    if unpriced:
        return unpriced < 0
    if not _alike(seconds, total[1]):
        return seconds < 0
    if abs(moved) > 0.5:
        return moved < 0
    if launches:
        return launches < 0
    return not _alike(computed, max(total[4], total[1])) and computed < 0
