"""The public entry point."""

from __future__ import annotations

import os

from emmy.errors import UnknownParameterError, UnknownStageError
from emmy.program import STAGES, Program


def optimize(graph, *example_inputs, target: str | None = None, stop_after: str = "tensor",
             rules: tuple = (), budget=None, knobs=None, capture_cache: bool = False, exact: bool = False,
             example_kwargs: dict | None = None, **unknown) -> Program:
    """Compile a PyTorch program.

    `graph` is `-c`-style code (a string) or a file of it (a pathlib.Path), an `nn.Module` or `fx.GraphModule`
    or plain function (with example inputs), or an ExportedProgram. A module or function called with
    keyword arguments (`model(ids, attention_mask=mask)`) takes them as `example_kwargs`, a dict
    (not as keywords of optimize, whose own names a model's could meet); the program is then
    called the same way, `program(ids, attention_mask=mask)`. The target
    defaults to EMMY_TARGET, else sm_90. Every stage up to `stop_after` (one of emmy.program.STAGES:
    torch, tensor, loop, tile, kernel, cuda) is built now, so its errors surface here; later stages
    build when asked (calling the program builds them all).
    `rules` adds rule groups (emmy.rules.RuleGroup, and ScheduleRuleGroup for schedule rules) to the built-in ones;
    `budget` (emmy.egraph.driver.Budget) bounds saturation, by default from
    EMMY_EGRAPH_* settings. `knobs` pins schedule knobs for every kernel
    (`"K=V,..."` or an emmy.schedule.knobs.Schedule; default EMMY_KNOBS). `capture_cache`: for code
    strings and files, reuse (or remember) what capture and decomposition made of the same code in the
    on-disk cache (emmy.capture.cache), so a repeat needs no torch; such a program's
    `captured` is a CachedCapture (no ExportedProgram: checking against torch recaptures).
    `exact`: rewrite with exact rules only (emmy.rules.Rule.exact), so no rule changes a result's bits.
    """
    if unknown:
        raise UnknownParameterError(
            f"optimize() takes no keyword {', '.join(map(repr, unknown))}; a model's keyword inputs go in "
            f"example_kwargs (emmy.optimize(model, x, example_kwargs={{{', '.join(f'{k!r}: ...' for k in unknown)}}}))")
    from emmy.config import settings
    from emmy.extract.targets import get_target

    from emmy.schedule.knobs import Schedule, check_target, parse_pins

    if stop_after not in STAGES:
        raise UnknownStageError(f"unknown stop_after stage {stop_after!r}; stages are {', '.join(STAGES)}")
    config = settings()
    # The pins are checked here, once (spelling, then what the target allows), before the slow capture.
    chosen = get_target(target or config.target)
    pins = knobs if isinstance(knobs, Schedule) else parse_pins(config.knobs if knobs is None else knobs)
    check_target(pins, chosen)
    from emmy.capture import capture
    groups, schedule_rules, budget = _optimizer_setup(rules, budget, config, exact)
    cached = None
    code = None
    if capture_cache and isinstance(graph, (str, os.PathLike)):
        from emmy.capture import program_text
        from emmy.capture.cache import lookup

        code = program_text(graph)[0]
        _wait_for_capture_ahead(code)
        cached = lookup(code, config.cache_dir)
    program = Program(cached or capture(graph, *example_inputs, example_kwargs=example_kwargs), chosen, groups, budget, pins,
                      schedule_rules=schedule_rules)
    if code is not None and cached is None:
        from emmy.capture.cache import store

        store(code, program, config.cache_dir)  # decomposes now: unsupported ops fail here as below
    for stage in STAGES[1:STAGES.index(stop_after) + 1]:  # build now, so each stage's errors surface here
        getattr(program, _BUILT_BY[stage])
    return program


def capture_ahead(graph) -> None:
    """Start capturing `-c` code or a program file into the capture cache in a forked process, so
    that torch's imports and torch.export (most of a cold compile) overlap with loading egglog and
    the rules here; the next `optimize(..., capture_cache=True)` of the same code waits for it.
    Does nothing where the entry is cached already, for other graph forms, without os.fork, or once
    torch is imported here (nothing left to overlap, and forking a process whose torch started its
    thread pools is unsafe). The child reports nothing: if it fails, optimize captures again here
    and reports the error. Code that does not parse (or does not end in an expression) is refused
    here, at once."""
    import sys

    if not isinstance(graph, (str, os.PathLike)) or not hasattr(os, "fork") or "torch" in sys.modules:
        return
    from emmy.capture import program_text
    from emmy.capture.cache import is_cached
    from emmy.capture.source import parse_program
    from emmy.config import settings

    try:
        code, label = program_text(graph)
    except Exception:  # optimize reports an unreadable file
        return
    parse_program(code, label)  # code that does not parse is refused now, not after a second of torch imports
    cache_dir = settings().cache_dir
    if is_cached(code, cache_dir) or code in _AHEAD:
        return
    pid = os.fork()
    if pid == 0:  # the child: capture, decompose, store, and leave without running the parent's exit code
        import gc

        gc.disable()  # a short-lived process: cyclic collection would only slow torch's imports (by a fifth)
        status = 1
        try:
            quiet = os.open(os.devnull, os.O_WRONLY)  # the parent speaks for the capture (its errors included)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            from emmy.capture import capture
            from emmy.capture.cache import store

            store(code, Program(capture(code), None), cache_dir)
            status = 0
        finally:
            os._exit(status)
    _AHEAD[code] = pid


_AHEAD: dict[str, int] = {}  # code -> the pid capturing it ahead


def _wait_for_capture_ahead(code: str) -> None:
    pid = _AHEAD.pop(code, None)
    if pid is not None:
        # while the child captures: import what the later stages run (a tenth of a second of a cold compile)
        import importlib

        for module in ("emmy.decompose.from_aten", "emmy.egraph.extract", "emmy.tile_ir.build", "emmy.kernel_ir.lower",
                       "emmy.kernel_ir.cuda"):
            importlib.import_module(module)

        os.waitpid(pid, 0)


# The Program attribute that builds each stage.
_BUILT_BY = {"tensor": "tensor_program", "loop": "loop_result", "tile": "tile_ir", "kernel": "kernel_ir",
             "cuda": "cuda_source"}


def _optimizer_setup(rules, budget, config, exact: bool = False):
    from emmy.egraph.driver import Budget
    from emmy.rules import ScheduleRuleGroup, builtin_groups

    schedule_rules = tuple(g for g in rules if isinstance(g, ScheduleRuleGroup))
    groups = tuple(builtin_groups()) + tuple(g for g in rules if not isinstance(g, ScheduleRuleGroup))
    if exact:
        groups = tuple(g.exact_only() for g in groups)
    if budget is None:
        budget = Budget(config.egraph_iterations, config.egraph_enodes, config.egraph_seconds)
    return groups, schedule_rules, budget
