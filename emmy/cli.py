"""The `emmy` command line: a thin layer over `emmy.optimize`.

Bad input is an EmmyError: one clear message, exit status 2, and a traceback
only with -v. torch is imported only by commands that capture a program.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from pathlib import Path

from emmy.errors import EmmyError, KernelFault
from emmy.program import STAGES

log = logging.getLogger("emmy")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="emmy", description="Compile PyTorch programs to CUDA kernels.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def optimizer_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--rules", dest="rule_files", action="append", default=[], metavar="FILE",
                       help="load a module of extra rulesets (repeatable)")
        p.add_argument("--exact", action="store_true",
                       help="rewrite with exact rules only: no rule that may change a result's bits")
        p.add_argument("--max-iterations", type=int, metavar="N", help="iterations per saturation phase")
        p.add_argument("--max-enodes", type=int, metavar="N",
                       help="e-nodes a saturation phase may add (per 10,000 e-nodes of the program)")
        p.add_argument("--max-seconds", type=float, metavar="S",
                       help="seconds per saturation phase (per 10,000 e-nodes of the program)")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", help="GPU architecture: sm_80, sm_89, sm_90, sm_120 (default: EMMY_TARGET or sm_90)")
        p.add_argument("-v", "--verbose", action="store_true", help="log progress; tracebacks on errors")

    def program_command(name: str, help_text: str) -> argparse.ArgumentParser:
        """A command that compiles -c code or a -f file: the program, knob pins, optimizer options,
        --target, -v."""
        p = sub.add_parser(name, help=help_text)
        source = p.add_mutually_exclusive_group(required=True)
        source.add_argument("-c", dest="code", metavar="CODE",
                            help="Python code whose last statement is the tensor expression to compile")
        source.add_argument("-f", dest="file", metavar="FILE", type=Path,
                            help="a Python file whose last statement is the tensor expression (as -c)")
        p.add_argument("--knobs", metavar="K=V,...", help="pin schedule knobs (overrides EMMY_KNOBS)")
        optimizer_options(p)
        common(p)
        return p

    compile_ = program_command("compile", "compile a program and print one stage")
    compile_.add_argument("--ir", default="tensor", metavar="STAGE", help=f"stage to print: {'|'.join(STAGES)}")
    compile_.add_argument("-o", dest="output", metavar="FILE", help="write the stage to FILE instead of stdout")

    schedules = program_command("schedules", "list every legal knob row of each kernel, with its cost estimate")
    schedules.add_argument("--limit", type=int, default=20, metavar="N",
                           help="rows to print per kernel, cheapest first (0: all; default 20)")

    explain = program_command("explain", "why the program came out as it did: budgets that ran out, what "
                                         "each kernel boundary and fold form's alternative would cost, and "
                                         "per kernel the chosen knob row and the next cheapest, term by term")
    explain.add_argument("--top", type=int, default=3, metavar="K", help="alternative rows to show per kernel "
                                                                         "(default 3)")
    explain.add_argument("--decisions", type=int, default=20, metavar="N",
                         help="extraction decisions to show, closest alternatives first (0: all; default 20)")

    run = program_command("run", "run the compiled program's kernels on a device (sim: the CPU simulator)")
    run.add_argument("--device", default="sim", metavar="DEVICE",
                     help="sim (the CPU simulator) or cuda (the GPU, built for --target); default sim")
    run.add_argument("--sim-mode", metavar="MODE",
                     help="simulator build: plain, asan (out-of-bounds checks) or racecheck "
                          "(default EMMY_SIM_MODE, else plain)")
    run.add_argument("--check", action="store_true", help="compare every output with torch; exit 1 on a mismatch")

    rules = sub.add_parser("rules", help="list the rulesets and rules, with their descriptions")
    rules.add_argument("--rules", dest="rule_files", action="append", default=[], metavar="FILE",
                       help="also load the rulesets of this Python module")
    rules.add_argument("--exact", action="store_true", help="list the exact rules only (what --exact keeps)")
    rules.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")

    suite = sub.add_parser("suite", help="compile the reference workloads and check them against torch")
    suite.add_argument("--ir", default="loop", metavar="STAGE", help="stage to print for each workload")
    suite.add_argument("--only", metavar="NAME", action="append", help="run only this workload (repeatable)")
    suite.add_argument("--quiet", action="store_true", help="print the summary table only")
    common(suite)
    return parser


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise EmmyError(f"unknown --ir stage {stage!r}; stages are {', '.join(STAGES)}")


def _check_target(target: str | None) -> None:
    if target is not None:
        from emmy.extract.targets import get_target

        get_target(target)


def _compile(args) -> int:
    _check_stage(args.ir)
    _check_target(args.target)
    from emmy.program import BUILT_STAGES

    if args.ir not in BUILT_STAGES:
        # Say so before paying for capture.
        from emmy.errors import StageNotBuiltError

        raise StageNotBuiltError(f"the {args.ir} stage is not built yet; stages so far: {', '.join(BUILT_STAGES)}")
    from emmy.api import optimize

    rules, budget = _optimizer_args(args)
    program = optimize(args.code or args.file, target=args.target, stop_after=args.ir, rules=rules, budget=budget,
                       knobs=args.knobs, capture_cache=True, exact=args.exact)
    text = program.ir(args.ir)
    if args.verbose and args.ir not in ("torch", "tensor"):
        result = program.loop_result
        for report in result.reports:
            print(report.render(), file=sys.stderr)
        if result.search is not None:
            print(result.search.render(), file=sys.stderr)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
        print(f"wrote {args.ir} IR to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def _optimizer_args(args):
    """User rule files and the saturation budget (flags override EMMY_EGRAPH_*)."""
    from emmy.config import settings
    from emmy.egraph.driver import Budget
    from emmy.rules import load_rules_file

    rules = tuple(g for path in args.rule_files for g in load_rules_file(path))
    config = settings()
    for flag in ("max_iterations", "max_enodes", "max_seconds"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise EmmyError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    budget = Budget(
        args.max_iterations or config.egraph_iterations,
        args.max_enodes or config.egraph_enodes,
        args.max_seconds or config.egraph_seconds,
    )
    return rules, budget


def _compiled(args, stop_after: str, capture_cache: bool = True):
    """The program of a `-c` command that also takes --target, --knobs and optimizer options,
    checking the cheap arguments before the slow capture (through the capture cache unless the
    command needs torch's own program, as checking against torch does)."""
    _check_target(args.target)
    from emmy.api import optimize

    rules, budget = _optimizer_args(args)
    return optimize(args.code or args.file, target=args.target, stop_after=stop_after, rules=rules, budget=budget,
                    knobs=args.knobs, capture_cache=capture_cache, exact=args.exact)


def _print_table(header: list[str], rows: list[list[str]], right: tuple[int, ...] = ()) -> None:
    from emmy.explain import table

    print("\n".join(table(header, rows, right)))


def _schedules(args) -> int:
    if args.limit < 0:
        raise EmmyError(f"--limit must be 0 (all) or positive, got {args.limit}")
    from emmy.schedule.knobs import KNOB_NAMES
    from emmy.schedule.shape import kernel_shape

    # Extraction already scheduled every kernel under the pins: pins no kernel can take fail there.
    program = _compiled(args, "loop")
    space = program.schedule_space()
    target = program.target
    for index, kernel in enumerate(program.loop_ir.kernels):
        shape = kernel_shape(kernel)
        rows = space.rows[kernel.name]
        costed = program.ranked_rows(kernel)
        print(f"=== {index}: {kernel.name} ({shape.describe()}) ===")
        print(f"{len(rows)} legal rows on {target.name}")
        shown = costed if args.limit == 0 else costed[:args.limit]
        table = [[f"{b.total_s * 1e6:.2f}"] + [getattr(b.row, k) or "-" for k in KNOB_NAMES] for b in shown]
        _print_table(["est us", *KNOB_NAMES], table, right=(0,))
        if len(shown) < len(rows):
            print(f"  ({len(rows) - len(shown)} more; --limit 0 shows all)")
    log.info("schedule space built in %.3f s", space.seconds)
    return 0


def _explain(args) -> int:
    if args.top < 0:
        raise EmmyError(f"--top must be 0 or more, got {args.top}")
    if args.decisions < 0:
        raise EmmyError(f"--decisions must be 0 (all) or more, got {args.decisions}")
    program = _compiled(args, "tile")
    sys.stdout.write(program.explain(args.top).render(args.decisions))
    return 0


def _run(args) -> int:
    from emmy.runtime import DEVICES

    if args.device not in DEVICES:
        raise EmmyError(f"unknown --device {args.device!r}; devices: {', '.join(DEVICES)}")
    from emmy.sim import MODES

    if args.sim_mode is not None and args.sim_mode not in MODES:
        raise EmmyError(f"unknown --sim-mode {args.sim_mode!r}; modes are {', '.join(MODES)}")
    program = _compiled(args, "tile", capture_cache=False)
    for kernel in program.kernel_ir:
        print(f"{kernel.name}: grid {kernel.grid[0]} x block {kernel.block[0]}  {kernel.knobs}")
    if not args.check:
        from emmy.runtime import run_program

        outputs = run_program(program, device=args.device, mode=args.sim_mode)
        for name, values in outputs.items():
            print(f"{name}: {values.dtype}{list(values.shape)} ran on {args.device}")
        return 0
    from emmy.runtime import check_program

    checks = check_program(program, device=args.device, mode=args.sim_mode)
    _print_table(["output", "dtype", "max abs err", "torch's own err", "err / scale", "bias ulps", "result"],
                 [[c.output, str(c.dtype), f"{c.max_abs:.3g}", "-" if c.torch_abs is None else f"{c.torch_abs:.3g}",
                   f"{c.max_rel:.3g}", f"{c.bias_ulps:+.2f}",
                   "ok" if c.ok else f"MISMATCH ({'leans one way' if c.why == 'bias' else 'beyond tolerance'})"]
                  for c in checks])
    return 0 if all(c.ok for c in checks) else 1


def _rules(args) -> int:
    from emmy.rules import builtin_groups, load_rules_file

    from emmy.rules import ScheduleRuleGroup

    loaded = [g for path in args.rule_files for g in load_rules_file(path)]
    groups = builtin_groups() + [g for g in loaded if not isinstance(g, ScheduleRuleGroup)]
    if args.exact:
        groups = [g.exact_only() for g in groups]
    for group in groups:
        print(f"{group.name}  (phase {group.phase}): {group.description}")
        width = max((len(r.name) for r in group.rules), default=0)
        for rule in group.rules:
            print(f"  {rule.name.ljust(width)}  {'exact' if rule.exact else 'approx'}  {rule.description}"
                  + ("" if rule.exact else f" [{rule.bound}; within {rule.ulps:g} ulp]"))
    from emmy.rules.schedules import SCHEDULE_DESCRIPTIONS

    print("schedules  (after extraction, on each kernel's e-class): every legal knob row")
    width = max(len(name) for name in SCHEDULE_DESCRIPTIONS)
    for name, description in SCHEDULE_DESCRIPTIONS.items():
        print(f"  {name.ljust(width)}  {description}")
    for group in loaded:
        if isinstance(group, ScheduleRuleGroup):
            print(f"{group.name}  (schedules, loaded): {group.description}")
    return 0


def _suite(args) -> int:
    _check_stage(args.ir)
    _check_target(args.target)
    from emmy.suite import run_suite

    return run_suite(stage=args.ir, target=args.target, only=args.only, quiet=args.quiet)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    # -v opens emmy's own logs; other libraries (egglog, torch, graphviz) stay at warnings.
    logging.basicConfig(level=logging.WARNING, format="emmy: %(message)s")
    logging.getLogger("emmy").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        commands = {"compile": _compile, "schedules": _schedules, "explain": _explain, "suite": _suite,
                    "rules": _rules, "run": _run}
        return commands[args.command](args)
    except EmmyError as err:
        if args.verbose:
            traceback.print_exc()
        print(f"emmy: error: {err.render()}", file=sys.stderr)
        return err.exit_code
    except KernelFault as fault:  # a kernel the simulator caught misbehaving: a failed check
        if args.verbose:
            traceback.print_exc()
        print(f"emmy: kernel fault: {fault}", file=sys.stderr)
        return fault.exit_code
    except KeyboardInterrupt:
        print("emmy: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug in emmy, not bad input
        if args.verbose:
            traceback.print_exc()
        print(f"emmy: internal error: {type(err).__name__}: {err} (rerun with -v for the traceback)", file=sys.stderr)
        return 1
