"""The Python API a PyTorch user calls: every accepted graph form compiled and called on tensors,
outputs named and nested as the module returns them, stop_after checked, errors in one hierarchy,
and programs saved and loaded in a fresh process that has neither egglog nor torch.export nor nvcc."""

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import emmy
import emmy.errors
from emmy.errors import EmmyError, InputMismatchError, SavedProgramError, UnknownStageError

torch.manual_seed(0)
X = torch.randn(4, 16)
W = torch.randn(8, 16)


def norm_project(x, w):
    y = F.rms_norm(x, (16,))
    return torch.relu(y @ w.t()), y


class NormProject(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, x):
        y = F.rms_norm(x, (16,))
        return {"hidden": torch.relu(self.proj(y)), "normed": y}


CODE = "x = torch.randn(4, 16); w = torch.randn(8, 16); y = F.rms_norm(x, (16,)); (torch.relu(y @ w.t()), y)"


def _forms(tmp_path):
    """(name, graph, example inputs, the call's inputs, eager) for each graph form optimize accepts."""
    module = NormProject().eval()
    file = tmp_path / "prog.py"
    file.write_text(CODE)
    traced = torch.fx.symbolic_trace(norm_project)
    exported = torch.export.export(module, (X,))
    return [
        ("function", norm_project, (X, W), (X, W), lambda: norm_project(X, W)),
        ("module", module, (X,), (X,), lambda: module(X)),
        ("fx", traced, (X, W), (X, W), lambda: traced(X, W)),
        ("exported", exported, (), (X,), lambda: module(X)),
    ]


def _same_structure(got, want, atol=1e-5):
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for key in want:
            _same_structure(got[key], want[key], atol)
    elif isinstance(want, (tuple, list)):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _same_structure(g, w, atol)
    else:
        assert isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)


def test_every_graph_form_is_callable_in_the_simulator_and_the_interpreter(tmp_path):
    for name, graph, example, given, eager in _forms(tmp_path):
        program = emmy.optimize(graph, *example)
        want = eager()
        _same_structure(program(*given), want)  # CPU tensors: the CUDA in the simulator
        _same_structure(program(*given, device="interpret"), want)
        _same_structure(program(*given, sim_mode="asan"), want)


def test_code_strings_and_files_return_what_their_last_expression_returns(tmp_path):
    file = tmp_path / "prog.py"
    file.write_text(CODE)
    for graph in (CODE, file):
        program = emmy.optimize(graph)
        x, w = program.example_inputs
        assert program.signature.output_names == ("out0", "out1")
        _same_structure(program(x, w), norm_project(x, w))
    single = emmy.optimize("x = torch.randn(3, 5); torch.exp(x)")
    (x,) = single.example_inputs
    out = single(x + 1)  # another input of the compiled shape, not the example
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, torch.exp(x + 1))


def test_outputs_are_named_as_the_module_names_them_never_by_temporaries():
    from emmy.runtime import check_program

    program = emmy.optimize(NormProject(), X)
    assert program.signature.output_names == ("hidden", "normed")
    assert [c.output for c in check_program(program)] == ["hidden", "normed"]
    code = emmy.optimize(CODE)
    assert [c.output for c in check_program(code)] == ["out0", "out1"]


def test_a_buffer_returned_twice_is_two_outputs():
    program = emmy.optimize(lambda x: (torch.sin(x), torch.sin(x) * 1.0, x), X)
    a, b, c = program(X)
    torch.testing.assert_close(a, torch.sin(X))
    torch.testing.assert_close(b, torch.sin(X))
    torch.testing.assert_close(c, X)


def test_nones_and_numbers_among_the_outputs_come_back_as_the_module_returns_them(tmp_path):
    """A decoder returns None where it keeps no cache, a dict with a None entry, or a count: those
    leaves are returned as they are, around the computed tensors (torch.export hands them over as
    constant outputs; the program crashed on them), and survive save and load."""

    class Decoder(torch.nn.Module):
        def forward(self, x):
            return x.relu(), None, (x.sum(), None), 3

    class Dict(torch.nn.Module):
        def forward(self, x):
            return {"logits": x * 2, "past": None, "layers": 2}

    program = emmy.optimize(Decoder(), X)
    hidden, nothing, (total, empty), count = program(X)
    torch.testing.assert_close(hidden, X.relu())
    torch.testing.assert_close(total, X.sum(), rtol=1e-5, atol=1e-5)
    assert nothing is None and empty is None and count == 3
    assert program.signature.output_names == ("out0", "out1")
    program.save(tmp_path / "decoder.emmy")
    again = emmy.load(tmp_path / "decoder.emmy")(X)
    assert again[1] is None and again[2][1] is None and again[3] == 3
    out = emmy.optimize(Dict(), X)(X)
    assert set(out) == {"logits", "past", "layers"} and out["past"] is None and out["layers"] == 2
    torch.testing.assert_close(out["logits"], X * 2)


