"""Triton linear scans (diagonal and 2x2-block), forward and backward, as ``torch.library`` custom ops.

Same signatures and semantics as ``kernels.scan.reference``:

- ``linear_scan_triton(c, x, reverse=False)``: ``c, x (B, L, D)`` -> ``y (B, L, D)``,
  ``y_t = c_t * y_{t-1} + x_t`` (``reverse``: ``y_t = c_t * y_{t+1} + x_t``);
- ``linear_scan_block2_triton(C, x, reverse=False)``: ``C (B, L, 2, 2, D)``, ``x (B, L, 2, D)``,
  ``y_t[i] = sum_j C_t[i, j] y_{t-1}[j] + x_t[i]``.

One single-pass kernel per call, of two kinds (``use_loop`` picks one):

- many lanes (``B * D`` channels in at least ``LOOP_FROM_LANE_TILES`` tiles): the chunk-loop kernels
  (``_loop_kernels.py``), one program per (batch row, channel tile) walking the whole sequence in
  chunks with the state in registers and the loads software-pipelined; no communication;
- few lanes (one long sequence): the look-back kernels (``_scan_kernels.py``): the sequence is split
  into chunks of ``CH`` steps and the channels into tiles of ``BD``; every (chunk, tile) is one
  program, so even one long sequence fills the GPU, and the carry between chunks travels by
  decoupled look-back.

The backward is the same kernel in the other direction with shifted coefficients, and writes the
coefficient gradient in the same pass (``dx_t = dy_t + c_{t+1} dx_{t+1}``, ``dc_t = dx_t y_{t-1}``).

Storage float32, bfloat16 or float16 (``c`` and ``x`` of one dtype); arithmetic in float32.
Inputs must be contiguous and on CUDA (or on the CPU under ``TRITON_INTERPRET=1``).
Custom ops: ``expressivity::linear_scan``, ``expressivity::linear_scan_block2`` and their backward
ops ``..._bwd``.
"""

from __future__ import annotations

import torch
import triton

from kernels._triton import triton_available
from kernels.scan._loop_kernels import _block2_loop_kernel, _diag_loop_kernel
from kernels.scan._scan_kernels import _block2_scan_kernel, _diag_scan_kernel

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_WS_OFFSET = 16  # int64 words before the look-back records (the ticket counter lives in word 0)


