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

    tune = program_command("tune", "measure the model's top rows of each kernel and a share drawn for "
                                   "exploration, record every row in the measurement database, extract again")
    tune.add_argument("--budget", type=int, default=12, metavar="N", help="rows to measure per kernel (default 12)")
    tune.add_argument("--seconds", type=float, default=600.0, metavar="S", help="time limit (default 600)")
    tune.add_argument("--gpus", metavar="LIST", help="GPU indices to measure on at once, one worker each "
                                                     "(e.g. 0,1; default: the first GPU)")
    tune.add_argument("--device", choices=("cuda", "sim"), default="cuda",
                      help="cuda (default) or sim: the CPU simulator, to check the tuner's steps (its times "
                           "are recorded as simulator rows and never used for a GPU)")
    tune.add_argument("--watchdog", type=float, default=60.0, metavar="S",
                      help="a worker with no result for S seconds is killed, its candidate recorded as hung "
                           "(default 60)")
    tune.add_argument("--share", help=argparse.SUPPRESS)  # i/n: a worker's part of the candidates
    tune.add_argument("--since", default="", help=argparse.SUPPRESS)  # a restarted worker skips rows from then on

    bench = sub.add_parser("bench", help="emmy against torch eager and torch.compile on a GPU, timed alike: "
                                         "a table, bench.json and bench.png")
    what = bench.add_mutually_exclusive_group(required=True)
    what.add_argument("-c", dest="code", metavar="CODE", help="Python code whose last statement is the expression")
    what.add_argument("-f", dest="file", metavar="FILE", type=Path, help="a Python file of such code")
    what.add_argument("--suite", help="a calibration suite's programs (small)")
    bench.add_argument("--target", help="GPU to compile for (default: the machine's GPU)")
    bench.add_argument("-o", dest="output", type=Path, default=Path("."), metavar="DIR",
                       help="where bench.json and bench.png go (default: here)")
    bench.add_argument("-v", "--verbose", action="store_true", help="log progress; tracebacks on errors")

    calibrate = sub.add_parser("calibrate", help="fit the cost model's free parameters for a GPU to measured rows "
                                                 "and report its fidelity on held-out rows, before and after")
    calibrate.add_argument("--suite", default="small", help="the programs to measure and fit on (default small)")
    calibrate.add_argument("--seconds", type=float, default=600.0, metavar="S", help="time limit for measuring")
    calibrate.add_argument("--budget", type=int, default=8, metavar="N", help="rows to measure per kernel (default 8)")
    calibrate.add_argument("--from-db", action="store_true",
                           help="measure nothing: fit to the rows the measurement database (and emmy/data) hold")
    calibrate.add_argument("--target", help="the GPU to fit (default: the machine's GPU; with --from-db, EMMY_TARGET)")
    calibrate.add_argument("-o", dest="output", type=Path, metavar="FILE",
                           help="the fitted factors (default EMMY_CALIBRATION_DIR/<gpu>.json, which emmy then "
                                "prices the GPU with; a PNG beside it)")
    calibrate.add_argument("-v", "--verbose", action="store_true", help="log progress; tracebacks on errors")

    db = sub.add_parser("db", help="the measurement database (EMMY_DB): export or import rows as JSON")
    db.add_argument("action", choices=("export", "import", "path"), help="export rows, import a file, or print its path")
    db.add_argument("file", nargs="?", type=Path, help="import: the JSON file to read")
    db.add_argument("-o", dest="output", type=Path, metavar="FILE", help="export: write here (default: stdout)")
    db.add_argument("--target", help="export: only this GPU's rows (h200, sm_90, ...)")
    db.add_argument("--source", choices=("gpu", "simulator"), help="export: only rows measured there")
    db.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    return parser


