"""The `emmy` command: output, and one clear line with exit status 2 for every kind of bad input."""

import subprocess
import sys

import pytest

from emmy.workloads import get

from tests.conftest import run_emmy

MATMUL = "x=torch.randn(4,3); w=torch.randn(3,2); x @ w"

BAD_INPUT = [
    # (code, extra args, the error line must contain all of these)
    ("x = = 1", [], ["syntax error in -c code at line 1, column 5"]),
    ("x=torch.randn(3)\ny = x * 2", [], ["last statement of -c code (line 2) is an assignment"]),
    ("x=torch.randn(3)\n3", [], ["(line 2) gives int, not a tensor"]),
    ("x=torch.randn(3)\n(x, 'a')", [], ["gives tuple of Tensor, str, not a tensor"]),
    ("x=torch.randn(3)\ny=torch.randn(4)\nx @ y", [], ["raised RuntimeError at line 3: `x @ y`"]),
    ("x=torch.randn(3)\nundefined_name * x", [], ["raised NameError at line 2", "undefined_name"]),
    ("x=torch.randn(4)\nx if x.sum() > 0 else -x", [], ["data-dependent control flow at line 2"]),
    ("x=torch.randn(4,4)\ntorch.linalg.eigvalsh(x)", [],
     ["unsupported op aten._linalg_eigh.default", "line 2: `torch.linalg.eigvalsh(x)`"]),
    # inv's error check is an effect token: the program's unsupported op is still the one named
    ("x=torch.randn(4,4)\ntorch.linalg.inv(x) + torch.linalg.svdvals(x).sum()", [],
     ["unsupported op aten._linalg_svd.default", "line 2"]),
    ("x=torch.randn(4).to(torch.float8_e4m3fn); x.float() * 2", [], ["unsupported dtype float8_e4m3fn (input x)"]),
    ("e=torch.randn(0); b=torch.linspace(0,1,5)\ntorch.histogram(e, b)[0]", [],
     ["aten.histogram.bins_tensor (line 2: `torch.histogram(e, b)[0]`): it reads a tensor with no elements beside one"]),
    ("x=torch.randn(10)\ntorch.masked_select(x, x > 0) * 2", [],
     ["unsupported op aten.masked_select.default (line 2", "the size of its result depends on tensor values"]),
    ("x=torch.randn(4)\nx.to(torch.float8_e4m3fn).float() * 2", [],
     ["unsupported dtype float8_e4m3fn", "line 2: `x.to(torch.float8_e4m3fn).float() * 2`"]),
    # a value-sized op's refusal names its fixed-size form
    ("x=torch.randint(0,5,(12,))\ntorch.bincount(x, minlength=5)", [],
     ["unsupported op aten.bincount.default (line 2", "keep the shape fixed (a fixed number of bins"]),
    ("x=torch.randn(4,3); r=torch.tensor([1,2,0,3])\nx.repeat_interleave(r, dim=0)", [],
     ["aten.repeat_interleave.Tensor (line 2", "a tensor of repeats whose total is fixed as output_size="]),
    (MATMUL, ["--target", "sm_70"], ["unknown target 'sm_70'", "sm_80, sm_89, sm_90, sm_120"]),
    (get("attention").sim_code, ["--ir", "kernel", "--knobs", "REDUCE=g2k"],
     ["kernel k_sdpa_cast_3 (attention 72 queries x 72 keys, head 64, values 64 (batch 2), f16 operands",
      "REDUCE=g2k: split-KV attention is not lowered yet"]),
    (MATMUL, ["--ir", "llvm"], ["unknown --ir stage 'llvm'"]),
]