class Output(dict):
    """A model output registered with torch's pytree as transformers registers its ModelOutput: by
    flatten and unflatten functions (the context the field names), no key paths."""


torch.utils._pytree.register_pytree_node(
    Output, lambda o: (list(o.values()), list(o.keys())), lambda values, keys: Output(zip(keys, values)),
    serialized_type_name=f"{__name__}.Output")


def test_an_output_registered_without_key_paths_keeps_its_type_and_field_names():
    """torch's pytree refuses key paths for such a type (every transformers model's output failed
    to capture): the fields are named from the spec's context instead."""

    class Model(torch.nn.Module):
        def forward(self, x):
            return Output(logits=x * 2, hidden=(x.relu(), x.sum(-1)))

    program = emmy.optimize(Model(), X)
    assert program.signature.output_names == ("logits", "hidden.0", "hidden.1")
    out = program(X)
    assert type(out) is Output and list(out) == ["logits", "hidden"]
    torch.testing.assert_close(out["hidden"][1], X.sum(-1), rtol=1e-5, atol=1e-5)


def test_bool_arguments_are_flags_compiled_in_and_a_call_must_pass_the_same():
    """use_cache=False, return_dict=True: code branches on them, so they stay constants (a bool
    lifted to a tensor input made every such branch data-dependent control flow)."""

    class Model(torch.nn.Module):
        def forward(self, x, double, options, use_cache=True):
            y = x * 2 if double else x + 1
            y = y.exp() if options[1] else y
            return (y, y.sum()) if use_cache else y

    program = emmy.optimize(Model(), X, False, [X, True], example_kwargs={"use_cache": False})
    assert [name for name, _ in program.signature.inputs] == ["x", "options_0"]
    torch.testing.assert_close(program(X, False, [X, True], use_cache=False), (X + 1).exp())
    for args, keywords, said in [((X, True, [X, True]), {"use_cache": False}, "argument 1 was False"),
                                 ((X, False, [X, False]), {"use_cache": False}, "argument 2[1] was True"),
                                 ((X, False, [X, True]), {"use_cache": True}, "keyword 'use_cache' was False")]:
        with pytest.raises(InputMismatchError, match=re.escape(said) + ".* compiled for that value; got"):
            program(*args, device="interpret", **keywords)


def test_none_arguments_are_flags_and_a_call_passing_a_tensor_there_is_refused():
    """An optional argument left out (`bias=None`, diffusers' `added_cond_kwargs={"resolution": None}`)
    was refused as "example input 1 is a NoneType": it is compiled in as None, as a bool is."""

    class Model(torch.nn.Module):
        def forward(self, x, bias=None, extra=None):
            y = x * 2 if bias is None else x + bias
            return y if extra["scale"] is None else y * extra["scale"]

    program = emmy.optimize(Model(), X, None, example_kwargs={"extra": {"scale": None}})
    assert [name for name, _ in program.signature.inputs] == ["x"]
    torch.testing.assert_close(program(X, None, extra={"scale": None}), X * 2)
    for args, keywords, said in [((X, X), {"extra": {"scale": None}}, "argument 1 was None"),
                                 ((X, None), {"extra": {"scale": X}}, "keyword 'extra'['scale'] was None")]:
        with pytest.raises(InputMismatchError, match=re.escape(said) + ".* compiled for that value; got something"):
            program(*args, device="interpret", **keywords)


def test_nested_inputs_are_taken_as_the_module_takes_them():
    # An LSTM cell takes (x, (h, c)): capture refused the tuple ("example input 1 is a tuple").
    cell = torch.nn.LSTMCell(12, 20)
    x, state = torch.randn(3, 12), (torch.randn(3, 20), torch.randn(3, 20))
    program = emmy.optimize(cell, x, state)
    assert [name for name, _ in program.signature.inputs] == ["input", "hx_0", "hx_1"]
    with torch.no_grad():
        expected = cell(x, state)
    for device in ("sim", "interpret"):
        for got, want in zip(program(x, state, device=device), expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputMismatchError, match=r"takes 3 inputs \(input, hx_0, hx_1\), got 2"):
        program(x, state[0])
    from emmy.runtime import check_program

    assert all(c.ok for c in check_program(program, mode="asan"))  # torch's reference takes them nested too


