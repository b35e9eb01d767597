"""What the Triton backends (fused and alternating) share: input checks, head padding, and the
custom ops + eager autograd of a backend (``TritonBackend``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable

from seqkernels._triton import triton_available
from seqkernels.fused_rnn.cell_kernels import NUM_SAVED
from seqkernels.fused_rnn.reference import CellSpec, cell_spec, check_inputs

#: storage dtypes the Triton backends accept (accumulation is float32 for float32 / bfloat16 storage
#: and float64 for float64); float64 only in the interpreter (tests): CUDA Triton has no float64 dots
DTYPES = (torch.float32, torch.bfloat16, torch.float64)
CUDA_DTYPES = (torch.float32, torch.bfloat16)


def check_fast_inputs(
    backend: str, cell: str, wx: torch.Tensor, R: torch.Tensor, b: torch.Tensor, states0: torch.Tensor | None
) -> CellSpec:
    """Shapes (as the reference), then device / dtype / contiguity; one-line errors."""
    tensors = {"wx": wx, "R": R, "b": b} | ({"states0": states0} if states0 is not None else {})
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"fused_rnn[{backend}]: {name} must be a torch.Tensor, got {type(x).__name__}")
    spec = check_inputs(cell, wx, R, b, states0)
    if wx.dtype not in (CUDA_DTYPES if wx.is_cuda else DTYPES):
        raise TypeError(
            f"fused_rnn[{backend}]: dtype {wx.dtype} is not supported on {wx.device.type}; use one of "
            f"{', '.join(str(d) for d in (CUDA_DTYPES if wx.is_cuda else DTYPES))} (or backend='reference')"
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


def check_saved(name: str, cell: str, saved: torch.Tensor, out_shape) -> None:
    """``saved`` must be what a forward with ``save=True`` wrote for outputs ``h`` of ``out_shape``."""
    bsz, length, nh, dh = out_shape
    if saved.dim() != 5 or saved.shape != (bsz, length + 1, nh, NUM_SAVED[cell], dh):
        raise ValueError(f"{name}: saved has shape {tuple(saved.shape)}; run the forward with save=True")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation / saved-state dtype: float64 for float64 storage, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class TritonBackend:
    """One Triton backend of ``fused_rnn`` as custom ops (``expressivity::<name>_fwd`` / ``_bwd``,
    the ``torch.compile`` path) and as an eager ``autograd.Function`` over the same launches.

    ``forward(cell, wx, R, b, states0, save, config) -> (h, last_states, saved)`` and
    ``backward(cell, dh, dlast, R, saved, config) -> (dwx, dR, db, dstates0)``; ``config``: the
    backend's launch configuration, ``None`` = its default. ``saved (B, T + 1, NH, N_saved, DH)``
    (accumulation dtype) holds what the backward reads; empty when ``save`` is False.
    """

    def __init__(self, name: str, forward: Callable, backward: Callable):
        self.name, self.forward, self.backward = name, forward, backward

        def fwd(
            cell: str, wx: torch.Tensor, R: torch.Tensor, b: torch.Tensor, states0: torch.Tensor, save: bool
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return forward(cell, wx, R, b, states0, save, None)

        def bwd(
            cell: str, dh_out: torch.Tensor, dlast: torch.Tensor, R: torch.Tensor, saved: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
            return backward(cell, dh_out, dlast, R, saved, None)

        self.fwd_op = torch.library.custom_op(f"expressivity::{name}_fwd", fwd, mutates_args=())
        self.bwd_op = torch.library.custom_op(f"expressivity::{name}_bwd", bwd, mutates_args=())
        self.fwd_op.register_fake(_fake_fwd)
        self.bwd_op.register_fake(_fake_bwd)

        def setup(ctx, inputs, output):
            ctx.cell = inputs[0]
            ctx.save_for_backward(inputs[2], output[2])
            ctx.mark_non_differentiable(output[2])

        def grad(ctx, dh, dlast, _dsaved):
            R, saved = ctx.saved_tensors
            dh, dlast = _grads_out(ctx.cell, R, saved, dh, dlast)
            return (None, *self.bwd_op(ctx.cell, dh, dlast, R, saved), None)

        self.fwd_op.register_autograd(grad, setup_context=setup)

    def __call__(self, cell, wx, R, b, states0=None, config=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h, last_states)``, the signature and result of ``fused_rnn_reference`` (checked inputs)."""
        if states0 is None:
            states0 = wx.new_zeros(cell_spec(cell).num_states, wx.shape[0], wx.shape[2], wx.shape[4])
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (wx, R, b, states0))
        if torch.compiler.is_compiling():
            return self.fwd_op(cell, wx, R, b, states0, grad)[:2]
        if grad:
            return _Eager.apply(self, cell, config, wx, R, b, states0)
        return self.forward(cell, wx, R, b, states0, False, config)[:2]


def _grads_out(cell, R, saved, dh, dlast):
    """The output gradients, zeros where autograd passes none, contiguous."""
    if saved.dim() != 5:
        raise RuntimeError("fused_rnn: backward through a forward run with save=False (under no_grad?)")
    bsz, length1, nh, _, dhd = saved.shape
    dh = R.new_zeros(bsz, length1 - 1, nh, dhd) if dh is None else dh.contiguous()
    dlast = R.new_zeros(cell_spec(cell).num_states, bsz, nh, dhd) if dlast is None else dlast.contiguous()
    return dh, dlast


class _Eager(torch.autograd.Function):
    @staticmethod
    def forward(ctx, backend: TritonBackend, cell: str, config, wx, R, b, states0):
        h, last, saved = backend.forward(cell, wx, R, b, states0, True, config)
        ctx.save_for_backward(R, saved)
        ctx.backend, ctx.cell, ctx.config = backend, cell, config
        return h, last

    @staticmethod
    @once_differentiable
    def backward(ctx, dh, dlast):
        R, saved = ctx.saved_tensors
        dh, dlast = _grads_out(ctx.cell, R, saved, dh, dlast)
        return (None, None, None, *ctx.backend.backward(ctx.cell, dh, dlast, R, saved, ctx.config))


def _fake_fwd(cell, wx, R, b, states0, save):
    bsz, length, nh, _, dh = wx.shape
    saved_shape = (bsz, length + 1, nh, NUM_SAVED[cell], dh) if save else (0,)
    return (
        wx.new_empty(bsz, length, nh, dh),
        wx.new_empty(cell_spec(cell).num_states, bsz, nh, dh),
        wx.new_empty(saved_shape, dtype=acc_dtype(wx.dtype)),
    )


def _fake_bwd(cell, dh_out, dlast, R, saved):
    spec = cell_spec(cell)
    bsz, length, nh, dh = dh_out.shape
    return (
        R.new_empty(bsz, length, nh, spec.input_gates, dh),
        torch.empty_like(R),
        R.new_empty(nh, spec.bias_gates, dh),
        R.new_empty(spec.num_states, bsz, nh, dh),
    )


def run_checked(backend: TritonBackend, name: str, cell, wx, R, b, states0, config: object | None = None):
    """``backend`` on checked inputs; an empty sequence gives the reference's result."""
    check_fast_inputs(name, cell, wx, R, b, states0)
    if wx.shape[1] == 0:
        from seqkernels.fused_rnn.reference import fused_rnn_reference

        return fused_rnn_reference(cell, wx, R, b, states0)
    return backend(cell, wx, R, b, states0, config)