# Each case runs emmy's CLI entry in one fresh process for the whole table (a process each spent its
# seconds importing torch): what the case writes to file descriptors 1 and 2, its own and any child's,
# is its stdout and stderr, and its status is what the `emmy` command would exit with.
_RUN_CASES = r"""
import json, logging, os, sys, tempfile
from emmy.cli import main

results = []
for argv in json.load(sys.stdin):
    logging.getLogger().handlers.clear()  # main's basicConfig binds the stderr of this case
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            code = main(argv)
        except SystemExit as stop:  # argparse's usage errors, as console_main takes them
            code = stop.code if isinstance(stop.code, int) else 2
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        out.seek(0)
        err.seek(0)
        results.append({"returncode": code, "stdout": out.read(), "stderr": err.read()})
json.dump(results, sys.stdout)
"""


@pytest.fixture(scope="module")
def bad_input_results():
    """Per BAD_INPUT case: what `emmy compile -c CODE ARGS` printed and returned."""
    import json

    cases = [["compile", "-c", code, *args] for code, args, _ in BAD_INPUT]
    done = subprocess.run([sys.executable, "-c", _RUN_CASES], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [subprocess.CompletedProcess(case, r["returncode"], r["stdout"], r["stderr"])
            for case, r in zip(cases, json.loads(done.stdout))]


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[str(i) for i in range(len(BAD_INPUT))])
def test_bad_input_is_one_clear_error_with_status_2(case, bad_input_results):
    needles = BAD_INPUT[case][2]
    result = bad_input_results[case]
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    first = result.stderr.splitlines()[0]
    assert first.startswith("emmy: error: ")
    for needle in needles:
        assert needle in first, first
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) <= 3  # the message, at most a source line and a caret


def test_syntax_error_shows_the_line_and_a_caret():
    result = run_emmy("compile", "-c", "x = torch.randn(3)\ny = (x +")
    lines = result.stderr.splitlines()
    assert result.returncode == 2
    assert "line 2" in lines[0]
    assert lines[1].strip() == "y = (x +"
    assert lines[2].strip() == "^"


def test_code_that_does_not_parse_is_refused_before_torch_is_imported():
    """A syntax error took three seconds to report: the capture started (importing torch) before the
    code was parsed. It is parsed first."""
    probe = ("import sys\nfrom emmy.api import capture_ahead\nfrom emmy.errors import CodeError\n"
             "for code in ('x = = 1', 'x = torch.randn(3)'):\n"
             "    try:\n        capture_ahead(code)\n    except CodeError as err:\n        print(err)\n"
             "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines() == [
        "syntax error in -c code at line 1, column 5: invalid syntax",
        "the last statement of -c code (line 1) is an assignment, not an expression; end the code with the "
        "expression whose tensor emmy should compile",
        "torch not imported"], result.stdout + result.stderr


def test_verbose_shows_the_traceback():
    result = run_emmy("compile", "-c", "x=torch.randn(4,4)\ntorch.linalg.eigvalsh(x)", "-v")
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert "unsupported op aten._linalg_eigh.default" in result.stderr.splitlines()[-1]


def test_compile_prints_tensor_ir_and_writes_files(tmp_path):
    result = run_emmy("compile", "-c", MATMUL, "--ir", "tensor")
    assert result.returncode == 0, result.stderr
    assert "let mm_sum: f32[4,1,2] = sum(mm_prod, axis=-2);" in result.stdout
    out = tmp_path / "mm.txt"
    written = run_emmy("compile", "-c", MATMUL, "--ir", "torch", "-o", str(out))
    assert written.returncode == 0, written.stderr
    assert "aten.mm.default(x, w)" in out.read_text()
    assert str(out) in written.stdout


def test_target_from_environment_is_checked():
    result = run_emmy("compile", "-c", MATMUL, env={"EMMY_TARGET": "sm_99"})
    assert result.returncode == 2
    assert "unknown target 'sm_99'" in result.stderr