def _tune(args) -> int:
    import time

    from emmy import tune
    from emmy.measure import GpuDevice, NoGpuError, SimDevice
    from emmy.measure_db import MeasurementDb
    from emmy.tune_workers import announcer, supervise

    if args.budget < 1:
        raise EmmyError(f"--budget must be at least 1 row a kernel, got {args.budget}")
    if args.seconds <= 0:
        raise EmmyError(f"--seconds must be positive, got {args.seconds}")
    if args.watchdog <= 0:
        raise EmmyError(f"--watchdog must be positive, got {args.watchdog}")
    gpus = _gpu_list(args.gpus)
    try:
        device = GpuDevice() if args.device == "cuda" else SimDevice()  # no GPU: one line, exit 2, before compiling
    except NoGpuError as err:
        raise NoGpuError(f"{err}; --device sim runs the same steps on the CPU simulator") from None
    program = _compiled(args, "tile", capture_cache=False)
    if args.share:  # a worker: its share measured and stored, each candidate announced to the parent
        index, count = (int(v) for v in args.share.split("/"))
        with MeasurementDb() as store:
            tune.run(program, device, args.budget, args.seconds, store, (index, count), progress=False,
                     since=args.since, announce=announcer())
        return 0
    started = time.time()
    # the measuring runs in watched workers, one a GPU (emmy.tune_workers): a hung or faulting
    # candidate costs itself, not the run
    command = [sys.executable, "-m", "emmy", *_without(sys.argv[1:], ("--gpus", "--seconds", "--watchdog"))]
    slots = gpus if (gpus and args.device == "cuda") else [None]
    with MeasurementDb() as store:
        bar = tune.progress_bar(len(tune.candidates(program, args.budget)), True, f"tuning on {device.name}")

        def record_lost(signature: str, knobs: str, error: str) -> None:
            store.add([tune.failed_row(program, device, signature, knobs, error)])
            bar.update(1)

        events = supervise(command, slots, args.seconds, args.watchdog, record_lost, on_stored=lambda: bar.update(1))
        bar.close()
        signatures = {tk.signature for tk in program.tile_ir.kernels}
        rows = [r for r in store.rows() if r.signature in signatures and r.measured_at >= _iso(started)]
        where = store.path
    for event in events:
        print(event)
    _print_tuning(program, device, rows, time.time() - started, where)
    if device.source == "gpu":
        again = _compiled(args, "tile", capture_cache=False)
        print("extraction with the measurements picks: " + "; ".join(
            f"{tk.kernel.name} {tk.row} ({tk.seconds * 1e6:.2f} us)" for tk in again.tile_ir.kernels))
    return 0


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`argv` less the given options and their values (`--x V` or `--x=V`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif not any(arg.startswith(f"{o}=") for o in options):
            kept.append(arg)
    return kept


def _gpu_list(text: str | None) -> list[str]:
    if not text:
        return []
    gpus = [g.strip() for g in text.split(",")]
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise EmmyError(f"--gpus takes distinct GPU indices separated by commas, like 0,1; got {text!r}")
    return gpus


def _iso(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def _print_tuning(program, device, rows, elapsed: float, where) -> None:
    from emmy import tune

    kind = ("GPU seconds" if device.source == "gpu" else
            "simulator seconds, not GPU figures: recorded as simulator rows, never used to extract for a GPU")
    print(f"measured {len(rows)} rows on {device.name} in {elapsed:.1f} s ({kind}); recorded in {where}")
    table = []
    for k in tune.report(program, rows):
        pick = k.pick
        shown = "-" if pick is None else (f"{pick.knobs}  {k.predicted.get(pick.knobs, 0) * 1e6:.2f} us -> "
                                          + (f"{pick.median_s * 1e6:.2f} us" if pick.correct else "WRONG"))
        best = "-" if k.best is None else f"{k.best.knobs}  {k.best.median_s * 1e6:.2f} us"
        if k.best is not None and pick is not None and pick.correct:
            best += f" ({pick.median_s / k.best.median_s:.2f}x the pick)"
        table.append([k.kernel, str(k.measured), str(k.wrong), shown, best])
    _print_table(["kernel", "rows", "wrong", "model's pick: predicted -> measured", "measured best"], table)


def _bench(args) -> int:
    from emmy import bench, calibrate
    from emmy.extract.targets import gpu_key
    from emmy.measure import GpuDevice

    if args.suite is not None and args.suite not in calibrate.SUITES:
        raise EmmyError(f"unknown --suite {args.suite!r}; suites: {', '.join(calibrate.SUITES)}")
    device = GpuDevice()  # no GPU: one line, exit 2, before anything is compiled
    target = args.target or gpu_key(device.name) or "sm_90"
    if args.suite:
        programs = list(calibrate.SUITES[args.suite])
    elif args.file is not None:
        try:
            programs = [(args.file.stem, args.file.read_text())]
        except OSError as err:
            raise EmmyError(f"cannot read {args.file}: {err.strerror}") from None
    else:
        programs = [("-c code", args.code)]
    rows = [bench.bench_one(name, code, target, device) for name, code in programs]
    _print_table(bench.HEADER, bench.table_rows(rows))
    bench.write(rows, args.output, device.name)
    print(f"wrote {args.output / 'bench.json'} and {args.output / 'bench.png'} ({device.name}, target {target})")
    return 0


def _calibrate(args) -> int:
    import json
    import time

    from emmy import calibrate
    from emmy.api import optimize
    from emmy.config import settings
    from emmy.extract.targets import get_target, gpu_key
    from emmy.measure_db import MeasurementDb
    from emmy.schedule.measured import shipped_rows

    if args.suite not in calibrate.SUITES:
        raise EmmyError(f"unknown --suite {args.suite!r}; suites: {', '.join(calibrate.SUITES)}")
    if args.from_db:  # fitted against the cited figures, never over an earlier fit
        target = get_target(args.target or settings().target, calibrated=False)
    else:
        from emmy.measure import GpuDevice

        device = GpuDevice()  # no GPU: one line, exit 2
        key = gpu_key(device.name)
        if key is None:
            raise EmmyError(f"emmy has no figures for {device.name} to calibrate; known GPUs are in extract/targets.py")
        target = get_target(args.target or key, calibrated=False)
    programs = [optimize(code, target=target.key) for _, code in calibrate.SUITES[args.suite]] if not args.from_db \
        else None
    with MeasurementDb() as store:
        if not args.from_db:
            from emmy import tune

            deadline = time.monotonic() + args.seconds  # --seconds bounds the whole suite, not each program
            for program in programs:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                tune.run(program, device, args.budget, left, store)
        rows = [r for r in store.rows() if r.target == target.key and r.source == "gpu"]
    rows += [r for r in shipped_rows() if r.target == target.key]
    if sum(r.correct for r in rows) < len(calibrate.FREE):
        raise EmmyError(f"{sum(r.correct for r in rows)} measured rows for {target.title}: too few to fit "
                        f"{len(calibrate.FREE)} parameters (measure with `emmy calibrate` or `emmy tune` on the GPU)")
    programs = programs or [optimize(code, target=target.key) for _, code in calibrate.SUITES[args.suite]]
    found = calibrate.samples(programs, rows)
    train = [s for s in found if not calibrate.held_out(s)]
    test = [s for s in found if calibrate.held_out(s)] or train
    if len(train) < len(calibrate.FREE):
        raise EmmyError(f"{len(train)} measured rows of the {args.suite} suite's kernels on {target.title}: too few to "
                        f"fit {len(calibrate.FREE)} parameters (measure with `emmy calibrate` or `emmy tune` on the GPU)")
    factors = calibrate.fit(train, target)
    after = calibrate.calibrated(target, factors)
    before_f, after_f = calibrate.fidelity(test, target), calibrate.fidelity(test, after)
    output = args.output or settings().calibration_dir / f"{target.key}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"gpu": target.key, "suite": args.suite, "rows": len(found), "factors": factors,
                                  "held_out_before": before_f.line(), "held_out_after": after_f.line()}, indent=1) + "\n")
    calibrate.plot(output.with_suffix(".png"), test, target, after)
    _print_table(["parameter", "datasheet or measured", "factor", "fitted"],
                 [[name, f"{getattr(target, name):.4g}", f"{factors[name]:.3f}", f"{getattr(after, name):.4g}"]
                  for name in calibrate.FREE])
    print(f"held out, before: {before_f.line()}")
    print(f"held out, after:  {after_f.line()}")
    print(f"wrote {output} and {output.with_suffix('.png')}"
          + ("; emmy prices this GPU with the fit from now on" if output.parent == settings().calibration_dir else ""))
    return 0