class MaskedEncoder(torch.nn.Module):
    """Called as a Hugging Face model is: ids positionally, the rest by keyword, past an optional
    argument the call leaves out."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(30, 16)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    def forward(self, ids, past=None, attention_mask=None, temperature=1.0):
        hidden = self.layer(self.embed(ids), src_key_padding_mask=attention_mask == 0)
        return {"logits": hidden @ self.embed.weight.T / temperature}


def test_keyword_inputs_are_taken_and_called_as_the_module_takes_them(tmp_path):
    model = MaskedEncoder().eval()
    ids, mask = torch.randint(0, 30, (2, 7)), torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    program = emmy.optimize(model, ids, example_kwargs={"temperature": 0.5, "attention_mask": mask})
    assert [name for name, _ in program.signature.inputs] == ["ids", "temperature", "attention_mask"]
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, temperature=2.0)["logits"]
    for device in ("sim", "interpret"):  # keywords in another order than captured, another temperature
        got = program(ids, attention_mask=mask, temperature=2.0, device=device)["logits"]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputMismatchError, match="takes the keywords temperature, attention_mask: missing temperature"):
        program(ids, attention_mask=mask)
    with pytest.raises(InputMismatchError, match="unexpected past"):
        program(ids, attention_mask=mask, temperature=1.0, past=mask)
    program.save(tmp_path / "encoder.emmy")
    loaded = emmy.load(tmp_path / "encoder.emmy")
    torch.testing.assert_close(loaded(ids, temperature=2.0, attention_mask=mask)["logits"], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(EmmyError, match="example_kwargs are for an nn.Module or a function"):
        emmy.optimize("x=torch.randn(3); x * 2", example_kwargs={"y": torch.randn(3)})
    # a model's keyword passed to optimize as its own: the error says where it goes
    with pytest.raises(TypeError, match=r"takes no keyword 'attention_mask'.*example_kwargs=\{'attention_mask': ...\}"):
        emmy.optimize(model, ids, attention_mask=mask)


class RunningTotal(torch.nn.Module):
    """Changes its input and a buffer in place, as a KV cache or a running statistic does."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        self.total.add_(x.sum(0))
        x.mul_(2)
        return x / (self.total + 1)


def test_changes_in_place_are_made_and_never_returned(tmp_path):
    # torch.export lists a module's in-place changes as outputs before the returned ones: the
    # program returned the buffer's new values (shape [4]) for the module's [3, 4] result.
    from emmy.runtime import check_program

    x = torch.rand(3, 4)
    program = emmy.optimize(RunningTotal(), x.clone())
    assert all(c.ok for c in check_program(program, [x.clone()], mode="asan"))
    eager = RunningTotal()
    for call in range(3):  # the last call by a program saved with the buffer's total so far
        runner = program if call < 2 else _saved_and_loaded(program, tmp_path / "total.emmy")
        mine, theirs = x.clone(), x.clone()
        got = runner(mine)
        with torch.no_grad():
            want = eager(theirs)
        torch.testing.assert_close(got, want)  # the buffer's total grows call by call, as eager's
        torch.testing.assert_close(mine, theirs)  # the caller's tensor doubled
    interpreted = x.clone()
    assert program(interpreted, device="interpret").shape == (3, 4) and torch.equal(interpreted, x * 2)


def test_a_training_module_is_compiled_for_inference_said_once_and_left_as_it_was(caplog):
    # optimize called .eval() on the caller's module and left it so, silently
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6), torch.nn.Dropout(0.5))
    x = torch.randn(8, 6)
    with caplog.at_level("WARNING", logger="emmy.capture"):
        program = emmy.optimize(model, x)
        emmy.optimize(torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU()), x)  # no mode to mind
    assert [r.getMessage()[:39] for r in caplog.records] == ["emmy compiles Sequential for inference:"]
    assert model.training and model[1].training and model[2].training
    with torch.no_grad():
        torch.testing.assert_close(program(x), model.eval()(x))


def _saved_and_loaded(program, path):
    program.save(path)
    return emmy.load(path)


def test_inputs_that_do_not_match_are_refused_naming_the_input():
    program = emmy.optimize(norm_project, X, W)
    with pytest.raises(InputMismatchError, match=r"input 0 \(x\): expected shape \[4, 16\], got \[5, 16\]"):
        program(torch.randn(5, 16), W)
    with pytest.raises(InputMismatchError, match="takes 2 inputs"):
        program(X)
    for device in ("sim", "interpret"):  # never the example inputs in the caller's stead
        with pytest.raises(InputMismatchError, match=r"takes 2 inputs \(x, w\), got 0"):
            program(device=device)
    with pytest.raises(InputMismatchError, match="dtype"):
        program(X.half(), W)
    with pytest.raises(InputMismatchError, match="expected a CUDA tensor"):
        program(X, W, device="cuda")
    with pytest.raises(EmmyError, match="unknown device 'gpu'"):
        program(X, W, device="gpu")