def test_python_dash_m_emmy_is_the_same_cli():
    result = subprocess.run([sys.executable, "-m", "emmy", "compile", "-c", "x=torch.randn(2); x*2", "--ir", "torch"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "aten.mul.Tensor(x, 2)" in result.stdout


def test_cli_does_not_import_torch_when_it_does_not_need_it():
    probe = (
        "import sys, emmy.cli\n"
        "for argv in (['compile', '-c', 'x', '--ir', 'llvm'], ['compile', '-c', 'x', '--target', 'sm_1'],\n"
        "             ['run', '-c', 'x', '--device', 'tpu'], ['run', '-c', 'x', '--sim-mode', 'valgrind']):\n"
        "    assert emmy.cli.main(argv) == 2\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_no_command_prints_help_and_exits_2():
    result = run_emmy()
    assert result.returncode == 2
    assert "compile" in result.stdout


def test_suite_compiles_checks_predicts_and_simulates_a_workload():
    result = run_emmy("suite", "--only", "rmsnorm", "--only", "matmul_f16", "--quiet", "--target", "sm_120")
    assert result.returncode == 0, result.stderr
    header, rms, matmul, summary = result.stdout.splitlines()
    assert header.split()[:6] == ["workload", "kernels", "schedule", "(first", "kernel)", "compile"]
    assert "(sm_120)" in header and "CUDA in sim err" in header
    cells = rms.split()
    assert cells[:3] == ["rmsnorm", "1", "WORK=t1024,TILE=f2/v2,REDUCE=coop,STAGE=regs,RASTER="]
    assert float(cells[3]) > 0 and float(cells[-2]) < 1e-5 and cells[-1] == "ok"
    assert matmul.split()[:2] == ["matmul_f16", "1"] and "mma_m16n8k16_f16_f32" in matmul and matmul.split()[-1] == "ok"
    assert summary == "2 passed, 0 failed"


def test_suite_prints_the_cuda_of_what_lowers():
    result = run_emmy("suite", "--only", "softmax", "--only", "matmul_f16", "--ir", "cuda")
    assert result.returncode == 0, result.stderr
    assert "extern \"C\" __global__ void __launch_bounds__(512, 1) k_softmax(" in result.stdout
    assert "emmy::mma_m16n8k16_f16_f32(acc[fm][fn], a_frag[fm], b_frag[fn], acc[fm][fn]);" in result.stdout


def test_suite_names_an_unknown_workload():
    result = run_emmy("suite", "--only", "nope")
    assert result.returncode == 2
    assert "nope" in result.stderr and "Traceback" not in result.stderr


def test_verbose_reports_emmy_not_its_libraries():
    result = run_emmy("compile", "-c", "x=torch.randn(8); x*2", "--ir", "loop", "-v")
    assert result.returncode == 0, result.stderr
    assert "phase algebra:" in result.stderr
    assert "Declared constructor" not in result.stderr  # egglog's debug log
    assert "deprecate positional args" not in result.stderr  # graphviz's
    assert len(result.stderr.splitlines()) < 60


def test_a_program_file_compiles_runs_and_is_named_in_errors(tmp_path):
    program = tmp_path / "block.py"
    program.write_text("class Block(nn.Module):\n"
                       "    def __init__(self):\n"
                       "        super().__init__()\n"
                       "        self.fc = nn.Linear(16, 16)\n\n"
                       "    def forward(self, x):\n"
                       "        return torch.relu(self.fc(x))\n\n"
                       "x = torch.randn(4, 16)\n"
                       "Block()(x) * 2\n")
    result = run_emmy("run", "-f", str(program), "--check", "--sim-mode", "asan")
    assert result.returncode == 0, result.stderr
    assert " ok" in result.stdout
    broken = tmp_path / "broken.py"
    broken.write_text("x = torch.randn(4)\ny = x.no_such_method()\ny\n")
    result = run_emmy("compile", "-f", str(broken))
    assert result.returncode == 2
    assert "the file broken.py raised AttributeError at line 2: `y = x.no_such_method()`" in result.stderr
    missing = run_emmy("compile", "-f", str(tmp_path / "absent.py"))
    assert missing.returncode == 2 and "cannot read the program file" in missing.stderr
    both = run_emmy("compile", "-c", MATMUL, "-f", str(program))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
