"""The schedule space: kernels and candidate knob values in, legal rows out.

Facts about each kernel (emmy.tile_ir.shape), keyed by the kernel's root
term, and the target go into an e-graph with one relation per kind of
candidate value; the schedule rules (rules/schedules.py) run to saturation
and `legal_row` holds the space. Given the optimizer's saturated e-graph and
the root term of each kernel, the rows attach to the kernels' own e-classes
there; without one (a space built from shapes alone) each kernel stands as a
`buffer` term of its name in a fresh e-graph. A pinned knob narrows its
relation to the pinned value (which need not be a default candidate: any
legal spelling may be pinned).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from emmy.knobs import (KNOB_NAMES, STAGE_ASYNC, STAGE_PLAIN, STAGE_TMA, KnobRow, spell_raster, spell_reduce_split,
                        spell_stage, spell_tile_micro, spell_tile_mma, spell_tile_simt, spell_work_threads,
                        spell_work_warps, value_fields)
from emmy.tile_ir.shape import KernelShape


@dataclass(frozen=True)
class ScheduleSpace:
    rows: dict[str, tuple[KnobRow, ...]]  # kernel name -> legal rows, in a stable order
    seconds: float


def default_candidates() -> dict[str, list[str]]:
    """Every default candidate spelling per knob."""
    from emmy.rules.schedules import ATOM_DTYPE, CANDIDATES

    c = CANDIDATES
    return {
        "WORK": [spell_work_threads(t) for t in c["WORK_THREADS"]]
        + [spell_work_warps(m, n) for m, n in c["WORK_WARPS"]],
        "TILE": [spell_tile_simt(e, v) for e, v in c["TILE_SIMT"]]
        + [spell_tile_micro(m, n) for m, n in c["TILE_MICRO"]]
        + [spell_tile_mma(a, fm, fn, kc) for a in ATOM_DTYPE for fm in c["TILE_MMA_FRAGMENTS"]
           for fn in c["TILE_MMA_FRAGMENTS"] for kc in c["TILE_MMA_K"]],
        "REDUCE": ["", "coop"] + [spell_reduce_split(n, m) for n in c["REDUCE_SPLITS"] for m in "ak"],
        "STAGE": [""] + [spell_stage(d, STAGE_PLAIN) for d in c["STAGE_PLAIN_DEPTHS"]]
        + [spell_stage(d, how) for how in (STAGE_ASYNC, STAGE_TMA) for d in c["STAGE_PIPELINE_DEPTHS"]],
        "RASTER": [""] + [spell_raster(g) for g in c["RASTER_GROUPS"]],
    }


def candidate_values(pins: KnobRow) -> dict[str, list[str]]:
    values = default_candidates()
    for knob, value in pins.pinned().items():
        values[knob] = [value]
    return values


@functools.lru_cache(maxsize=16)
def _cached_candidate_facts(pins_text: str) -> tuple:
    """The candidate facts for a set of pins (the same for every space built under them)."""
    from emmy.knobs import parse_pins

    return tuple(_candidate_facts(candidate_values(parse_pins(pins_text))))


def _candidate_facts(values: dict[str, list[str]]) -> list:
    import emmy.rules.schedules as R

    facts = []
    for value in values["WORK"]:
        f = value_fields("WORK", value)
        facts.append(R.work_threads(value, f["threads"]) if "threads" in f
                     else R.work_warps(value, f["warps_m"], f["warps_n"]))
    for value in values["TILE"]:
        f = value_fields("TILE", value)
        if "atom" in f:
            facts.append(R.tile_mma(value, R.ATOM_DTYPE[f["atom"]], f["frag_m"], f["frag_n"], f["k_chunks"]))
        elif "micro_m" in f:
            facts.append(R.tile_micro(value, f["micro_m"], f["micro_n"]))
        else:
            facts.append(R.tile_simt(value, f["elems"], f.get("vec", 1)))
    for value in values["REDUCE"]:
        f = value_fields("REDUCE", value)
        facts.append(R.reduce_none(value) if value == "" else R.reduce_coop(value) if value == "coop"
                     else R.reduce_split(value, f["split"], f["mode"]))
    for value in values["STAGE"]:
        f = value_fields("STAGE", value)
        if value == "":
            facts.append(R.stage_none(value))
        else:
            relation = {STAGE_PLAIN: R.stage_plain, STAGE_ASYNC: R.stage_async, STAGE_TMA: R.stage_tma}[f["how"]]
            facts.append(relation(value, f["depth"]))
    for value in values["RASTER"]:
        facts.append(R.raster_none(value) if value == "" else R.raster_group(value, value_fields("RASTER", value)["group"]))
    return facts + R.micro_thread_facts()


def _kernel_facts(shape: KernelShape, root) -> list:
    import emmy.rules.schedules as R

    facts = [R.kernel_name(root, shape.kernel), R.kernel(root, shape.kind, shape.rows, shape.cols, shape.red, shape.inner, shape.itemsize,
                      shape.batch)]
    flags = {"foldonly": not shape.sweep, "raw": not shape.epilogue, "atomic": shape.atomic_ok}
    facts += [R.kernel_flag(root, flag) for flag, on in flags.items() if on]
    if shape.mma:
        facts.append(R.kernel_mma(root, shape.mma))
    if shape.kind == "contraction":
        facts.append(R.kernel_panels(root, *shape.panel_loads))
    return facts


def build_space(shapes: list[KernelShape], target, pins: KnobRow = KnobRow(), egraph=None,
                roots: dict | None = None, rules: tuple = ()) -> ScheduleSpace:
    """`roots`: kernel name -> its root Term in `egraph` (the optimizer's saturated e-graph);
    `rules`: the user's emmy.rules.ScheduleRuleGroup, run beside the built-in schedule rules."""
    import time

    from egglog import EGraph

    start = time.perf_counter()
    if egraph is None:
        egraph, roots = EGraph(), {}
    # Pushed, so the optimizer's e-graph is left as it was once the rows are read.
    egraph.push()
    attach_rows(egraph, shapes, target, pins, roots or {}, rules)
    rows = {shape.kernel: [] for shape in shapes}
    for kernel, row in _legal_rows(egraph):
        if not rules or _within(row, pins):  # a user's rule may offer rows the candidates (the pins) do not
            rows[kernel].append(row)
    egraph.pop()
    order = {knob: {v: i for i, v in enumerate(vals)} for knob, vals in candidate_values(pins).items()}
    # a value only a user's rule offers ranks after the candidates
    ranked = {name: tuple(sorted(found, key=lambda r: tuple(order[k].get(getattr(r, k), len(order[k]))
                                                            for k in KNOB_NAMES)))
              for name, found in rows.items()}
    return ScheduleSpace(ranked, time.perf_counter() - start)


def _within(row: KnobRow, pins: KnobRow) -> bool:
    return all(getattr(row, knob) == value for knob, value in pins.pinned().items())


def attach_rows(egraph, shapes: list[KernelShape], target, pins: KnobRow, roots: dict, rules: tuple = ()) -> None:
    """Add kernel, target and candidate facts to `egraph` and run the schedule rules to
    saturation: `legal_row(root, ...)` then holds every legal row of each kernel's root e-class.
    A kernel without a root in `roots` stands as a `buffer` term of its name."""
    import emmy.rules.schedules as R
    from emmy.egraph.terms import Term

    facts = list(_cached_candidate_facts(str(pins)))
    facts.append(R.target(target.smem_per_block, target.sms, int(target.has_cp_async), int(target.has_tma)))
    for shape in shapes:
        facts += _kernel_facts(shape, roots.get(shape.kernel, Term.buffer(shape.kernel, "", "kernel")))
    egraph.register(*facts)
    combined = _schedule_rules()
    for group in rules:
        combined = combined | group.ruleset
    egraph.run(combined.saturate())


@functools.lru_cache(maxsize=None)
def _schedule_rules():
    import emmy.rules.schedules as R

    combined = R.SCHEDULE_RULESETS[0]
    for ruleset in R.SCHEDULE_RULESETS[1:]:
        combined = combined | ruleset
    return combined


def _legal_rows(egraph):
    """(kernel name, KnobRow) for every legal_row fact. The row's first argument is the kernel's root
    e-class, named by its kernel_name fact. Read from a frozen copy of egglog's tables (egglog-python
    has no public reader for relation rows; serializing the whole e-graph costs ten times more)."""
    import emmy.rules.schedules as R

    frozen = egraph._egraph.freeze()
    text = functools.lru_cache(maxsize=None)(egraph._egraph.value_to_string)  # few distinct, many rows
    tables = {}
    for relation in (R.kernel_name, R.legal_row):
        _, egg_name = egraph._callable_to_egg(relation)
        tables[relation] = frozen.functions[egg_name].rows if egg_name in frozen.functions else []
    name_of = {str(row.inputs[0]): text(row.inputs[1]) for row in tables[R.kernel_name]}
    for row in tables[R.legal_row]:
        root, *values = row.inputs
        yield name_of[str(root)], KnobRow(**dict(zip(KNOB_NAMES, map(text, values))))