def _db(args) -> int:
    from emmy.measure_db import MeasurementDb, default_path

    if args.action == "path":
        print(default_path())
        return 0
    if args.action == "import":
        if args.file is None:
            raise EmmyError("emmy db import needs the JSON file to read (one `emmy db export` wrote)")
        try:
            text = args.file.read_text()
        except OSError as err:
            raise EmmyError(f"cannot read {args.file}: {err.strerror}") from None
        with MeasurementDb() as store:
            added, skipped = store.import_json(text, str(args.file))
        for line in skipped:
            print(f"skipped: {line}", file=sys.stderr)
        print(f"imported {added} rows into {store.path}" + (f"; skipped {len(skipped)}" if skipped else ""))
        return 2 if skipped and not added else 0
    target = None
    if args.target:
        from emmy.extract.targets import get_target, measurement_key

        target = measurement_key(get_target(args.target).key)
    with MeasurementDb() as store:
        text = store.export_json(target, args.source)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


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
    from emmy.api import capture_ahead, optimize

    if args.ir != "torch":  # --ir torch prints the capture itself: nothing to overlap it with
        capture_ahead(args.code or args.file)
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
    from emmy.api import capture_ahead, optimize

    if capture_cache:
        capture_ahead(args.code or args.file)
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
    # checking runs torch's own program, so it captures afresh; a plain run reuses a cached capture
    program = _compiled(args, "tile", capture_cache=not args.check)
    for kernel in program.kernel_ir:
        print(f"{kernel.name}: grid {kernel.grid[0]} x block {kernel.block[0]}  {kernel.knobs}")
    if not args.check:
        from emmy.runtime import run_program

        outputs = run_program(program, device=args.device, mode=args.sim_mode)
        for name, values in outputs.items():
            print(f"{name}: {values.dtype}{list(values.shape)} ran on {args.device}")
        for _, tensor in program.tensor_program.empty_outputs:
            print(f"an output of {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}: no elements, "
                  "nothing to compute")
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
                    "rules": _rules, "run": _run, "db": _db, "tune": _tune,
                    "calibrate": _calibrate, "bench": _bench}
        return commands[args.command](args)
    except KernelFault as fault:  # a kernel the simulator caught misbehaving: a failed check
        if args.verbose:
            traceback.print_exc()
        print(f"emmy: kernel fault: {fault}", file=sys.stderr)
        return fault.exit_code
    except EmmyError as err:
        if args.verbose:
            traceback.print_exc()
        print(f"emmy: error: {err.render()}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("emmy: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug in emmy, not bad input
        if args.verbose:
            traceback.print_exc()
        print(f"emmy: internal error: {type(err).__name__}: {err} (rerun with -v for the traceback)", file=sys.stderr)
        return 1


def console_main() -> None:
    """The `emmy` command: main(), then a quick exit. Tearing down an interpreter that imported
    torch and egglog takes most of a second, a quarter of a small compile; every file emmy writes
    is closed and every database row committed before main returns, so the exit handlers run and
    the process ends without the teardown."""
    import atexit
    import logging
    import os

    try:
        code = main()
    except SystemExit as stop:  # argparse's --help and usage errors
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
