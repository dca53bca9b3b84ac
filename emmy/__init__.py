"""emmy: an e-graph compiler from PyTorch programs to CUDA kernels.

`emmy.optimize(graph, *example_inputs, target=...)` is the entry point; it
imports torch only when called, so `import emmy` stays cheap.
"""

from emmy.api import optimize
from emmy.errors import EmmyError
from emmy.program import Program

__version__ = "0.1.0"
__all__ = ["optimize", "load", "EmmyError", "Program", "__version__"]


def load(path):
    """A program saved by `Program.save`, ready to call on tensors (emmy.saved)."""
    from emmy.saved import load as load_saved

    return load_saved(path)
