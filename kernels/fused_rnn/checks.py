"""Input checks and launch parameters shared by the Triton backends (fused and alternating)."""

from __future__ import annotations

import torch

from kernels._triton import triton_available
from kernels.fused_rnn.reference import CellSpec, check_inputs

#: storage dtypes the Triton backends accept (float64 is meant for tests; accumulation is float32
#: for float32 / bfloat16 storage and float64 for float64)
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


def check_fast_inputs(
    backend: str, cell: str, wx: torch.Tensor, R: torch.Tensor, b: torch.Tensor, states0: torch.Tensor | None
) -> CellSpec:
    """Shapes (as the reference), then device / dtype / contiguity; one-line errors."""
    tensors = {"wx": wx, "R": R, "b": b} | ({"states0": states0} if states0 is not None else {})
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"fused_rnn[{backend}]: {name} must be a torch.Tensor, got {type(x).__name__}")
    spec = check_inputs(cell, wx, R, b, states0)
    if wx.dtype not in DTYPES:
        raise TypeError(
            f"fused_rnn[{backend}]: dtype {wx.dtype} is not supported; use one of "
            f"{', '.join(str(d) for d in DTYPES)} (or backend='reference')"
        )
    for name, x in tensors.items():
        if x.dtype != wx.dtype:
            raise TypeError(
                f"fused_rnn[{backend}]: {name} has dtype {x.dtype} but wx has {wx.dtype}; cast them to one dtype"
            )
        if x.device != wx.device:
            raise ValueError(f"fused_rnn[{backend}]: {name} is on {x.device} but wx is on {wx.device}")
        if not x.is_contiguous():
            raise ValueError(f"fused_rnn[{backend}]: {name} must be contiguous (call .contiguous())")
    if not triton_available(wx):
        raise ValueError(
            f"fused_rnn[{backend}]: Triton cannot run on {wx.device} (needs a CUDA tensor, or TRITON_INTERPRET=1 "
            "on the CPU); use backend='reference'"
        )
    return spec


def full_precision_h(cell: str, dtype: torch.dtype) -> bool:
    """Whether the forward feeds h to the recurrent matmul at ~float32 precision instead of rounded
    to the storage dtype: the bfloat16 sLSTM, whose stabilizer branch (``m = max(log σ(f) + m_prev,
    i)``) flips under bfloat16 rounding of h and makes the gradients of i / f jump (see
    ``fused.launch_config``). The fused kernel splits h into two bfloat16 parts; the alternating
    backend multiplies the float32 h."""
    return cell == "slstm" and dtype == torch.bfloat16


def head_dim_padded(dh: int) -> int:
    """The power of two >= max(dh, 16) that tiles a head (tl.dot needs >= 16)."""
    return max(16, 1 << (dh - 1).bit_length())


#: tests and the GPU check set this: outputs and saved tensors start as NaN, so unwritten elements show
POISON = False


def new_output(*shape, device, dtype) -> torch.Tensor:
    """``torch.empty(*shape)``, or NaN-filled when ``POISON`` is set."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if POISON:
        return torch.full(shape, float("nan"), device=device, dtype=dtype)
    return torch.empty(shape, device=device, dtype=dtype)
