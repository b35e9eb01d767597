"""Triton linear scans (diagonal and 2x2-block), forward and backward.

Same signatures and semantics as ``seqkernels.scan.reference``:

- ``linear_scan_triton(c, x, reverse=False)``: ``c, x (B, L, D)`` -> ``y (B, L, D)``,
  ``y_t = c_t * y_{t-1} + x_t`` (``reverse``: ``y_t = c_t * y_{t+1} + x_t``);
- ``linear_scan_block2_triton(C, x, reverse=False)``: ``C (B, L, 2, 2, D)``, ``x (B, L, 2, D)``,
  ``y_t[i] = sum_j C_t[i, j] y_{t-1}[j] + x_t[i]``.

One single-pass kernel per call, of two kinds (``ScanTiles.kind``; ``default_tiles`` picks):

- ``"loop"`` (many lanes: ``B * D`` channels in at least ``LOOP_FROM_LANE_TILES`` tiles): the chunk-loop
  kernels (``loop_kernels.py``), one program per (batch row, channel tile) walking the whole sequence
  in chunks with the state in registers and the loads software-pipelined; no communication;
- ``"lookback"`` (few lanes, e.g. one long sequence): the look-back kernels (``chunk_kernels.py``): the
  sequence is split into chunks of ``ch`` steps and the channels into tiles of ``bd``; every (chunk,
  tile) is one program, so even one long sequence fills the GPU, and the carry between chunks travels
  by decoupled look-back (``lookback_kernels.py``).

The backward is the same kernel in the other direction with shifted coefficients, and writes the
coefficient gradient in the same pass (``dx_t = dy_t + c_{t+1} dx_{t+1}``, ``dc_t = dx_t y_{t-1}``).

Storage float32, bfloat16 or float16 (``c`` and ``x`` of one dtype); arithmetic in float32. The
public functions take any strides (copied to contiguous where needed) and CUDA tensors (or CPU ones
under ``TRITON_INTERPRET=1``). Custom ops (the ``torch.compile`` path; eager calls run the same
launches through an ``autograd.Function`` without the dispatcher round trips):
``expressivity::linear_scan``, ``expressivity::linear_scan_block2`` and their backward ops ``..._bwd``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import torch
from torch.autograd.function import once_differentiable

from seqkernels._triton import LaunchCache, cdiv, empty_like, next_pow2, triton_available
from seqkernels.scan.chunk_kernels import _block2_scan_kernel, _diag_scan_kernel
from seqkernels.scan.lookback_kernels import RECORDS_OFFSET
from seqkernels.scan.loop_kernels import _block2_loop_kernel, _diag_loop_kernel

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True)
class ScanTiles:
    """Kernel kind and tile of one scan launch (forward, or the backward kernel).

    ``kind``: ``"loop"`` (``loop_kernels.py``) or ``"lookback"`` (``chunk_kernels.py``); ``ch``: time
    steps per chunk; ``bd``: channels per tile; ``warps``: warps per program; ``stages`` (chunk loop):
    chunks whose loads are in flight, plus one; ``window`` (diagonal look-back): records loaded per
    look-back step after the first; ``maxnreg`` (look-back): register cap per thread, ``None`` = the
    compiler's choice; ``specialize_d``: compile for the exact channel count ``D`` when it is a multiple
    of 16 (the row stride becomes a constant and the tile's row addresses immediates).
    """

    kind: Literal["loop", "lookback"]
    ch: int
    bd: int
    warps: int
    stages: int = 3
    window: int = 1
    maxnreg: int | None = None
    specialize_d: bool = True

    def __post_init__(self):
        if self.kind not in ("loop", "lookback"):
            raise ValueError(f"ScanTiles.kind must be 'loop' or 'lookback', got {self.kind!r}")
        for name in ("ch", "bd"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"ScanTiles.{name} must be a power of two, got {v}")


#: The chunk-loop kernels run from this many lane tiles (``B * cdiv(D, bd)``, ``bd`` of the loop tile)
#: on, about two programs per SM of an H100/H200; below, the look-back kernels split the sequence.
LOOP_FROM_LANE_TILES = 256
#: The diagonal look-back loads one record per step from this many lane tiles per chunk on (short
#: walks: a window only costs registers), ``4`` below (long walks over one long sequence).
ONE_RECORD_FROM_LANE_TILES = 64


@functools.lru_cache(maxsize=4096)
def default_tiles(
    B: int, L: int, D: int, block2: bool, grad: bool = False, kind: Literal["loop", "lookback"] | None = None
) -> ScanTiles:
    """The kernel and tile a scan of this shape runs, forward or (``grad``) backward; ``kind``: that
    kernel kind's tile whatever the shape.

    Chunk loop: one warp, 32 channels (one per thread, the chunk's steps in its registers; 16 when
    ``D <= 16``), 64-step chunks (2x2 blocks: 16 forward, 32 x 16 channels backward), 3 stages.
    Look-back: ``bd = 32 * warps`` (64 channels on 2 warps) so every thread owns one channel and the
    in-chunk scan runs along time inside it; 64-step chunks (2x2: 16 steps, 32 channels backward).
    Measured: ``seqkernels/scan/README.md``.
    """
    if block2 and grad:
        loop = ScanTiles("loop", 32, 16, 1, 3)
    else:
        loop = ScanTiles("loop", 16 if block2 else 64, min(32, max(16, next_pow2(D))), 1, 3)
    if kind == "loop" or (kind is None and B * cdiv(D, loop.bd) >= LOOP_FROM_LANE_TILES):
        return loop
    if block2:
        bd = min(32 if grad else 64, max(16, next_pow2(D)))
        return ScanTiles("lookback", 16, bd, max(1, bd // 32))
    bd = min(64, max(16, next_pow2(D)))
    window = 1 if B * cdiv(D, bd) >= ONE_RECORD_FROM_LANE_TILES else 4
    # the forward capped at 168 registers per thread (from 184) keeps more programs in flight on the chain
    return ScanTiles("lookback", 64, bd, max(1, bd // 32), window=window, maxnreg=None if grad else 168)


def check_inputs(name: str, c: torch.Tensor, x: torch.Tensor, block2: bool) -> None:
    """One-line ``TypeError`` / ``ValueError`` for anything the kernels cannot take (strides aside)."""
    if not isinstance(c, torch.Tensor) or not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: c and x must be tensors, got {type(c).__name__} and {type(x).__name__}")
    xs = x.shape
    if len(xs) != (4 if block2 else 3) or (block2 and xs[2] != 2):
        want = "x (B, L, 2, D)" if block2 else "x (B, L, D)"
        raise ValueError(f"{name}: expected {want}, got x of shape {tuple(xs)}")
    if c.shape != ((*xs[:2], 2, 2, xs[3]) if block2 else xs):
        want = (*xs[:2], 2, 2, xs[-1]) if block2 else tuple(xs)
        raise ValueError(f"{name}: c has shape {tuple(c.shape)}, expected {want} to match x")
    if c.device != x.device:
        raise ValueError(f"{name}: c is on {c.device} but x is on {x.device}")
    dtype = x.dtype
    if dtype not in DTYPES or c.dtype != dtype:
        raise TypeError(
            f"{name}: c and x must share one dtype of float32/bfloat16/float16, got {c.dtype} and {dtype} "
            "(use backend='torch' for float64)"
        )
    if not triton_available(x):
        raise ValueError(f"{name}: Triton needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU), got {x.device}")


#: Launches of one cached workspace before it is zeroed: its records carry a 31-bit launch tag
#: (``lookback_kernels.py``), which must not repeat while an old record could still be read as published.
WS_LAUNCH_LIMIT = 2**31 - 1
#: (CUDA device index or -1: CPU, raw stream handle or 0) -> [workspace, launches since zeroed]
_workspaces: dict[tuple[int, int], list] = {}


def _workspace(x: torch.Tensor, words: int) -> torch.Tensor:
    """The int64 look-back workspace of the current stream on ``x``'s device, at least ``words`` words
    (the ticket counter in word 0, the records from word ``RECORDS_OFFSET``: ``lookback_kernels.py``).

    Cached per (device, stream), the stream by its raw handle (the one Triton launches on), and reused
    by every launch: the kernels need no zeroing between launches (the ticket counter in word 0 resets
    itself and carries the epoch; records are tagged by launch, ``lookback_kernels.py``). One workspace per
    stream, because launches on one stream never overlap. It stays allocated (the largest size asked
    for, per stream). CUDA graphs: a workspace first allocated during capture is zeroed at the start of
    every replay (the capture records the zeroing), one allocated before capture carries its epoch
    through replays; the host does not count replayed launches, so a graph replayed more than
    ``WS_LAUNCH_LIMIT`` times without an eager launch between could meet repeated tags.
    """
    if x.is_cuda:
        index = x.get_device()
        key = (index, torch._C._cuda_getCurrentRawStream(index))
    else:
        key = (-1, 0)
    entry = _workspaces.get(key)
    if entry is None or entry[0].numel() < words:
        ws = torch.zeros(words, dtype=torch.int64, device=x.device)
        entry = _workspaces[key] = [ws, 0]
    elif entry[1] >= WS_LAUNCH_LIMIT:
        entry[0].zero_()
        entry[1] = 0
    entry[1] += 1
    return entry[0]


@functools.lru_cache(maxsize=4096)
def _plan(B: int, L: int, D: int, reverse: bool, grad: bool, block2: bool, tiles: ScanTiles | None):
    """``(kernel, grid, n_dt, constexpr kwargs, workspace words or 0, its LaunchCache)`` of one launch,
    ``None`` when there is nothing to compute (``B * L * D == 0``). The kernels take ``L``, ``D`` and the
    channel tiles per row ``n_dt`` at run time and derive the rest from them and the grid (fewer
    arguments: less host time per launch)."""
    if B * L * D == 0:
        return None
    t = tiles or default_tiles(B, L, D, block2, grad)
    if (t.ch + 1) * (4 if block2 else 1) * D + t.bd >= 2**31:
        raise ValueError(f"linear_scan_triton: D = {D} is too large for the kernels' int32 in-tile offsets")
    n_dt, n_chunks = cdiv(D, t.bd), cdiv(L, t.ch)
    meta = dict(
        REVERSE=reverse, GRAD=grad, CH=t.ch, BD=t.bd, num_warps=t.warps, DC=D if t.specialize_d and D % 16 == 0 else 0
    )
    if t.kind == "loop":
        kernel = _block2_loop_kernel if block2 else _diag_loop_kernel
        return kernel, (B * n_dt,), n_dt, dict(meta, STAGES=t.stages), 0, LaunchCache()
    n_lt = B * n_dt
    if not block2:
        meta["WIN"] = t.window
    if t.maxnreg is not None:
        meta["maxnreg"] = t.maxnreg
    # record words per lane: lookback_kernels.py
    words = RECORDS_OFFSET.value + n_lt * n_chunks * (8 if block2 else 3) * t.bd
    kernel = _block2_scan_kernel if block2 else _diag_scan_kernel
    return kernel, (n_lt * n_chunks,), n_dt, meta, words, LaunchCache()


def _launch(c, x, out, yfwd, dc, reverse: bool, grad: bool, block2: bool, tiles: ScanTiles | None) -> None:
    """One kernel launch; ``yfwd`` and ``dc`` are ``None`` for the forward (``grad=False``)."""
    shape = x.shape
    L, D = shape[1], shape[-1]
    plan = _plan(shape[0], L, D, reverse, grad, block2, tiles)
    if plan is None:
        return
    kernel, grid, n_dt, meta, words, launches = plan
    # the plan fixes the ints and which pointers are None; c, x, out, yfwd and dc share x's dtype
    if words:
        launches.launch(kernel, grid, (c, x, out, yfwd, dc, _workspace(x, words), L, D, n_dt), meta, x.dtype)
    else:
        launches.launch(kernel, grid, (c, x, out, yfwd, dc, L, D, n_dt), meta, x.dtype)


def scan_forward(c, x, reverse: bool, block2: bool, tiles: ScanTiles | None = None) -> torch.Tensor:
    """``y`` of contiguous, checked inputs (no autograd)."""
    out = empty_like(x)
    _launch(c, x, out, None, None, reverse, False, block2, tiles)
    return out


def scan_backward(c, y, dy, reverse: bool, block2: bool, tiles: ScanTiles | None = None):
    """``(dc, dx)`` of the scan that gave ``y`` (contiguous), for the output gradient ``dy`` (contiguous)."""
    dx = empty_like(y)
    dc = empty_like(c)
    # the backward of a forward scan is a reverse scan with coefficients c_{t+1}, and vice versa
    _launch(c, dy, dx, y, dc, not reverse, True, block2, tiles)
    return dc, dx


# ---------------------------------------------------------------- custom ops (torch.compile, opcheck)


def _register(name: str, block2: bool):
    """The forward and backward custom ops of one scan kind, the backward wired as its autograd formula."""
    checked = "linear_scan_block2_triton" if block2 else "linear_scan_triton"

    @torch.library.custom_op(f"expressivity::{name}", mutates_args=())
    def fwd(c: torch.Tensor, x: torch.Tensor, reverse: bool) -> torch.Tensor:
        check_inputs(checked, c, x, block2)
        if not (c.is_contiguous() and x.is_contiguous()):
            raise ValueError(f"{checked}: the custom op takes contiguous c and x (call .contiguous() first)")
        return scan_forward(c, x, reverse, block2)

    @torch.library.custom_op(f"expressivity::{name}_bwd", mutates_args=())
    def bwd(c: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return scan_backward(c, y, dy, reverse, block2)

    fwd.register_fake(lambda c, x, reverse: torch.empty_like(x))
    bwd.register_fake(lambda c, y, dy, reverse: (torch.empty_like(c), torch.empty_like(y)))

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output)
        ctx.reverse = inputs[2]

    def grad(ctx, dy):
        c, y = ctx.saved_tensors
        dc, dx = bwd(c, y, dy.contiguous().to(y.dtype), ctx.reverse)
        return dc, dx, None

    fwd.register_autograd(grad, setup_context=setup)
    return fwd


_OPS = {False: _register("linear_scan", False), True: _register("linear_scan_block2", True)}


def _scan_grads(ctx, dy):
    """``(dc, dx, None)`` of ``_Scan`` for the output gradient ``dy``."""
    c, y = ctx.saved_tensors
    reverse, block2, _, grad_tiles = ctx.cfg
    dy = dy.contiguous()
    if dy.dtype != y.dtype:
        dy = dy.to(y.dtype)
    dc, dx = scan_backward(c, y, dy, reverse, block2, grad_tiles)
    return dc, dx, None


_scan_grads_once = once_differentiable(_scan_grads)


class _Scan(torch.autograd.Function):
    """Eager autograd of the scans: the custom ops' kernels without the dispatcher round trips.
    ``cfg``: ``(reverse, block2, tiles, grad_tiles)``."""

    @staticmethod
    def forward(ctx, c, x, cfg):
        y = scan_forward(c, x, cfg[0], cfg[1], cfg[2])
        ctx.save_for_backward(c, y)
        ctx.cfg = cfg
        return y

    @staticmethod
    def backward(ctx, dy):
        # grad mode is on here only under create_graph=True; once_differentiable then makes a second
        # differentiation raise (with grad mode off, its no_grad block would change nothing)
        if torch.is_grad_enabled():
            return _scan_grads_once(ctx, dy)
        return _scan_grads(ctx, dy)


def _scan(name, c, x, reverse, block2, tiles, grad_tiles):
    if torch.compiler.is_compiling():
        return _OPS[block2](c.contiguous(), x.contiguous(), bool(reverse))
    check_inputs(name, c, x, block2)
    c, x = c.contiguous(), x.contiguous()
    if torch.is_grad_enabled() and (c.requires_grad or x.requires_grad):
        return _Scan.apply(c, x, (bool(reverse), block2, tiles, grad_tiles))
    return scan_forward(c, x, bool(reverse), block2, tiles)


# ---------------------------------------------------------------- public functions


def linear_scan_triton(
    c: torch.Tensor,
    x: torch.Tensor,
    reverse: bool = False,
    *,
    tiles: ScanTiles | None = None,
    grad_tiles: ScanTiles | None = None,
) -> torch.Tensor:
    """Diagonal ``y_t = c_t * y_{t-1} + x_t`` in Triton. ``c, x (B, L, D)`` -> ``y (B, L, D)``.

    ``tiles`` / ``grad_tiles``: the forward / backward kernel and tile (default: ``default_tiles``)."""
    return _scan("linear_scan_triton", c, x, reverse, False, tiles, grad_tiles)


def linear_scan_block2_triton(
    C: torch.Tensor,
    x: torch.Tensor,
    reverse: bool = False,
    *,
    tiles: ScanTiles | None = None,
    grad_tiles: ScanTiles | None = None,
) -> torch.Tensor:
    """2x2-block scan in Triton. ``C (B, L, 2, 2, D)``, ``x (B, L, 2, D)`` -> ``y (B, L, 2, D)``;
    ``tiles`` / ``grad_tiles`` as ``linear_scan_triton``."""
    return _scan("linear_scan_block2_triton", C, x, reverse, True, tiles, grad_tiles)


def supports(c: torch.Tensor, x: torch.Tensor) -> bool:
    """Can the Triton scan run on these inputs (device and dtype)?"""
    return x.dtype in DTYPES and c.dtype == x.dtype and c.device == x.device and triton_available(x)
