"""`emmy tune`'s measuring in worker processes, watched, so a hung or faulting candidate costs itself.

The parent starts one worker a device (`emmy tune ... --share i/n`; on a GPU, CUDA_VISIBLE_DEVICES
picks it), each measuring its share of the candidates (emmy.tune.run) and storing every row in the
measurement database as it goes. A worker prints a line before measuring a candidate (START) and
one after storing its row (STORED). The parent starts a worker again, with the time left and past
the rows stored since the tuning began, when it
- exits after a fault (tune.run stored the candidate's row as FAULT: the new worker skips it), or
  dies while measuring without storing one (the parent stores it as FAULT: the worker died);
- makes no progress for `watchdog` seconds while measuring (before its first candidate it
  compiles and builds, which a loaded machine may take minutes over: STARTUP_SECONDS, or ten
  watchdogs if longer): it is killed and the candidate stored as HUNG;
at most RESTARTS times a worker. A worker whose first process fails before measuring anything is an
error (its command cannot run).
"""

from __future__ import annotations

import datetime
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from emmy.errors import EmmyError

log = logging.getLogger(__name__)

START = "emmy-tune: measuring "
STORED = "emmy-tune: stored"
RESTARTS = 8
STARTUP_SECONDS = 600.0  # a worker's allowance before its first candidate (at least ten watchdogs)


def announcer(stream=None):
    """What a worker passes tune.run as `announce`: START <signature> <knobs>, or STORED, a line each."""
    out = stream or sys.stdout

    def announce(candidate) -> None:
        out.write(f"{START}{candidate.signature} {candidate.row}\n" if candidate is not None else f"{STORED}\n")
        out.flush()

    return announce


@dataclass
class _Worker:
    share: int
    gpu: str | None  # CUDA_VISIBLE_DEVICES for it; None: as the parent's
    process: subprocess.Popen | None = None
    current: tuple[str, str] | None = None  # (signature, knobs) it announced and has not stored
    progress_at: float = 0.0
    measured_any: bool = False  # this process announced a candidate (its startup allowance is over)
    ever_measured: bool = False  # any of its processes did: one that dies later is restarted, not an error
    restarts: int = 0
    pending: bytes = field(default=b"")
    on_stored: object = None  # called for each row it stores


def supervise(command: list[str], gpus: list[str | None], seconds: float, watchdog: float, record_lost,
              on_stored=None) -> list[str]:
    """Run `command` (the worker's argv, without --share, --seconds and --since) once per entry of
    `gpus`, watched as the module docstring says, until every worker has finished or the time is up.
    `record_lost(signature, knobs, error)` stores a row for a candidate a worker could not;
    `on_stored()` is called for each row a worker stores (a progress bar). Returns one line per
    event (a restart, a kill) for the caller to print."""
    since = datetime.datetime.now(datetime.timezone.utc).isoformat()
    deadline = time.monotonic() + seconds
    workers = [_Worker(i, gpu, on_stored=on_stored) for i, gpu in enumerate(gpus)]
    events: list[str] = []
    selector = selectors.DefaultSelector()
    for worker in workers:
        _start(worker, command, len(workers), deadline, since, selector)
    try:
        while any(w.process is not None for w in workers):
            for key, _ in selector.select(timeout=0.5):
                _read(key.data)
            now = time.monotonic()
            for worker in workers:
                if worker.process is None:
                    continue
                code = worker.process.poll()
                if code is None:
                    allowance = watchdog if worker.measured_any else max(STARTUP_SECONDS, 10 * watchdog)
                    if now - worker.progress_at > allowance:
                        _stop(worker, selector)
                        if worker.current is not None:
                            record_lost(*worker.current, f"hung: no result within {watchdog:g} s; the worker was killed")
                            events.append(f"worker {worker.share}: no progress for {allowance:g} s on "
                                          f"{worker.current[1]}: killed, its row recorded as hung")
                        else:
                            events.append(f"worker {worker.share}: no progress for {allowance:g} s: killed")
                        _again(worker, command, len(workers), deadline, since, selector, events)
                    continue
                _drain(worker, selector)
                worker.process = None
                if code == 0:
                    continue
                if not worker.ever_measured and worker.current is None:
                    raise EmmyError(f"tuning worker {worker.share} failed (exit status {code}) before measuring "
                                    "anything; its messages are above")
                if worker.current is not None:  # died measuring, its row unstored
                    record_lost(*worker.current, f"fault on the GPU: the worker died (exit status {code})")
                    events.append(f"worker {worker.share}: died (exit status {code}) measuring {worker.current[1]}: "
                                  "its row recorded as a fault, started again past it")
                else:
                    events.append(f"worker {worker.share}: exit status {code} (a fault, its row recorded): started "
                                  "again past it")
                _again(worker, command, len(workers), deadline, since, selector, events)
    finally:
        for worker in workers:
            if worker.process is not None:
                _stop(worker, selector)
        selector.close()
    return events


def _start(worker: _Worker, command: list[str], count: int, deadline: float, since: str, selector) -> None:
    env = dict(os.environ)
    if worker.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = worker.gpu
    left = max(1.0, deadline - time.monotonic())
    # a session of its own, so a kill takes its helpers (the simulator's ASan worker) with it
    worker.process = subprocess.Popen([*command, "--share", f"{worker.share}/{count}", "--seconds", f"{left:.1f}",
                                       "--since", since], stdout=subprocess.PIPE, env=env, start_new_session=True)
    # a new process: its startup allowance again, and nothing measured by it yet
    worker.current, worker.progress_at, worker.pending, worker.measured_any = None, time.monotonic(), b"", False
    os.set_blocking(worker.process.stdout.fileno(), False)
    selector.register(worker.process.stdout, selectors.EVENT_READ, worker)
    log.info("tuning worker %d started (pid %d)", worker.share, worker.process.pid)


def _again(worker: _Worker, command, count, deadline, since, selector, events: list[str]) -> None:
    if time.monotonic() >= deadline:
        worker.process = None
        return
    if worker.restarts >= RESTARTS:
        events.append(f"worker {worker.share}: {RESTARTS} restarts, its share left unmeasured")
        worker.process = None
        return
    worker.restarts += 1
    _start(worker, command, count, deadline, since, selector)


def _read(worker: _Worker) -> bool:
    """The lines the worker has printed so far, acted on. False when there is nothing more to read now."""
    try:
        data = os.read(worker.process.stdout.fileno(), 1 << 16)
    except BlockingIOError:
        return False
    if not data:
        return False
    *lines, worker.pending = (worker.pending + data).split(b"\n")
    for raw in lines:
        line = raw.decode(errors="replace")
        if line.startswith(START):
            signature, _, knobs = line[len(START):].partition(" ")
            worker.current, worker.measured_any, worker.ever_measured = (signature, knobs), True, True
            worker.progress_at = time.monotonic()
        elif line == STORED:
            worker.current, worker.progress_at = None, time.monotonic()
            if worker.on_stored is not None:
                worker.on_stored()
        elif line:
            print(line, flush=True)  # anything else the worker prints is the user's
    return True


def _drain(worker: _Worker, selector) -> None:
    """What an exited worker printed last, then its pipe closed."""
    while _read(worker):
        pass
    selector.unregister(worker.process.stdout)
    worker.process.stdout.close()


def _stop(worker: _Worker, selector) -> None:
    try:
        os.killpg(worker.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    worker.process.wait()
    _drain(worker, selector)
    worker.process = None
