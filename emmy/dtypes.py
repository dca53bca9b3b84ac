"""Element types of emmy tensors and their numpy and torch counterparts.

The interpreter keeps bf16 values in float32 arrays rounded to bf16
precision, since numpy has no bfloat16.
"""

from __future__ import annotations

import enum

import numpy as np

from emmy.errors import UnsupportedDtypeError


class DType(enum.Enum):
    F64 = "f64"  # registers and buffers both double: no rounding between operations
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I64 = "i64"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"
    U8 = "u8"  # images, byte masks
    BOOL = "bool"

    def __str__(self) -> str:
        return self.value

    @property
    def is_float(self) -> bool:
        return self in (DType.F64, DType.F32, DType.F16, DType.BF16)

    @property
    def fits_f32(self) -> bool:
        """Whether every value is exactly an f32 (f32 and the half types): such values order by
        their f32 bits (the arg-reductions' (value, position) keys)."""
        return self in (DType.F32, DType.F16, DType.BF16)

    @property
    def is_half(self) -> bool:
        return self in (DType.F16, DType.BF16)

    @property
    def accumulator(self) -> "DType":
        """The type sums and products accumulate in (f32 for half types)."""
        return DType.F32 if self.is_half else self

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype holding this type's values in the interpreter."""
        return np.dtype(_NUMPY[self])

    @classmethod
    def parse(cls, text: str) -> "DType":
        try:
            return cls(text)
        except ValueError:
            raise UnsupportedDtypeError(
                f"unknown dtype {text!r}; emmy supports {supported_names()}"
            ) from None


_ITEMSIZE = {DType.F64: 8, DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.I64: 8, DType.I32: 4, DType.I16: 2,
             DType.I8: 1, DType.U8: 1, DType.BOOL: 1}
_NUMPY = {
    DType.F64: np.float64,
    DType.F32: np.float32,
    DType.F16: np.float16,
    DType.BF16: np.float32,
    DType.I64: np.int64,
    DType.I32: np.int32,
    DType.I16: np.int16,
    DType.I8: np.int8,
    DType.U8: np.uint8,
    DType.BOOL: np.bool_,
}

_TORCH_NAMES = {
    "torch.float64": DType.F64,
    "torch.float32": DType.F32,
    "torch.float16": DType.F16,
    "torch.bfloat16": DType.BF16,
    "torch.int64": DType.I64,
    "torch.int32": DType.I32,
    "torch.int16": DType.I16,
    "torch.int8": DType.I8,
    "torch.uint8": DType.U8,
    "torch.bool": DType.BOOL,
}


def supported_names() -> str:
    return ", ".join(d.value for d in DType)


def from_torch(torch_dtype, where: str = "") -> DType:
    """Map a torch dtype to ours, or raise an error that names where it came from."""
    found = _TORCH_NAMES.get(str(torch_dtype))
    if found is None:
        place = f" ({where})" if where else ""
        raise UnsupportedDtypeError(
            f"unsupported dtype {str(torch_dtype).removeprefix('torch.')}{place}; "
            f"emmy supports {supported_names()}"
        )
    return found


def to_torch(dtype: DType):
    import torch

    return {
        DType.F64: torch.float64,
        DType.F32: torch.float32,
        DType.F16: torch.float16,
        DType.BF16: torch.bfloat16,
        DType.I64: torch.int64,
        DType.I32: torch.int32,
        DType.I16: torch.int16,
        DType.I8: torch.int8,
        DType.U8: torch.uint8,
        DType.BOOL: torch.bool,
    }[dtype]


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    f32 = np.array(values, dtype=np.float32, order="C")
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    # NaN must stay NaN (rounding could carry a NaN payload into infinity).
    return np.where(np.isnan(f32), f32, out)


def to_storage(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Round computed values to `dtype` and return them in its storage type."""
    if dtype is DType.BF16:
        return round_to_bf16(values)
    return np.asarray(values).astype(dtype.numpy, copy=False)


def to_numpy(tensor) -> tuple[np.ndarray, DType]:
    """A torch tensor as (numpy array in interpreter storage, dtype)."""
    import torch

    dtype = from_torch(tensor.dtype)
    t = tensor.detach().cpu()
    if dtype is DType.BF16:
        t = t.to(torch.float32)
    return t.numpy().copy(), dtype


def real_pairs(tensor):
    """A complex tensor as the (.., 2) real pairs emmy holds it as (view_as_real's layout: the same
    memory); any other tensor as it is."""
    import torch

    return torch.view_as_real(tensor.detach().resolve_conj()) if tensor.is_complex() else tensor


def from_numpy(values: np.ndarray, dtype: DType):
    import torch

    # np.array, not np.ascontiguousarray: the latter turns rank-0 arrays into rank 1.
    return torch.from_numpy(np.array(values, order="C")).to(to_torch(dtype))


def from_device(values: np.ndarray, dtype: DType) -> np.ndarray:
    """A buffer as a kernel leaves it -> interpreter storage: bf16's 16-bit patterns widened to float32."""
    if dtype is DType.BF16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values