def test_stop_after_is_checked_and_builds_every_stage_it_names():
    with pytest.raises(UnknownStageError, match="unknown stop_after stage 'bogus'; stages are torch, tensor"):
        emmy.optimize(CODE, stop_after="bogus")
    program = emmy.optimize(CODE, stop_after="cuda")
    assert {"tensor_program", "loop_result", "tile_ir", "kernel_ir", "cuda_source"} <= set(program.__dict__)
    early = emmy.optimize(CODE, stop_after="loop")
    assert "loop_result" in early.__dict__ and "tile_ir" not in early.__dict__
    assert repr(early) == "<emmy program (x: f32[4, 16], w: f32[8, 16]) -> out0, out1 for sm_90; built: tensor, loop>"


def test_every_error_class_a_caller_can_meet_is_an_emmy_error():
    from emmy.kernel_ir.lower import Unsupported
    from emmy.measure import NoGpuError
    from emmy.measure_db import MeasurementDbError
    from emmy.gpu import GpuError

    classes = [c for _, c in inspect.getmembers(emmy.errors, inspect.isclass) if c.__module__ == "emmy.errors"]
    assert len(classes) >= 12 and all(issubclass(c, EmmyError) for c in classes)
    for moved in (Unsupported, NoGpuError, MeasurementDbError, GpuError):
        assert moved.__module__ == "emmy.errors" and issubclass(moved, EmmyError)
    assert emmy.errors.KernelFault.exit_code == 1 and EmmyError.exit_code == 2


def test_the_kernel_table_names_rows_times_registers_and_shared_memory():
    program = emmy.optimize(NormProject(), X)
    kernels = program.kernels
    assert [k.name for k in kernels] == [tk.kernel.name for tk in program.tile_ir.kernels]
    assert [n for k in kernels for n in k.launches] == [k.name for k in program.kernel_ir]
    cubin = program.cubin()
    for info, tile in zip(kernels, program.tile_ir.kernels):
        assert info.row == str(tile.row) and info.predicted_s == tile.seconds
        assert info.registers == max(cubin.resources[n].registers for n in info.launches) > 0
        assert info.shared_bytes >= 0 and info.measured_s is None  # nothing measured in the test database
        assert info.name in info.describe() and "registers" in info.describe()


