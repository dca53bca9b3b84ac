"""The Python API on a real GPU: programs called on CUDA tensors, a saved program loaded and run, and
torch.compile(backend="emmy") on CUDA tensors, each compared with eager PyTorch on the same GPU.

    python benchmarks/gpu_api_check.py --out report.md

benchmarks/gpu_session.py runs it beside its timing jobs. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

CASES = {
    "rmsnorm f32": "x=torch.randn(256,1024); w=torch.randn(1024); F.rms_norm(x,(1024,),w)",
    "matmul f16": "a=torch.randn(512,512,dtype=torch.float16); b=torch.randn(512,512,dtype=torch.float16); a@b",
    "softmax+gather": "x=torch.randn(64,1000); i=torch.randint(0,1000,(64,5)); torch.gather(F.softmax(x,-1),1,i)",
    "sdpa f16": ("q=torch.randn(1,4,128,64,dtype=torch.float16); k=torch.randn(1,4,128,64,dtype=torch.float16); "
                 "v=torch.randn(1,4,128,64,dtype=torch.float16); F.scaled_dot_product_attention(q,k,v,is_causal=True)"),
}


def _close(got, want) -> str:
    import torch

    got, want = (got,) if isinstance(got, torch.Tensor) else got, (want,) if isinstance(want, torch.Tensor) else want
    errors = [float((g.double() - w.double()).abs().max()) for g, w in zip(got, want)]
    return f"max abs diff {max(errors):.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing checked")
        return 0
    import emmy
    from emmy.calling import gpu_arch

    arch = gpu_arch(torch.device("cuda"))
    lines = [f"# The Python API on {torch.cuda.get_device_name()} ({arch})", "",
             "| case | program(*cuda) vs eager | loaded program vs program | seconds |", "|---|---|---|---|"]
    failures = 0
    for name, code in CASES.items():
        start = time.time()
        try:
            program = emmy.optimize(code, target=arch)
            inputs = [x.cuda() for x in program.example_inputs]
            got = program(*inputs)
            namespace = {"torch": torch, "F": torch.nn.functional, "inputs": inputs}
            names = [part.split("=")[0].strip() for part in code.split(";")[:-1]]
            namespace.update(zip(names, inputs))
            want = eval(code.split(";")[-1], namespace)  # noqa: S307 - our own case table
            with tempfile.TemporaryDirectory() as tmp:
                program.save(Path(tmp) / "p.emmy")
                loaded = emmy.load(Path(tmp) / "p.emmy")(*inputs)
            same = all(torch.equal(a, b) for a, b in zip(
                (loaded,) if isinstance(loaded, torch.Tensor) else loaded, (got,) if isinstance(got, torch.Tensor) else got))
            lines.append(f"| {name} | {_close(got, want)} | {'bit-identical' if same else 'DIFFERENT'} | "
                         f"{time.time() - start:.1f} |")
            failures += not same
        except Exception as err:  # noqa: BLE001 - one failing case must not hide the others
            failures += 1
            traceback.print_exc()
            lines.append(f"| {name} | FAILED: {type(err).__name__}: {str(err).splitlines()[0][:120]} | | |")
    try:
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256)).cuda().eval()
        x = torch.randn(64, 256, device="cuda")
        with torch.no_grad():
            compiled = torch.compile(model, backend="emmy", dynamic=False)(x)
            lines += ["", f"torch.compile(backend='emmy') MLP on CUDA: {_close(compiled, model(x))}"]
    except Exception as err:  # noqa: BLE001
        failures += 1
        traceback.print_exc()
        lines += ["", f"torch.compile(backend='emmy') MLP on CUDA: FAILED: {type(err).__name__}: {err}"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
