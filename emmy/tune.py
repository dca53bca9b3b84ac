"""`emmy tune`: measure a program's candidate rows, record them, extract again.

For each kernel, costliest first, the candidates are the model's top rows and a share drawn for
exploration (EXPLORE_SHARE of the budget, from the rows the model ranks within EXPLORE_WITHIN of its
pick: the ones its error could reorder). Each candidate is the program with that kernel's row
replaced (Program.with_rows: the Loop IR is not rebuilt), checked against torch and timed on the
device (emmy.measure); every outcome, wrong ones too, becomes a row of the measurement database
(emmy.measure_db) labelled with where it was measured. Extraction then reads the GPU rows (a
simulator's never stand for a GPU). The measuring runs in worker processes, one a GPU, each its
share of the candidates (CUDA_VISIBLE_DEVICES), writing to the database as it goes, watched by the
parent (emmy.tune_workers): a worker that hangs or dies costs the candidate it was on, recorded as
such, and a new one goes on past it.
"""

from __future__ import annotations

import datetime
import random
import sys
import time
from dataclasses import dataclass

from emmy.measure_db import MeasuredRow

EXPLORE_SHARE = 0.25
EXPLORE_WITHIN = 4.0  # predicted time over the pick's
FAULT = "fault on the GPU: "  # a row's error when its candidate broke the CUDA context
HUNG = "hung: "  # a row's error when its candidate's worker made no progress (emmy.tune_workers)
LOST = (FAULT, HUNG)  # rows whose candidates a later run skips


@dataclass(frozen=True)
class Candidate:
    kernel: str  # the Loop IR kernel's name
    signature: str
    row: object  # emmy.schedule.knobs.Schedule
    predicted_s: float
    label: str  # "pick" (the model's choice), "top" or "explore"


def candidates(program, budget: int, seed: int = 0) -> list[Candidate]:
    """`budget` candidates a kernel at most (the pick included), costliest kernel first."""
    rng = random.Random(seed)
    found = []
    for tile in sorted(program.tile_ir.kernels, key=lambda tk: -tk.seconds):
        ranked = program.ranked_rows(tile.kernel)
        others = [b for b in ranked if b.row != tile.row]
        explore = min(int(budget * EXPLORE_SHARE), len(others))
        top = others[:max(0, budget - 1 - explore)]
        pool = [b for b in others[len(top):] if b.total_s <= EXPLORE_WITHIN * tile.seconds]
        drawn = rng.sample(pool, min(explore, len(pool)))
        found.append(Candidate(tile.kernel.name, tile.signature, tile.row, tile.seconds, "pick"))
        found += [Candidate(tile.kernel.name, tile.signature, b.row, b.total_s, "top") for b in top]
        found += [Candidate(tile.kernel.name, tile.signature, b.row, b.total_s, "explore") for b in drawn]
    return found


def measure_candidate(program, candidate: Candidate, device, inputs, references, variant=None,
                      built=None) -> MeasuredRow:
    """One candidate checked and timed on `device`, as a database row (wrong or refused: a row saying
    why). `variant`: the program with the candidate's row, when already made; `built`: its device code
    when `device.prepare` built it ahead."""
    from emmy.errors import EmmyError, KernelFault
    from emmy.gpu import GpuError
    from emmy.kernel_ir.lower import Unsupported
    from emmy.measure import Measured

    try:
        if variant is None:
            variant = program.with_rows({candidate.kernel: candidate.row})
        measured = device.measure(variant, inputs, references, built)  # a build's error raises from its load
    except GpuError as err:  # the CUDA context may be lost: recorded, then the tuner stops (run)
        measured = Measured(False, f"{FAULT}{str(err)[:500]}")
    except (Unsupported, KernelFault, EmmyError) as err:
        measured = Measured(False, f"{type(err).__name__}: {str(err)[:500]}")
    mine = [t for t in measured.times if t.name.startswith(candidate.kernel)]  # a split's fill or finish kernel too
    if not measured.correct or not mine:
        return failed_row(program, device, candidate.signature, str(candidate.row),
                          measured.why or "no kernel of it was timed")
    return MeasuredRow(**_row_base(program, device, candidate.signature, str(candidate.row)),
                       median_s=sum(t.median_s for t in mine), p10_s=sum(t.p10_s for t in mine),
                       p90_s=sum(t.p90_s for t in mine), repetitions=min(t.samples for t in mine), correct=True)


def failed_row(program, device, signature: str, knobs: str, error: str) -> MeasuredRow:
    """A candidate's row that records why it has no time (wrong, refused, faulted, hung)."""
    return MeasuredRow(**_row_base(program, device, signature, knobs), median_s=None, p10_s=None, p90_s=None,
                       repetitions=0, correct=False, error=error)


