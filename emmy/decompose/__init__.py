"""Decompose a core-ATen ExportedProgram into Tensor IR."""

from emmy.decompose.from_aten import TensorProgram, to_tensor_ir

__all__ = ["TensorProgram", "to_tensor_ir"]
