"""The schedule space: kernels and candidate knob values in, legal rows out.

Facts about each kernel (emmy.schedule.shape), keyed by its name, and the
target go into an e-graph of their own with one relation per kind of
candidate value; the schedule rules (rules/schedules.py) run to saturation
and `legal_row` holds the space. No schedule rule reads a term, so the rows
depend on a kernel's shape alone: `legal_rows` builds the space of each
distinct unnamed shape once per process (target, pins and user rules part of
the key), every new shape of a batch in one e-graph run (from the candidates'
facts saturated once per target, pins and rules), and both the
extraction's pricing and the final Tile IR read it from there. A pinned knob
narrows its relation to the pinned value (which need not be a default
candidate: any legal spelling may be pinned).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from dataclasses import dataclass

from egglog import EGraph

import emmy.rules.schedules as R
from emmy.schedule.knobs import (KNOB_NAMES, STAGE_ASYNC, STAGE_PLAIN, STAGE_REGS, STAGE_TMA, Raster, Reduce,
                                 Schedule, Stage, Tile, Work, parse_pins, parse_value)
from emmy.schedule.shape import KernelShape


@dataclass(frozen=True)
class ScheduleSpace:
    rows: dict[str, tuple[Schedule, ...]]  # kernel name -> legal rows, in a stable order
    seconds: float


def default_candidates() -> dict[str, list[str]]:
    """Every default candidate spelling per knob."""
    c = R.CANDIDATES
    values = {
        "WORK": [Work(t) for t in c["WORK_THREADS"]] + [Work.warp_grid(m, n) for m, n in c["WORK_WARPS"]],
        "TILE": [Tile(e, v) for e, v in c["TILE_SIMT"]] + [Tile.micro(m, n) for m, n in c["TILE_MICRO"]]
        + [Tile.of_atom(a, fm, fn, kc) for a in R.ATOM_DTYPE for fm in c["TILE_MMA_FRAGMENTS"]
           for fn in c["TILE_MMA_FRAGMENTS"] for kc in c["TILE_MMA_K"]],
        "REDUCE": [Reduce(), Reduce(coop=True)] + [Reduce(split=n, mode=m) for n in c["REDUCE_SPLITS"] for m in "ak"]
        + [Reduce(split=n, mode="s") for n in c["REDUCE_GRID_BLOCKS"]],
        "STAGE": [Stage()] + [Stage(0, STAGE_REGS, n) for n in c["STAGE_WEIGHTS"]] + [Stage(d, STAGE_PLAIN) for d in c["STAGE_PLAIN_DEPTHS"]]
        + [Stage(d, how) for how in (STAGE_ASYNC, STAGE_TMA) for d in c["STAGE_PIPELINE_DEPTHS"]],
        "RASTER": [Raster()] + [Raster(g) for g in c["RASTER_GROUPS"]],
    }
    return {knob: [str(v) for v in vals] for knob, vals in values.items()}


def candidate_values(pins: Schedule) -> dict[str, list[str]]:
    values = default_candidates()
    for knob, value in pins.pinned().items():
        values[knob] = [value]
    return values


@functools.lru_cache(maxsize=16)
def _cached_candidate_facts(pins_text: str) -> tuple:
    """The candidate facts for a set of pins (the same for every space built under them)."""
    return tuple(_candidate_facts(candidate_values(parse_pins(pins_text))))


def _candidate_facts(values: dict[str, list[str]]) -> list:
    facts = []
    for value in values["WORK"]:
        w = parse_value("WORK", value)
        facts.append(R.work_warps(value, w.warps_m, w.warps_n) if w.warps else R.work_threads(value, w.threads))
    for value in values["TILE"]:
        t = parse_value("TILE", value)
        if t.mma:
            facts.append(R.tile_mma(value, R.ATOM_DTYPE[t.atom], t.frag_m, t.frag_n, t.k_chunks))
        elif t.is_micro:
            facts.append(R.tile_micro(value, t.micro_m, t.micro_n))
        else:
            facts.append(R.tile_simt(value, t.elems, t.vec))
    for value in values["REDUCE"]:
        r = parse_value("REDUCE", value)
        facts.append(R.reduce_split(value, r.split, r.mode) if r.split > 1 else R.reduce_coop(value) if r.coop
                     else R.reduce_none(value))
    for value in values["STAGE"]:
        s = parse_value("STAGE", value)
        if s.held:
            facts.append(R.stage_regs(value, s.weights))
        elif not s.depth:
            facts.append(R.stage_none(value))
        else:
            relation = {STAGE_PLAIN: R.stage_plain, STAGE_ASYNC: R.stage_async, STAGE_TMA: R.stage_tma}[s.how]
            facts.append(relation(value, s.depth))
    for value in values["RASTER"]:
        group = parse_value("RASTER", value).group
        facts.append(R.raster_group(value, group) if group else R.raster_none(value))
    return facts + R.micro_thread_facts()


def _kernel_facts(shape: KernelShape) -> list:
    name = shape.kernel
    facts = [R.kernel(name, shape.kind, shape.rows, shape.cols, shape.red, shape.inner, shape.itemsize, shape.batch)]
    flags = {"foldonly": not shape.sweep, "raw": not shape.epilogue, "atomic": shape.atomic_ok, "held": shape.held}
    facts += [R.kernel_flag(name, flag) for flag, on in flags.items() if on]
    if shape.weights:
        facts.append(R.kernel_weights(name, shape.weights))
    if shape.mma:
        facts.append(R.kernel_mma(name, shape.mma))
    if shape.kind == "contraction":
        facts.append(R.kernel_panels(name, *shape.panel_bytes))
    return facts


def build_space(shapes: list[KernelShape], target, pins: Schedule = Schedule(), rules: tuple = ()) -> ScheduleSpace:
    """Every legal row of each kernel; `rules`: the user's emmy.rules.ScheduleRuleGroup, run beside the
    built-in schedule rules (their rows held to the pins). The kernels' facts join a saturated e-graph
    of the candidates and the target (_base), inside a push and pop: the rules then match only what
    the kernels add (egglog's semi-naive run), a fifth to a half of a fresh e-graph's time."""
    start = time.perf_counter()
    base = _base(target.smem_per_block, target.sms, int(target.has_cp_async), int(target.has_tma), str(pins), rules)
    facts = [fact for shape in shapes for fact in _kernel_facts(shape)]
    rows = {shape.kernel: [] for shape in shapes}
    pinned = pins.pinned()
    with base.lock:
        base.egraph.push()
        try:
            base.egraph.register(*facts)
            base.egraph.run(base.rules.saturate())
            for kernel, row in _legal_rows(base.egraph):
                # a user's rule may offer any value: held to the pins here
                if kernel in rows and all(getattr(row, k) == v for k, v in pinned.items()):
                    rows[kernel].append(row)
        finally:
            base.egraph.pop()
    order = {knob: {v: i for i, v in enumerate(vals)} for knob, vals in candidate_values(pins).items()}
    # a value only a user's rule offers ranks after the candidates
    ranked = {name: tuple(sorted(found, key=lambda r: tuple(order[k].get(getattr(r, k), len(order[k]))
                                                            for k in KNOB_NAMES)))
              for name, found in rows.items()}
    return ScheduleSpace(ranked, time.perf_counter() - start)


@dataclass(frozen=True)
class _Base:
    egraph: EGraph  # the candidates and the target, saturated; never holds a kernel outside build_space
    rules: object  # the ruleset it was saturated under
    lock: threading.Lock  # push, run, read, pop: one builder at a time


@functools.lru_cache(maxsize=16)
def _base(smem_per_block: int, sms: int, cp_async: int, tma: int, pins_text: str, rules: tuple) -> _Base:
    """The saturated e-graph a space starts from, per target facts, pins and user rules."""
    egraph = EGraph()
    egraph.register(*_cached_candidate_facts(pins_text), R.target(smem_per_block, sms, cp_async, tma))
    combined = _schedule_rules()
    for group in rules:
        combined = combined | group.ruleset
    egraph.run(combined.saturate())
    return _Base(egraph, combined, threading.Lock())


_SPACES: dict[tuple, tuple[Schedule, ...]] = {}  # (target, pins, user rules, unnamed shape) -> legal rows


def unnamed(shape: KernelShape) -> KernelShape:
    """The shape with the kernel's own names dropped: what its legal rows depend on."""
    return dataclasses.replace(shape, kernel="", free_vars=(), m_vars=(), n_vars=())


def legal_rows(shapes: list[KernelShape], target, pins: Schedule = Schedule(),
               rules: tuple = ()) -> list[tuple[Schedule, ...]]:
    """Each shape's legal rows, in order, from the process's spaces; shapes not seen before are built
    together in one e-graph run. (By position, not by kernel name: the forms extraction weighs may
    give different kernels one name.)"""
    keys = [(target.key, str(pins), rules, unnamed(shape)) for shape in shapes]
    missing = {}
    for key in keys:
        if key not in _SPACES and key not in missing:
            missing[key] = dataclasses.replace(key[-1], kernel=f"shape{len(missing)}")
    if missing:
        space = build_space(list(missing.values()), target, pins, rules)
        for key, stand_in in missing.items():
            _SPACES[key] = space.rows[stand_in.kernel]
    return [_SPACES[key] for key in keys]


def forget_spaces() -> None:
    """Drop the process's spaces and the e-graphs they start from (benchmarks measuring a cold compile)."""
    _SPACES.clear()
    _base.cache_clear()


@functools.lru_cache(maxsize=None)
def _schedule_rules():
    combined = R.SCHEDULE_RULESETS[0]
    for ruleset in R.SCHEDULE_RULESETS[1:]:
        combined = combined | ruleset
    return combined


def _legal_rows(egraph):
    """(kernel name, Schedule) for every legal_row fact, read from a frozen copy of egglog's tables
    (egglog-python has no public reader for relation rows; serializing the whole e-graph costs ten
    times more)."""
    frozen = egraph._egraph.freeze()
    text = functools.lru_cache(maxsize=None)(egraph._egraph.value_to_string)  # few distinct, many rows
    _, egg_name = egraph._callable_to_egg(R.legal_row)
    for row in frozen.functions[egg_name].rows if egg_name in frozen.functions else []:
        yield tuple(map(text, row.inputs))[0], Schedule(*map(text, row.inputs[1:]))