def _row_base(program, device, signature: str, knobs: str) -> dict:
    from emmy.extract.targets import measurement_key

    return dict(gpu=device.name, target=measurement_key(program.target.key), capability=device.capability,
                driver=device.driver, signature=signature, knobs=knobs, compiler=_compiler(),
                measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(), source=device.source)


def _compiler() -> str:
    from emmy.nvcc import nvcc_version

    return nvcc_version()


@dataclass(frozen=True)
class KernelReport:
    kernel: str
    signature: str
    measured: int
    wrong: int
    pick: MeasuredRow | None  # the model's pick before tuning, as measured
    best: MeasuredRow | None  # the fastest correct row measured
    predicted: dict  # knobs -> predicted seconds


def run(program, device, budget: int, seconds: float, store, share: tuple[int, int] = (0, 1),
        progress: bool = True, since: str = "", announce=None) -> list[MeasuredRow]:
    """Measure this share (index, count) of the candidates within `seconds`, each row stored as it
    comes (so a killed tuner keeps what it measured). Skipped: candidates that faulted or hung on
    this device before, and those with a row measured at or after `since` (an ISO time: a restarted
    worker goes on where the last one stopped). `announce(candidate)` is called before each is
    measured and `announce(None)` after its row is stored (emmy.tune_workers watches them). The
    rows, in order."""
    from emmy.checking import torch_comparison

    from emmy.errors import EmmyError

    skip = {(r.signature, r.knobs) for r in store.rows()
            if r.gpu == device.name and (r.error.startswith(LOST) or (since and r.measured_at >= since))}
    chosen = [c for c in candidates(program, budget)[share[0]::share[1]] if (c.signature, str(c.row)) not in skip]
    inputs = program.example_inputs
    where = "cuda" if device.source == "gpu" else "cpu"
    try:
        references = torch_comparison(program.captured, inputs, device=where)
    except Exception:  # noqa: BLE001 - torch without CUDA, or a graph with CPU-only pieces
        references = torch_comparison(program.captured, inputs)
    rows, start = [], time.perf_counter()
    variants, built = _built_ahead(program, chosen, device)
    bar = progress_bar(len(chosen), progress, f"tuning on {device.name}")
    for candidate, variant, code in zip(chosen, variants, built):
        if time.perf_counter() - start > seconds:
            break
        if announce is not None:
            announce(candidate)
        row = measure_candidate(program, candidate, device, inputs, references, variant, code)
        store.add([row])
        rows.append(row)
        if announce is not None:
            announce(None)
        bar.update(1)
        if row.error.startswith(FAULT):
            bar.close()
            raise EmmyError(f"{candidate.kernel} with {candidate.row} broke the GPU's CUDA context ({row.error}); "
                            f"its row is recorded as wrong with the {len(rows) - 1} measured before it, and a new "
                            "worker goes on past it")
    bar.close()
    return rows


def _built_ahead(program, chosen: list[Candidate], device) -> tuple[list, list]:
    """The candidates' programs, and their device code built by `device.prepare` before any is
    measured (on a GPU: many to an nvcc call, every core busy). A candidate the lowering refuses has
    no program (None): measuring it records why."""
    from emmy.errors import EmmyError

    variants = []
    for candidate in chosen:
        try:
            variant = program.with_rows({candidate.kernel: candidate.row})
            variant.kernel_ir  # noqa: B018 - lowered now, so a refusal shows here, not inside a batch
            variants.append(variant)
        except EmmyError:
            variants.append(None)
    made = [v for v in variants if v is not None]
    ready = iter(device.prepare(made))
    return variants, [next(ready) if v is not None else None for v in variants]


def progress_bar(total: int, show: bool, what: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="row", file=sys.stderr, disable=not show, leave=False)


def report(program, rows: list[MeasuredRow]) -> list[KernelReport]:
    """Per kernel: how many rows were measured (and wrong), the model's pick as measured, the best."""
    found = []
    for tile in sorted(program.tile_ir.kernels, key=lambda tk: -tk.seconds):
        mine = [r for r in rows if r.signature == tile.signature]
        if not mine:
            continue
        good = [r for r in mine if r.correct]
        pick = next((r for r in mine if r.knobs == str(tile.row)), None)
        predicted = {str(b.row): b.total_s for b in program.ranked_rows(tile.kernel)}
        found.append(KernelReport(tile.kernel.name, tile.signature, len(mine), len(mine) - len(good), pick,
                                  min(good, key=lambda r: r.median_s) if good else None, predicted))
    return found
