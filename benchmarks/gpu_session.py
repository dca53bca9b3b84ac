"""A short GPU window's work in one script: every workload checked on the GPU against torch, the
model's candidate rows of the GPU-sized programs measured (its top rows and a random share for
exploration), emmy timed against torch eager and torch.compile, and a report with the rows,
predicted against measured.

    python benchmarks/gpu_session.py [--dry-run] [--seconds 360] [--out benchmarks/results] [--only NAME]

Each job (a program: its chosen rows, and for tuned jobs its candidates) runs in a worker process
of its own: it compiles and builds its variants' device code (emmy.batch_build: many variants to an
nvcc call, a call per core it is given; loaded through the driver API by emmy.module_gpu) while other
workers use the GPU, then takes the GPU lock (one worker on the GPU at a time) to compute the
reference (torch on the GPU, float64), check and time. A candidate is timed only after its outputs,
poisoned before the run, match the reference; a candidate that faults ends its worker, which the
parent starts again past it; a worker that makes no progress for WATCHDOG_SECONDS is killed and its
candidate recorded as hung. At the time limit the workers are stopped and the report is written from
what was measured.

Timing is emmy.measure's (per kernel: CUDA events around each launch with 256 MB overwritten before
it, samples until the median settles, median with p10/p90; back-to-back batches beside it for
kernels under 20 us); torch is timed the same way around one call of the program.

--dry-run (no GPU needed) compiles every job and builds everything it would run, then prints the
plan and a time estimate.

On a GPU machine with no network (Python 3.12, torch with CUDA, nvcc): make the wheels here with
`bash benchmarks/gpu_wheels.sh`, take `.whl/` along, and there run

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/gpu_session.py --seconds 360 --out /tmp/gs

The report (report.md), every row (results.json), the plot and the simulator comparison land in
OUT/<date>-<gpu>/; commit them under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import fcntl
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("emmy") is None:  # installed: a wheel on a GPU machine, editable here
    sys.path.insert(0, str(ROOT))

WATCHDOG_SECONDS = 45.0  # a worker silent this long on one candidate is hung (a variant takes seconds)


@dataclasses.dataclass(frozen=True)
class Job:
    """A program to check and time: `top` of the model's ranked rows of its costliest kernel and
    `explore` drawn at random from the rest are measured beside the chosen one; `versus_torch`:
    torch eager and torch.compile timed on the same program."""
    name: str
    code: str
    top: int = 0
    explore: int = 0
    versus_torch: bool = False


# candidates (model's top rows, drawn rows) per suite program; others take (4, 4)
CANDIDATES = {"layer_norm_chw_16x64x256x256": (2, 2), "layernorm_16384x4096": (3, 3), "gelu_linear_8192x4096x4096": (2, 2),
              "attention_causal_4x16x4096x64": (3, 3), "softmax_16384x4096": (2, 2), "layernorm_bf16_16384x4096": (3, 3)}


def _gpu_suite() -> list[Job]:
    """The calibration suite's programs at GPU sizes (emmy.calibrate.SUITES["small"])."""
    from emmy.calibrate import SUITES

    return [Job(f"suite/{name}", code, *CANDIDATES.get(name, (4, 4)), True) for name, code in SUITES["small"]]


# Programs checked beside the workloads, for what a GPU alone can show: rows too long to hold keep
# the one-pass softmax, whose sum the 2026-12-04 run found leaning with the GPU's exp (its rescales
# are now emmy::rescale_exp, and its max term joins the sum by one exp, as its numerator does).
EXTRA_CHECKS = {"softmax_one_pass": "x = torch.randn(16, 65536); torch.softmax(x, -1)"}


def plan() -> list[Job]:
    """The smoke job first (a failure there ends the session early), then every workload at its own
    shape (and its benchmark shape) and the extra checks, then the GPU-sized suite."""
    from emmy.workloads import WORKLOADS

    jobs = [Job("check/add3", next(w.code for w in WORKLOADS if w.name == "add3"))]
    for w in WORKLOADS:
        if w.name != "add3":
            jobs.append(Job(f"check/{w.name}", w.code, versus_torch=False))
        if w.bench_code:
            jobs.append(Job(f"check/{w.name}@bench", w.bench_code))
    jobs += [Job(f"check/{name}", code) for name, code in EXTRA_CHECKS.items()]
    return jobs + _gpu_suite()