def config(L: int, D: int, block2: bool, grad: bool = False) -> tuple[int, int, int]:
    """``(CH, BD, num_warps)``: time steps per chunk, channels per tile, warps per program, for the
    forward kernel or (``grad``) the backward one.

    ``BD = 32 * num_warps`` gives every thread one channel and the chunk's ``CH`` steps of it, so the
    scan runs along time inside each thread (no shuffles) and no lane is replicated over threads.
    Measured on an H200 (2026-11-21 sweeps of 09:24 and 09:39, ``benchmarks/scan.md``): 64 x 64 on 2
    warps was the fastest diagonal tile forward and backward at every benchmark shape (16 and 32 steps
    per chunk, 128-channel tiles on 4 warps, 4-warp 64 x 64 were 7-80% slower); 2x2 blocks: 16 x 64 on
    2 warps forward (0.212 ms), 16 x 32 on one warp backward (0.318 ms).
    """
    if block2:
        BD = min(32 if grad else 64, max(16, triton.next_power_of_2(D)))
        return 16, BD, max(1, BD // 32)
    BD = min(64, max(16, triton.next_power_of_2(D)))
    return 64, BD, max(1, BD // 32)


def loop_config(L: int, D: int, block2: bool, grad: bool = False) -> tuple[int, int, int, int]:
    """``(CH, BD, num_warps, stages)`` of the chunk-loop kernels (``_loop_kernels.py``): steps per chunk,
    channels per program, warps, and pipeline stages (chunks whose loads are in flight, plus one).

    One warp per program, one channel per thread (``BD = 32``: the chunk's steps in its registers) or
    two threads per channel (``BD = 16``). Measured on an H200 (sweeps of 2026-11-21 10:47 and 10:58,
    ``benchmarks/scan.md``): 64 x 32 with 3 stages was the fastest diagonal tile forward and backward
    at (8, 4096 / 16384, 1024) (4 stages within 1-2% either way; 16- and 32-step chunks, 16- and
    64-channel tiles, 2 warps, 128-step chunks 4-160% slower). 2x2 blocks: the backward with 32 x 16
    (0.300 ms at (8, 4096, 512), the look-back's best 0.321); the forward with 16 x 32 for many lanes
    (at (8, 4096, 512), 128 such tiles, the look-back kernel runs: 0.213 ms, every chunk-loop tile
    0.266-0.625 ms).
    """
    if block2 and grad:
        return 32, 16, 1, 3
    BD = min(32, max(16, triton.next_power_of_2(D)))
    return (16, BD, 1, 3) if block2 else (64, BD, 1, 3)


#: The chunk-loop kernels run from this many lane tiles (``B * cdiv(D, BD)`` with ``loop_config``'s
#: ``BD``) on, about two programs per SM of an H200 (132 SMs); below, there are too few programs to keep
#: the memory busy and the look-back kernels split the sequence instead. Measured forward (10:47 and
#: 10:58): 256 lane tiles (8, 4096, 1024): loop 0.109 ms vs look-back 0.124; 128 (4, 8192, 1024): 0.182
#: (0.141 with 16-channel tiles, 256 programs) vs 0.130; 64 (2, 16384, 1024): 0.355 (0.243) vs 0.142.
LOOP_FROM_LANE_TILES = 256


def use_loop(B: int, L: int, D: int, block2: bool, grad: bool = False) -> bool:
    """Whether a scan of this shape runs the chunk-loop kernel (else the look-back kernel)."""
    BD = loop_config(L, D, block2, grad)[1]
    return B * triton.cdiv(D, BD) >= LOOP_FROM_LANE_TILES


def check_inputs(name: str, c: torch.Tensor, x: torch.Tensor, block2: bool) -> None:
    """One-line ``TypeError`` / ``ValueError`` for anything the kernels cannot take."""
    if not isinstance(c, torch.Tensor) or not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: c and x must be tensors, got {type(c).__name__} and {type(x).__name__}")
    c_extra, x_extra = ((2, 2), (2,)) if block2 else ((), ())
    if x.dim() != 3 + len(x_extra) or tuple(x.shape[2:-1]) != x_extra:
        want = "x (B, L, 2, D)" if block2 else "x (B, L, D)"
        raise ValueError(f"{name}: expected {want}, got x of shape {tuple(x.shape)}")
    B, L, D = x.shape[0], x.shape[1], x.shape[-1]
    if tuple(c.shape) != (B, L, *c_extra, D):
        raise ValueError(f"{name}: c has shape {tuple(c.shape)}, expected {(B, L, *c_extra, D)} to match x")
    if c.device != x.device:
        raise ValueError(f"{name}: c is on {c.device} but x is on {x.device}")
    if x.dtype not in DTYPES or c.dtype != x.dtype:
        raise TypeError(
            f"{name}: c and x must share one dtype of float32/bfloat16/float16, got {c.dtype} and {x.dtype} "
            "(use backend='torch' for float64)"
        )
    if not (c.is_contiguous() and x.is_contiguous()):
        raise ValueError(f"{name}: c and x must be contiguous (call .contiguous() first)")
    if not triton_available(x):
        raise ValueError(f"{name}: Triton needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU), got {x.device}")


#: Records per look-back step of the diagonal scan after the first (``_lookback.lookback_diag``) ...
LOOKBACK_WINDOW = 4
#: ... below this many lane tiles (``B * cdiv(D, BD)``) per chunk; from it on, one record per step:
#: with many lane tiles few chunks of one tile run at once, the walks are short, and a window only
#: costs registers (H200 sweep at 32 x 64: one record 5% faster at B = 8, D = 1024; a 4-record window
#: 7% faster at B = 1, L = 65536, D = 256, where the one-record walk bounds the kernel).
ONE_RECORD_FROM_LANE_TILES = 64
#: Compile the kernels for the exact channel count ``D`` when it is a multiple of 16 (model widths):
#: the row stride becomes a constant and the tile's row addresses immediates, which saves ~60-90
#: registers per thread at 64-step chunks (no spills); other ``D`` share one kernel with a runtime stride.
SPECIALIZE_D = True
#: Register cap per thread of the look-back kernels (Triton's ``maxnreg``); None: the compiler's choice
#: (222 for the 64 x 64 forward on triton 3.6). H200 sweep of 11:32 at (1, 65536, 256): 168 made the
#: forward 5% faster and the backward 3% slower, 128 spilled; so None.
LOOKBACK_MAXNREG = None

#: Launches of one cached workspace before it is zeroed: its records carry a 31-bit launch tag
#: (``_lookback.py``), which must not repeat while an old record could still be read as published.
WS_LAUNCH_LIMIT = 2**31 - 1
_workspaces: dict[tuple[str, int], list] = {}  # (device, stream) -> [int64 workspace, launches since zeroed]


def _workspace(device: torch.device, words: int) -> torch.Tensor:
    """The int64 look-back workspace of the current stream on ``device`` (at least ``words`` words).

    Cached per (device, stream) and reused by every launch: the kernels need no zeroing between launches
    (the ticket counter in word 0 resets itself and carries the epoch; records are tagged by launch,
    ``_lookback.py``). One workspace per stream, because launches on one stream never overlap. Limits:
    it stays allocated (the largest size asked for, per stream); under CUDA graph replay the host does
    not count launches, so a graph replayed more than ``WS_LAUNCH_LIMIT`` times without an eager launch
    in between could meet repeated tags; capture after one eager (warm-up) call, so the workspace
    is not allocated inside the capture.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    entry = _workspaces.get(key)
    if entry is None or entry[0].numel() < words:
        entry = _workspaces[key] = [torch.zeros(words, dtype=torch.int64, device=device), 0]
    elif entry[1] >= WS_LAUNCH_LIMIT:
        entry[0].zero_()
        entry[1] = 0
    entry[1] += 1
    return entry[0]


def _launch(c, x, out, yfwd, dc, reverse: bool, grad: bool, block2: bool) -> None:
    B, L, D = x.shape[0], x.shape[1], x.shape[-1]
    if out.numel() == 0:
        return
    loop = use_loop(B, L, D, block2, grad)
    CH, BD, warps, *stages = loop_config(L, D, block2, grad) if loop else config(L, D, block2, grad)
    if (CH + 1) * (4 if block2 else 1) * D + BD >= 2**31:
        raise ValueError(f"linear_scan_triton: D = {D} is too large for the kernels' int32 in-tile offsets")
    n_dt = triton.cdiv(D, BD)
    n_chunks = triton.cdiv(L, CH)
    dconst = D if SPECIALIZE_D and D % 16 == 0 else 0
    if loop:
        kernel = _block2_loop_kernel if block2 else _diag_loop_kernel
        kernel[(B * n_dt,)](
            c, x, out, yfwd, dc, L, D, n_dt, n_chunks,
            REVERSE=reverse, GRAD=grad, CH=CH, BD=BD, STAGES=stages[0], DC=dconst, num_warps=warps,
        )
        return
    n_lt = B * n_dt
    words = 8 if block2 else 3  # record words per lane (_lookback.py)
    ws = _workspace(x.device, _WS_OFFSET + n_lt * n_chunks * words * BD)
    extra = {"DC": dconst}
    if not block2:
        extra["WIN"] = 1 if n_lt >= ONE_RECORD_FROM_LANE_TILES else LOOKBACK_WINDOW
    if LOOKBACK_MAXNREG is not None:
        extra["maxnreg"] = LOOKBACK_MAXNREG
    kernel = _block2_scan_kernel if block2 else _diag_scan_kernel
    kernel[(n_lt * n_chunks,)](
        c, x, out, yfwd, dc, ws[_WS_OFFSET:], ws,
        L, D, n_dt, n_lt, n_chunks,
        REVERSE=reverse, GRAD=grad, CH=CH, BD=BD, num_warps=warps, **extra,
    )


def _alloc(like: torch.Tensor) -> torch.Tensor:
    """Output allocation (tests replace it to poison outputs)."""
    return torch.empty_like(like)


def _forward(c, x, reverse, block2):
    out = _alloc(x)
    _launch(c, x, out, out, out, reverse, False, block2)
    return out


def _backward(c, y, dy, reverse, block2):
    dx = _alloc(y)
    dc = _alloc(c)
    # the backward of a forward scan is a reverse scan with coefficients c_{t+1}, and vice versa
    _launch(c, dy, dx, y, dc, not reverse, True, block2)
    return dc, dx


# ---------------------------------------------------------------- custom ops: diagonal


@torch.library.custom_op("expressivity::linear_scan", mutates_args=())
def _scan_op(c: torch.Tensor, x: torch.Tensor, reverse: bool) -> torch.Tensor:
    check_inputs("linear_scan_triton", c, x, block2=False)
    return _forward(c, x, reverse, False)


@_scan_op.register_fake
def _(c, x, reverse):
    return torch.empty_like(x)


@torch.library.custom_op("expressivity::linear_scan_bwd", mutates_args=())
def _scan_bwd_op(c: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward(c, y, dy, reverse, False)


@_scan_bwd_op.register_fake
def _(c, y, dy, reverse):
    return torch.empty_like(c), torch.empty_like(y)


def _setup(ctx, inputs, output):
    c, _, reverse = inputs
    ctx.save_for_backward(c, output)
    ctx.reverse = reverse


def _grad_through(bwd_op):
    """The autograd formula of a scan op whose backward custom op is ``bwd_op``."""

    def grad(ctx, dy):
        c, y = ctx.saved_tensors
        dc, dx = bwd_op(c, y, dy.contiguous().to(y.dtype), ctx.reverse)
        return dc, dx, None

    return grad


_scan_op.register_autograd(_grad_through(_scan_bwd_op), setup_context=_setup)


# ---------------------------------------------------------------- custom ops: 2x2 blocks


@torch.library.custom_op("expressivity::linear_scan_block2", mutates_args=())
def _block2_op(C: torch.Tensor, x: torch.Tensor, reverse: bool) -> torch.Tensor:
    check_inputs("linear_scan_block2_triton", C, x, block2=True)
    return _forward(C, x, reverse, True)


@_block2_op.register_fake
def _(C, x, reverse):
    return torch.empty_like(x)


@torch.library.custom_op("expressivity::linear_scan_block2_bwd", mutates_args=())
def _block2_bwd_op(C: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward(C, y, dy, reverse, True)


@_block2_bwd_op.register_fake
def _(C, y, dy, reverse):
    return torch.empty_like(C), torch.empty_like(y)


_block2_op.register_autograd(_grad_through(_block2_bwd_op), setup_context=_setup)


# ---------------------------------------------------------------- public functions


def linear_scan_triton(c: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Diagonal ``y_t = c_t * y_{t-1} + x_t`` in Triton. ``c, x (B, L, D)`` -> ``y (B, L, D)``."""
    check_inputs("linear_scan_triton", c, x, block2=False)
    return _scan_op(c, x, bool(reverse))


def linear_scan_block2_triton(C: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """2x2-block scan in Triton. ``C (B, L, 2, 2, D)``, ``x (B, L, 2, D)`` -> ``y (B, L, 2, D)``."""
    check_inputs("linear_scan_block2_triton", C, x, block2=True)
    return _block2_op(C, x, bool(reverse))


def linear_scan_triton_any(c: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """``linear_scan_triton`` for inputs of any strides (copied to contiguous when needed)."""
    return linear_scan_triton(c.contiguous(), x.contiguous(), reverse)


def linear_scan_block2_triton_any(C: torch.Tensor, x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """``linear_scan_block2_triton`` for inputs of any strides (copied to contiguous when needed)."""
    return linear_scan_block2_triton(C.contiguous(), x.contiguous(), reverse)


def supports(c: torch.Tensor, x: torch.Tensor) -> bool:
    """Can the Triton scan run on these inputs (device and dtype; any strides through ``*_any``)?"""
    return triton_available(x) and x.dtype in DTYPES and c.dtype == x.dtype and c.device == x.device