def _fresh_process(script: str, tmp_path: Path) -> dict:
    """Run `script` in a new interpreter where egglog cannot be imported, torch.export.export fails
    and nvcc is not on PATH; it prints one JSON line."""
    guard = textwrap.dedent("""
        import sys
        sys.modules["egglog"] = None  # any import of egglog fails
        import torch, torch.export
        def refuse(*args, **kwargs):
            raise AssertionError("a loaded program must not call torch.export")
        torch.export.export = refuse
    """)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists())
    done = subprocess.run([sys.executable, "-c", guard + textwrap.dedent(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_saved_program_runs_in_a_fresh_process_without_egglog_torch_export_or_nvcc(tmp_path):
    program = emmy.optimize(NormProject(), X)
    path = tmp_path / "norm.emmy"
    program.save(path)
    want = program(X)
    torch.save({"x": X, **want}, tmp_path / "io.pt")
    got = _fresh_process(f"""
        import json, emmy
        loaded = emmy.load({str(path)!r})
        io = torch.load({str(tmp_path / 'io.pt')!r})
        out = loaded(io["x"], sim_mode="asan")
        same = {{k: bool(torch.equal(out[k], io[k])) for k in out}}
        print(json.dumps({{"same": same, "names": list(loaded.signature.output_names),
                          "kernels": [k.name for k in loaded.kernels], "egglog": sys.modules.get("egglog") is not None,
                          "explains": "k_" in loaded.explain(), "targets": sorted(loaded.builds)}}))
    """, tmp_path)
    assert got == {"same": {"hidden": True, "normed": True}, "names": ["hidden", "normed"],
                   "kernels": [k.name for k in program.kernels], "egglog": False, "explains": True,
                   "targets": ["sm_90"]}


def test_a_saved_file_carries_the_cubin_and_gpu_library_of_its_target(tmp_path):
    from emmy.saved import load

    program = emmy.optimize(CODE, target="sm_80")
    program.save(tmp_path / "p.emmy")
    loaded = load(tmp_path / "p.emmy")
    build = loaded.builds["sm_80"]
    assert build.cubin == program.cubin("sm_80").path.read_bytes()
    assert build.library.startswith(b"\x7fELF") and loaded.gpu_library().read_bytes() == build.library
    assert loaded.cuda_source == program.cuda_source and loaded.target == "sm_80"
    with pytest.raises(EmmyError, match="no Tensor IR to interpret"):
        loaded(*program.example_inputs, device="interpret")


def test_damaged_foreign_and_other_version_files_are_refused_with_a_reason(tmp_path):
    program = emmy.optimize(CODE)
    path = tmp_path / "p.emmy"
    program.save(path)
    data = path.read_bytes()

    def refused(content: bytes, match: str):
        bad = tmp_path / "bad.emmy"
        bad.write_bytes(content)
        with pytest.raises(SavedProgramError, match=match):
            emmy.load(bad)

    refused(data[:-100], "damaged: its contents do not match their checksum")
    flipped = bytearray(data)
    flipped[-50] ^= 0xFF
    refused(bytes(flipped), "damaged")
    refused(b"PK\x03\x04 a zip file", "not a saved emmy program")
    header_end = data.index(b"\n", data.index(b"\n") + 1)
    header = json.loads(data[data.index(b"\n") + 1:header_end])
    old = data.replace(json.dumps(header).encode(), json.dumps({**header, "emmy": "0.0.1"}).encode())
    refused(old, r"saved by emmy 0\.0\.1 .* this is emmy .*: compile and save the program again")
    with pytest.raises(SavedProgramError, match="cannot read"):
        emmy.load(tmp_path / "missing.emmy")
    # and the intact file still loads and runs
    loaded = emmy.load(path)
    x, w = program.example_inputs
    a, b = loaded(x, w)
    torch.testing.assert_close(b, F.rms_norm(x, (16,)))


def test_import_emmy_stays_light():
    probe = ("import sys, emmy, emmy.cli; heavy = [m for m in ('torch', 'egglog', 'scipy', 'jinja2') if m in sys.modules]; "
             "print(','.join(heavy))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_a_named_result_of_torch_comes_back_as_that_type_and_names_its_outputs(tmp_path):
    """torch.max(x, 1) returns torch.return_types.max (fields values, indices), whose tree spec does
    not serialize: the program handed back a plain tuple, so `.values` failed."""
    class Max(torch.nn.Module):
        def forward(self, x):
            return torch.max(x, 1)

    x = torch.randn(3, 4)
    program = emmy.optimize(Max(), x)
    got, want = program(x), Max()(x)
    assert type(got) is torch.return_types.max
    torch.testing.assert_close(got.values, want.values)
    assert torch.equal(got.indices, want.indices)
    assert program.signature.output_names == ("values", "indices")
    program.save(tmp_path / "max.emmy")
    assert type(emmy.load(tmp_path / "max.emmy")(x)) is torch.return_types.max


def test_named_results_of_torch_nested_in_the_returned_structure_keep_their_type_and_field_names(tmp_path):
    """A named result inside a tuple, list or dict (`return x.argmin(), x.max(0), [...]`) made the whole
    spec unserializable, so the program handed back every tensor in one flat tuple."""
    class Nested(torch.nn.Module):
        def forward(self, x):
            return x.argmin(), x.max(0), {"sorted": torch.sort(x, 1), "pair": [x.min(1), x * 2]}

    x = torch.randn(4, 6)
    program = emmy.optimize(Nested(), x)
    assert program.signature.output_names == ("out0", "out1.values", "out1.indices", "out2.sorted.values",
                                              "out2.sorted.indices", "out2.pair.0.values", "out2.pair.0.indices",
                                              "out2.pair.1")
    program.save(tmp_path / "nested.emmy")
    want = Nested()(x)
    for got in (program(x), emmy.load(tmp_path / "nested.emmy")(x)):
        assert type(got) is tuple and len(got) == 3 and torch.equal(got[0], want[0])
        assert type(got[1]) is torch.return_types.max and torch.equal(got[1].indices, want[1].indices)
        assert type(got[2]["sorted"]) is torch.return_types.sort and type(got[2]["pair"]) is list
        assert type(got[2]["pair"][0]) is torch.return_types.min
        torch.testing.assert_close(got[2]["sorted"].values, want[2]["sorted"].values)
        torch.testing.assert_close(got[2]["pair"][1], want[2]["pair"][1])