# ---- the worker: one job ------------------------------------------------------------------------

class Rows:
    """The worker's results, one JSON line each, flushed at once (a killed worker loses nothing)."""

    def __init__(self, path: Path, job: str):
        self.path, self.job = path, job
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, **fields) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"job": self.job, "time": time.time(), **fields}, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


@contextlib.contextmanager
def gpu_lock(out: Path):
    """One worker on the GPU at a time (an flock: released if its holder dies)."""
    with open(out / "gpu.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def variants(program, job: Job) -> list[tuple[str, object, list]]:
    """(label, program, [kernel row records]) for the chosen rows and the job's candidates, which
    vary the costliest kernel's row (the others keep the model's choice)."""
    chosen = [_row_record(tk.kernel.name, tk.breakdown, tk.seconds, tk.row, tk.signature)
              for tk in program.tile_ir.kernels]
    found = [("chosen", program, chosen)]
    if not (job.top or job.explore):
        return found
    costliest = max(program.tile_ir.kernels, key=lambda tk: tk.seconds)
    others = [b for b in program.ranked_rows(costliest.kernel) if b.row != costliest.row]
    draws = random.Random(job.name).sample(others[job.top:], min(job.explore, len(others[job.top:])))
    for label, b in [*((f"top{i + 2}", b) for i, b in enumerate(others[:job.top])), *(("explore", b) for b in draws)]:
        name = costliest.kernel.name
        records = [r if r["kernel"] != name else _row_record(name, b, b.total_s, b.row, costliest.signature)
                   for r in chosen]
        found.append((label, program.with_rows({name: b.row}), records))
    return found


def _row_record(kernel: str, breakdown, seconds: float, row, signature: str) -> dict:
    """What the model said of a kernel's row: its knobs, predicted seconds and cost terms."""
    return {"kernel": kernel, "knobs": str(row), "predicted_s": seconds, "signature": signature,
            "terms": breakdown.terms() if breakdown is not None else {}}


def time_kernel(on_gpu, index: int, flush) -> dict:
    """One Kernel IR kernel's launch times (emmy.measure.time_on_gpu), in this script's rows (ms)."""
    from emmy.measure import time_on_gpu

    k, t = on_gpu.kernels[index], time_on_gpu(on_gpu, index, flush)
    found = {"name": k.name, "grid": list(_dims(k.grid)), "block": list(_dims(k.block)), "median_ms": t.median_s * 1e3,
             "p10_ms": t.p10_s * 1e3, "p90_ms": t.p90_s * 1e3, "samples": t.samples}
    return found | ({"warm_ms": t.warm_s * 1e3} if t.warm_s is not None else {})


def _dims(v) -> tuple:
    return ((v,) if isinstance(v, int) else tuple(v)) + (1,) * (3 - (1 if isinstance(v, int) else len(v)))


def time_torch(fn, args, flush) -> dict:
    """A torch callable timed like emmy's kernels (emmy.measure.time_torch), in this script's rows (ms)."""
    from emmy.measure import time_torch as timed

    median, p10, p90, samples = timed(fn, args, flush)
    return {"median_ms": median * 1e3, "p10_ms": p10 * 1e3, "p90_ms": p90 * 1e3, "samples": samples}


def run_worker(job: Job, args) -> int:
    import emmy
    from emmy.batch_build import build_programs
    from emmy.gpu import GpuError, ProgramOnGpu
    from emmy.kernel_ir.lower import Unsupported
    from emmy.module_gpu import ModuleGpu, loader_library
    from emmy.runtime import compare_outputs, host_buffers

    out = Path(args.out)
    rows = Rows(out / "rows" / (job.name.replace("/", "__") + ".jsonl"), job.name)
    work = Path(args.work)
    started = time.perf_counter()
    program = emmy.optimize(job.code, target=f"sm_{args.arch}")
    built = []
    for label, variant, records in variants(program, job):
        try:
            variant.cuda_source  # noqa: B018 - the lowering may refuse a row
            built.append((label, variant, records))
        except Unsupported as refused:
            rows.add(kind="variant", label=label, kernels=records, error=f"not lowered: {refused}")
    # every variant's device code, many to an nvcc call (emmy.batch_build), loaded through the driver
    # API; should that loader fail here, each variant gets a host library of its own as before
    cubins = build_programs([(v.cuda_source, [k.name for k in v.kernel_ir]) for _, v, _ in built],
                            f"sm_{args.arch}", cache_dir=work, jobs=args.threads)
    loader_library(work)
    compiled_s = time.perf_counter() - started
    if args.dry:
        rows.add(kind="plan", variants=len(built), compile_s=compiled_s,
                 predicted_s=[sum(r["predicted_s"] for r in records) for _, _, records in built])
        print(f"{job.name}: {len(built)} variants in {len({c.cubin for c in cubins})} nvcc units, compiled in "
              f"{compiled_s:.1f}s", flush=True)
        return 0
    loader_failed = ""

    import torch

    inputs = program.example_inputs
    with gpu_lock(out):
        from emmy.measure import FLUSH_BYTES

        flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        if args.skip == 0:
            rows.add(kind="compiled", seconds=compiled_s, variants=len(built), least_bytes=least_bytes(program))
        from emmy.checking import torch_comparison

        try:
            references = torch_comparison(program.captured, inputs, device="cuda")
            where = "cuda"
        except Exception as err:  # noqa: BLE001 - a graph with CPU-only pieces: the CPU reference
            rows.add(kind="note", text=f"reference on the CPU: torch on the GPU failed: {type(err).__name__}: {err}")
            references, where = torch_comparison(program.captured, inputs), "cpu"
        for index, (label, variant, records) in enumerate(built):
            if index < args.skip:
                continue
            if time.time() > args.deadline:
                rows.add(kind="stopped", text="time limit")
                return 0
            rows.add(kind="start", index=index)
            on_gpu = loaded = None
            try:
                host = host_buffers(variant, inputs)
                if not loader_failed:
                    try:
                        loaded = ModuleGpu(cubins[index], variant, work)
                    except GpuError as err:
                        loader_failed = str(err)
                        rows.add(kind="note", text=f"the cubin loader failed ({err}): host libraries from here")
                on_gpu = ProgramOnGpu(variant, host, work, gpu=loaded)
                on_gpu.poison()
                on_gpu.run()
                checks = compare_outputs(variant, on_gpu.outputs(), references=references)
                ok = all(c.ok for c in checks)
                result = {"kind": "variant", "index": index, "label": label, "kernels": records, "ok": ok,
                          "reference_on": where, "checks": [dataclasses.asdict(c) | {"dtype": str(c.dtype)} for c in checks]}
                if ok:
                    result["timed"] = [time_kernel(on_gpu, i, ctypes_pointer(flush)) for i in range(len(on_gpu.kernels))]
                    result["measured_ms"] = sum(t["median_ms"] for t in result["timed"])
                rows.add(**result)
            except GpuError as err:  # the context may be lost: this worker ends, the parent goes on past it
                rows.add(kind="variant", index=index, label=label, kernels=records, ok=False, error=f"fault: {err}")
                return 3
            except Exception as err:  # noqa: BLE001 - a bad index a kernel recorded, a refused check: this row only
                rows.add(kind="variant", index=index, label=label, kernels=records, ok=False,
                         error=f"{type(err).__name__}: {str(err)[:1000]}")
            finally:
                if on_gpu is not None:
                    with contextlib.suppress(GpuError):
                        on_gpu.close()
                if loaded is not None:
                    loaded.close()
    if job.versus_torch and time.time() < args.deadline:
        versus_torch(job, rows, flush, args.deadline, out)
    return 0


def least_bytes(program) -> int:
    """The fewest bytes the program must move: every input and weight read once, every output written once."""
    types, loops = program.buffer_types, program.loop_ir
    names = [n for n, _ in loops.inputs] + [n for n, _ in loops.weights] + list(loops.outputs)
    return sum(types[n].numel * types[n].dtype.itemsize for n in names)


def ctypes_pointer(tensor):
    import ctypes

    return ctypes.c_void_p(tensor.data_ptr())


def versus_torch(job: Job, rows: Rows, flush, deadline: float, out: Path) -> None:
    """torch eager and torch.compile on the same program (the -c code's own module), timed alike;
    torch.compile's first call (the compile) runs outside the GPU lock, so it holds up no one's timing
    but may overlap one sample of another's (the medians shrug off one)."""
    import torch

    from emmy.capture.code import capture_code

    made = capture_code(job.code)
    module = made.module.to("cuda").eval()
    args = tuple(x.to("cuda") for x in made.example_inputs)
    with torch.device("cuda"):
        try:
            with gpu_lock(out):
                rows.add(kind="torch", mode="eager", **time_torch(module, args, flush))
        except Exception as err:  # noqa: BLE001 - recorded, not fatal
            rows.add(kind="torch", mode="eager", error=f"{type(err).__name__}: {err}")
        if time.time() > deadline - 60:
            rows.add(kind="torch", mode="compile", error="skipped: too close to the time limit")
            return
        try:
            compiled = torch.compile(module)
            begin = time.perf_counter()
            with torch.no_grad():
                compiled(*args)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - begin
            with gpu_lock(out):
                rows.add(kind="torch", mode="compile", compile_s=compile_s, **time_torch(compiled, args, flush))
        except Exception as err:  # noqa: BLE001
            rows.add(kind="torch", mode="compile", error=f"{type(err).__name__}: {str(err)[:500]}")


# ---- the parent: workers, watchdog, report ----------------------------------------------------------

def environment() -> dict:
    def output(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    smi = output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_cap",
                  "--format=csv,noheader"])
    nvcc = output(["nvcc", "--version"]).splitlines()
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = ""
    return {"gpu": smi, "nvcc": nvcc[-1] if nvcc else "", "torch": torch_version, "python": sys.version.split()[0],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", "benchmarks/gpu_session.py", *sys.argv[1:]])}


def measure_ceilings(out: Path) -> dict:
    """The two ceilings the method asks for, measured once: a device-to-device copy (bytes read plus
    written) and matrix products through torch (cuBLAS) on random data."""
    import torch

    found = {}
    with gpu_lock(out):
        x = torch.randn((2 << 30) // 4, device="cuda")  # 2 GiB
        y = torch.empty_like(x)
        for _ in range(3):
            y.copy_(x)
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(10):
            y.copy_(x)
        end.record()
        torch.cuda.synchronize()
        found["copy_TBps"] = 2 * x.numel() * 4 * 10 / (begin.elapsed_time(end) * 1e-3) / 1e12
        del x, y
        torch.cuda.empty_cache()
        for name, dtype, n in (("matmul_f16_TFLOPs", torch.float16, 8192), ("matmul_f32_TFLOPs", torch.float32, 4096)):
            a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
            begin.record()
            for _ in range(10):
                a @ b
            end.record()
            torch.cuda.synchronize()
            found[name] = 2 * n ** 3 * 10 / (begin.elapsed_time(end) * 1e-3) / 1e12
    return found


class Worker:
    def __init__(self, job: Job, args, skip: int = 0, restarts: int = 0):
        self.job, self.skip, self.restarts = job, skip, restarts
        self.rows = Path(args.out) / "rows" / (job.name.replace("/", "__") + ".jsonl")
        self.log = open(Path(args.out) / "logs" / (job.name.replace("/", "__") + ".log"), "a")
        cmd = [sys.executable, __file__, "--worker", job.name, "--out", args.out, "--work", args.work,
               "--arch", args.arch, "--threads", str(args.threads), "--skip", str(skip),
               "--deadline", str(args.deadline)] + (["--dry-run"] if args.dry else [])
        # inductor's compile pool a worker, not a core each: eight workers share the machine
        env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "2", "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.last_change = time.time()
        self.size = 0

    def progress(self) -> float:
        """Seconds since its rows last grew."""
        size = self.rows.stat().st_size if self.rows.exists() else 0
        if size != self.size:
            self.size, self.last_change = size, time.time()
        return time.time() - self.last_change

    def last_started(self) -> int:
        """The index of the last candidate it began, -1 if none."""
        started = -1
        for row in self._rows():
            if row.get("kind") == "start":
                started = row["index"]
        return started

    def on_a_candidate(self) -> bool:
        """Whether its last row says a candidate began (and nothing since)."""
        found = self._rows()
        return bool(found) and found[-1].get("kind") == "start"

    def _rows(self) -> list[dict]:
        if not self.rows.exists():
            return []
        return [json.loads(line) for line in self.rows.read_text().splitlines() if line.strip()]


def run_jobs(jobs: list[Job], args) -> None:
    queue, running = list(jobs), []
    while queue or running:
        while queue and len(running) < args.jobs and not late_now(args):
            running.append(Worker(queue.pop(0), args))
        if late_now(args) and queue:
            print(f"time limit: {len(queue)} jobs not started: {', '.join(j.name for j in queue)}", flush=True)
            queue.clear()
        time.sleep(0.5)
        for w in list(running):
            rc = w.process.poll()
            hung = rc is None and w.progress() > WATCHDOG_SECONDS and w.on_a_candidate()
            late = rc is None and time.time() > args.deadline + 15
            if hung or late:
                w.process.kill()
                w.process.wait()
                rc = -9
                if w.last_started() >= 0:
                    Rows(w.rows, w.job.name).add(kind="variant", index=w.last_started(), ok=False,
                                                 error="hung: killed by the watchdog" if hung else "killed at the time limit")
            if rc is None:
                continue
            running.remove(w)
            w.log.close()
            if rc in (3, -9) and w.restarts < 2 and not late_now(args):  # again, past the candidate that failed
                running.append(Worker(w.job, args, skip=w.last_started() + 1, restarts=w.restarts + 1))
            elif rc not in (0, 3, -9):
                Rows(w.rows, w.job.name).add(kind="failed", rc=rc,
                                             log=(Path(args.out) / "logs" / (w.job.name.replace("/", "__") + ".log"))
                                             .read_text()[-3000:])
            print(f"[{time.strftime('%H:%M:%S')}] {w.job.name}: rc={rc}", flush=True)


def late_now(args) -> bool:
    return time.time() > args.deadline - 20


def measured_rows(results: dict) -> list:
    """A session's results (results.json) as measurement database rows (emmy.measure_db): one per tile
    kernel of every checked variant, its Kernel IR kernels' medians summed (a split's fill or finish
    kernel belongs to the kernel it serves); a variant whose check failed is one wrong row per kernel."""
    from emmy.extract.targets import GPUS, gpu_key
    from emmy.measure_db import MeasuredRow

    fields = [f.strip() for f in results["environment"]["gpu"].split(",")]
    name, driver = fields[0], fields[1] if len(fields) > 1 else ""
    target = gpu_key(name)
    if target is None:
        return []
    capability = fields[4] if len(fields) > 4 else ".".join(map(str, GPUS[target].compute_capability))
    when = results["environment"]["date"]
    found = []
    for r in results["rows"]:
        if r.get("kind") != "variant" or "kernels" not in r:
            continue
        names = sorted((k["kernel"] for k in r["kernels"]), key=len, reverse=True)
        per_kernel: dict[str, list] = {n: [] for n in names}
        for t in r.get("timed", []):
            owner = next((n for n in names if t["name"].startswith(n)), None)
            if owner is not None:
                per_kernel[owner].append(t)
        for k in r["kernels"]:
            if not k.get("signature"):
                continue
            timed = per_kernel[k["kernel"]]
            base = dict(gpu=name, target=target, capability=capability, driver=driver, signature=k["signature"],
                        knobs=k["knobs"], compiler=results["environment"].get("nvcc", ""), measured_at=when)
            if r.get("ok") and timed:
                found.append(MeasuredRow(**base, median_s=sum(t["median_ms"] for t in timed) * 1e-3,
                                         p10_s=sum(t["p10_ms"] for t in timed) * 1e-3,
                                         p90_s=sum(t["p90_ms"] for t in timed) * 1e-3,
                                         repetitions=min(t["samples"] for t in timed), correct=True))
            elif not r.get("ok"):
                why = r.get("error") or "; ".join(f"{c['output']}: {c['why']}" for c in r.get("checks", []))
                found.append(MeasuredRow(**base, median_s=None, p10_s=None, p90_s=None, repetitions=0, correct=False,
                                         error=why or "failed the check"))
    return found


def store(results: dict, out: Path | None) -> int:
    """The session's rows into the measurement database (EMMY_DB), and exported beside its report."""
    from emmy.measure_db import MeasurementDb

    rows = measured_rows(results)
    with MeasurementDb() as db:
        db.add(rows)
        if out is not None:
            (out / "measurements.json").write_text(db.export_json(source="gpu"))
    return len(rows)


def calibration(out: Path, env: dict, args) -> str:
    """The cost model fitted to the rows just recorded (`emmy calibrate --from-db`), with held-out
    fidelity before and after, as a report section; written beside the report, not applied."""
    from emmy.extract.targets import gpu_key

    key = gpu_key(env["gpu"].split(",")[0]) if env.get("gpu") else None
    if key is None:
        return ""
    left = args.deadline + 60 - time.time()  # the report is written after; a fit takes about a minute
    emmy_cli = [sys.executable, "-m", "emmy", "calibrate", "--from-db", "--target", key, "-o", str(out / "calibration.json")]
    try:
        done = subprocess.run(emmy_cli, capture_output=True, text=True, timeout=max(30.0, left))
    except subprocess.TimeoutExpired:
        return "\n## Calibration\n\nNot fitted: out of time.\n"
    lines = (done.stdout if done.returncode == 0 else done.stderr).strip()
    return f"\n## Calibration (the model fitted to this session's rows)\n\n```\n{lines}\n```\n"


def read_rows(out: Path) -> list[dict]:
    found = []
    for path in sorted((out / "rows").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                found.append(json.loads(line))
    return found


def spearman(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(xs, ys).statistic)


def report(out: Path, env: dict, ceilings: dict, jobs: list[Job], rows: list[dict]) -> str:
    by_job: dict[str, list[dict]] = {}
    for r in rows:
        by_job.setdefault(r["job"], []).append(r)
    lines = [f"# emmy on {env.get('gpu', '?')}", "",
             f"Measured {env['date']} with `{env['command']}` (torch {env['torch']}, {env['nvcc']}, "
             f"Python {env['python']}).", "",
             "Ceilings measured here: " + ", ".join(f"{k} {v:.1f}" for k, v in ceilings.items()), "",
             "Every time is the median of per-launch CUDA-event samples with 256 MB overwritten before each "
             "(a cold L2), p10-p90 beside it; a program's time sums its kernels. torch is timed the same way "
             "around one call. Nothing is timed before its outputs (poisoned first) matched torch's float64 "
             "reference.", "",
             "## Every program, its chosen rows", "",
             "| job | correct | max abs err | emmy us (p10-p90) | predicted us | predicted/measured | memory bound us | "
             "torch eager us | torch.compile us |", "|---|---|---|---|---|---|---|---|---|"]
    tuning = ["## Candidates: the model's ranking against the GPU's", "",
              "| job | rows measured | correct | Spearman(pred, meas) | model's pick us | measured best us | best row | "
              "regret |", "|---|---|---|---|---|---|---|---|"]
    points = []
    for job in jobs:
        found = by_job.get(job.name, [])
        measured = [r for r in found if r.get("kind") == "variant"]
        chosen = next((r for r in measured if r.get("label") == "chosen"), None)
        torch_rows = {r["mode"]: r for r in found if r.get("kind") == "torch"}

        def torch_cell(mode):
            r = torch_rows.get(mode)
            if r is None:
                return "-"
            return f"{r['median_ms'] * 1e3:.1f}" if "median_ms" in r else r.get("error", "?")[:60]

        if chosen is None:
            failed = next((r for r in found if r.get("kind") in ("failed", "stopped")), None)
            why = failed.get("kind") if failed else "not run"
            lines.append(f"| {job.name} | {why} | - | - | - | - | - | - | - |")
            continue
        predicted = sum(k["predicted_s"] for k in chosen["kernels"]) * 1e6
        compiled = next((r for r in found if r.get("kind") == "compiled"), {})
        bound = (f"{compiled['least_bytes'] / (ceilings['copy_TBps'] * 1e12) * 1e6:.1f}"
                 if "least_bytes" in compiled and ceilings.get("copy_TBps") else "-")
        if chosen.get("ok"):
            ms = chosen["measured_ms"]
            spread = (f"{sum(t['p10_ms'] for t in chosen['timed']) * 1e3:.1f}-"
                      f"{sum(t['p90_ms'] for t in chosen['timed']) * 1e3:.1f}")
            worst = max((c["max_abs"] for c in chosen["checks"]), default=0.0)
            lines.append(f"| {job.name} | yes | {worst:.2e} | {ms * 1e3:.1f} ({spread}) | {predicted:.1f} | "
                         f"{predicted / (ms * 1e3):.2f} | {bound} | {torch_cell('eager')} | {torch_cell('compile')} |")
        else:
            why = chosen.get("error") or "; ".join(c.get("why", "") for c in chosen.get("checks", []))
            lines.append(f"| {job.name} | NO: {why[:80]} | - | - | {predicted:.1f} | - | {bound} | - | - |")
        if job.top or job.explore:
            good = [r for r in measured if r.get("ok")]
            pred = [sum(k["predicted_s"] for k in r["kernels"]) * 1e6 for r in good]
            meas = [r["measured_ms"] * 1e3 for r in good]
            points += [(p, m, job.name) for p, m in zip(pred, meas)]
            if good:
                best = min(good, key=lambda r: r["measured_ms"])
                pick = chosen["measured_ms"] * 1e3 if chosen.get("ok") else float("nan")
                rho = spearman(pred, meas)
                tuning.append(f"| {job.name} | {len(measured)} | {len(good)} | "
                              f"{'-' if rho is None else f'{rho:.2f}'} | {pick:.1f} | {best['measured_ms'] * 1e3:.1f} | "
                              f"{best['label']}: {best['kernels'][-1]['knobs']} | {pick / (best['measured_ms'] * 1e3):.2f} |")
    text = "\n".join(lines + [""] + tuning) + "\n"
    if points:
        _plot(out / "predicted_vs_measured.png", points)
        text += "\n![predicted against measured](predicted_vs_measured.png)\n"
    return text


def _plot(path: Path, points) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 6))
    for name in sorted({n for _, _, n in points}):
        xs = [m for p, m, n in points if n == name]
        ys = [p for p, m, n in points if n == name]
        ax.scatter(xs, ys, s=14, label=name.removeprefix("suite/"))
    low = min(min(p, m) for p, m, _ in points)
    high = max(max(p, m) for p, m, _ in points)
    ax.plot([low, high], [low, high], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured us")
    ax.set_ylabel("predicted us")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", dest="dry", action="store_true", help="build everything, run nothing")
    parser.add_argument("--seconds", type=float, default=360.0, help="time limit for the whole session")
    parser.add_argument("--out", help="where the dated results folder goes (default benchmarks/results; a dry run's, "
                                      "which measures nothing, a temporary folder)")
    parser.add_argument("--only", action="append", default=[], help="jobs whose name contains this (repeatable)")
    parser.add_argument("--no-smoke", dest="smoke", action="store_false",
                        help="start every job at once (no first job alone to stop early on a broken machine)")
    parser.add_argument("--arch", default="90")
    parser.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    parser.add_argument("--threads", type=int, default=2, help="nvcc builds at once in each worker")
    parser.add_argument("--import-results", type=Path, metavar="RESULTS_JSON",
                        help="record a session's results.json in the measurement database (EMMY_DB), then stop")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.import_results:
        added = store(json.loads(args.import_results.read_text()), None)
        print(f"recorded {added} rows from {args.import_results}")
        return 0
    jobs = plan()
    if args.worker:
        try:
            return run_worker(next(j for j in jobs if j.name == args.worker), args)
        except Exception:  # noqa: BLE001 - the parent records the log
            traceback.print_exc()
            return 1
    begin = time.time()
    args.deadline = begin + (args.seconds if not args.dry else 1e9)  # a dry run builds everything
    if args.only:
        jobs = [j for j in jobs if any(o in j.name for o in args.only)]
    env = environment()
    gpu = "dry-run" if args.dry else (env["gpu"].split(",")[0].strip().lower().replace("nvidia ", "").replace(" ", "-")
                                      or "unknown-gpu")
    # benchmarks/results holds evidence from GPUs only: a dry run's build logs stay out of the repository
    base = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="emmy-dry-run-")) if args.dry
                                             else ROOT / "benchmarks" / "results")
    out = base / f"{datetime.date.today().isoformat()}-{gpu}"
    for sub in ("rows", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    args.out = str(out)
    args.work = args.work or str(out / "build")
    print(f"{len(jobs)} jobs into {out}; {env}", flush=True)
    ceilings = {}
    if not args.dry:
        ceilings = measure_ceilings(out)
        print("ceilings:", ceilings, flush=True)
        smoke = jobs[0]
        run_jobs([smoke] if args.smoke else [], args)
        if args.smoke and not any(r.get("ok") for r in read_rows(out) if r["job"] == smoke.name and r.get("kind") == "variant"):
            print(f"the smoke job {smoke.name} failed; stopping. Its log:", flush=True)
            print((out / "logs" / (smoke.name.replace("/", "__") + ".log")).read_text()[-6000:], flush=True)
            return 1
        # the simulator's test kernels on the GPU, bit for bit, while the workers compile
        with open(out / "logs" / "gpu_sim_compare.log", "w") as log:
            sim_compare = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "gpu_sim_compare.py"), "--arch",
                                            args.arch, "--out", str(out / "gpu_sim_report.md")], stdout=log,
                                           stderr=subprocess.STDOUT)
        run_jobs(jobs[1:] if args.smoke else jobs, args)
        try:
            sim_compare.wait(timeout=max(1.0, args.deadline + 15 - time.time()))
        except subprocess.TimeoutExpired:
            sim_compare.kill()
        # the Python API on CUDA tensors (program(*cuda), save/load, torch.compile), after the timing
        with open(out / "logs" / "gpu_api_check.log", "w") as log:
            try:
                subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_api_check.py"), "--out",
                                str(out / "gpu_api_report.md")], stdout=log, stderr=subprocess.STDOUT, timeout=180)
            except subprocess.TimeoutExpired:
                log.write("timed out after 180 s\n")
    else:
        run_jobs(jobs, args)
    rows = read_rows(out)
    if args.dry:
        plans = [r for r in rows if r.get("kind") == "plan"]
        variants_n = sum(r["variants"] for r in plans)
        # a variant: ~0.3 s of set-up and check, and up to 200 cold samples of its time plus the flush
        estimate = sum(0.3 + min(1.5, 200 * (p + 1.2e-4)) for r in plans for p in r["predicted_s"])
        compile_s = sum(r["compile_s"] for r in plans)
        print(f"plan: {len(plans)} of {len(jobs)} jobs built, {variants_n} variants; on the GPU about {estimate:.0f}s "
              f"of checking and timing, plus torch.compile for {sum(j.versus_torch for j in jobs)} programs "
              f"(~20s each); compiling took {compile_s:.0f}s of worker time here", flush=True)
        return 0 if len(plans) == len(jobs) else 1
    results = {"environment": env, "ceilings": ceilings, "rows": rows}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    try:
        print(f"recorded {store(results, out)} rows in the measurement database", flush=True)
    except Exception as err:  # noqa: BLE001 - the report and results.json are written regardless
        print(f"the measurement database refused the rows: {err}", flush=True)
    text = report(out, env, ceilings, jobs, rows) + calibration(out, env, args)
    if (out / "gpu_api_report.md").exists():
        text += "\n" + (out / "gpu_api_report.md").read_text().replace("# The Python API", "## The Python API")
    if (out / "gpu_sim_report.md").exists():
        text += "\n" + (out / "gpu_sim_report.md").read_text().replace("# Simulator vs GPU", "## Simulator vs GPU")
    (out / "report.md").write_text(text)
    print(text, flush=True)
    print(f"done in {time.time() - begin:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
