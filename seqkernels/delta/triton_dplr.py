"""RWKV-7's DPLR rule chunkwise in Triton (``backend="triton_chunk"`` of ``dplr_delta_rule``), two ways:

- under a decay bound with factored chunks of 16 (or 32, 64: ``fused_chunk``) and heads up to
  ``FUSED_MAX_HEAD_DIM``: every part in Triton, ``dplr_chunk_kernels.py``'s per-chunk kernels (the scan's
  inputs; the outputs; their backward) around the scan below, as the custom ops ``expressivity::
  dplr_chunk_fwd`` / ``dplr_chunk_bwd`` with ``register_autograd``;
- otherwise ``pytorch.dplr_delta_rule``'s chunk form, batched over chunks in PyTorch (decayed products,
  one unit lower-triangular solve per chunk, the outputs; autograd gradients), with the scan below.

The scan: the sequential hand-over of the state between chunks (``pytorch.dplr_scan``) in
``dplr_scan_kernels.py``, forward and backward kernels as the custom ops ``expressivity::dplr_scan_fwd`` /
``dplr_scan_bwd``. Launch parameters ``ScanTiles``. Inputs float32, bfloat16 or float16 (float64 runs in
float32), float32 arithmetic, the output in ``q``'s dtype; no host reads (a CUDA graph captures it).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from seqkernels._triton import cdiv, empty, next_pow2
from seqkernels.delta import pytorch
from seqkernels.delta.dplr_chunk_kernels import (
    dplr_out_bwd_kernel,
    dplr_out_kernel,
    dplr_prep_bwd_kernel,
    dplr_prep_kernel,
)
from seqkernels.delta.dplr_scan_kernels import dplr_scan_bwd_kernel, dplr_scan_fwd_kernel
from seqkernels.delta.members import KERNEL_DTYPES, kernel_dtype

SCAN_PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16")


@dataclasses.dataclass(frozen=True)
class ScanTiles:
    """Launch parameters of the scan kernels, and the products' precision of the fused kernels too; ``None``
    takes the default.

    ``block_v``: value columns of the state per program, a power of two (default every column up to 64 at
    keys up to 64 wide; at wider keys up to 32 where a chunk's ``(C, K)`` tile holds fewer than 64 x 128
    entries, else 16: wider blocks there need more than an H100's 227 KiB of shared memory with ``"tf32x3"``
    products, or near it); also the fused kernels' value block where set; ``warps`` (default 4, but 8 for the
    backward at chunks of up to 16 steps and blocks of 32 or more: it holds more tiles per chunk; at most 4
    for blocks of 16 with tensor-core products: the backward kernel faults there at 8 warps on an H100 with
    Triton 3.6, ``"ieee"`` does not); ``precision``: every product's precision, one of ``SCAN_PRECISIONS``
    (``chunk_kernels._mm``: ``tl.dot``'s ``input_precision``, or ``"bf16"``, both operands rounded to bfloat16
    as fla's kernels do; default ``"tf32x3"``, float32-accurate); ``stages``: the scan kernels' ``num_stages``
    (how many chunks ahead their loop's loads are issued; default 3 at chunks of up to 16 steps, else 1: longer
    chunks' tiles outgrow shared memory); ``chunk_warps``: the fused per-chunk kernels' warps
    (``dplr_chunk_kernels.py``; default 2 at chunks of 16 steps and keys up to 64 wide, else 4);
    ``chunk_block_v``: their value columns per program, a power of two (default ``block_v`` where set, else every
    column up to 128 under ``"bf16"`` products and up to 64 under the others, whose wider tiles spill; a block
    narrower than the values recomputes the key-side products once per block). The defaults are the fastest the
    delta probe measured at chunks of 16 (``python -m benchmarks.ops delta-probe dplr``).
    """

    block_v: int | None = None
    warps: int | None = None
    precision: str | None = None
    stages: int | None = None
    chunk_warps: int | None = None
    chunk_block_v: int | None = None

    def resolve(self, C: int, K: int, V: int, backward: bool = False) -> tuple[int, int, int, str]:
        """``(BK, BV, warps, precision)`` for chunks of ``C`` steps, keys ``K`` and values ``V`` wide; ``warps``
        the scan's in the forward or the ``backward``."""
        BK, VP = max(16, next_pow2(K)), max(16, next_pow2(V))
        BV = self.block_v or min(VP, 64 if BK <= 64 else 32 if max(16, next_pow2(C)) * BK < 64 * 128 else 16)
        for name, n in (("block_v", BV), ("chunk_block_v", self.chunk_block_v or 16)):
            if n < 16 or n > VP or n & (n - 1):
                raise ValueError(f"dplr triton_chunk: {name} must be a power of two in [16, {VP}], got {n}")
        warps = self.warps or (8 if backward and BV >= 32 and C <= 16 else 4)
        for name, n in (("warps", warps), ("chunk_warps", self.chunk_warps or 4)):
            if n not in (1, 2, 4, 8, 16):
                raise ValueError(f"dplr triton_chunk: {name} must be 1, 2, 4, 8 or 16, got {n!r}")
        if self.stages is not None and self.stages not in range(1, 7):
            raise ValueError(f"dplr triton_chunk: stages must be 1 to 6, got {self.stages!r}")
        precision = self.precision or "tf32x3"
        if precision not in SCAN_PRECISIONS:
            raise ValueError(f"dplr triton_chunk: precision must be one of {SCAN_PRECISIONS}, got {precision!r}")
        if BV == 16 and warps > 4 and precision != "ieee":
            raise ValueError(
                f"dplr triton_chunk: block_v 16 takes at most 4 warps with {precision} products, got {warps}"
            )
        return BK, BV, warps, precision


def _meta(W: torch.Tensor, V: int, tiles: ScanTiles | None, backward: bool = False) -> tuple[int, dict]:
    """``(NV, launch keywords)`` of the scan's forward or ``backward`` for chunk tensors like ``W (BH, NC, C,
    K)`` and values ``V`` wide."""
    C, K = W.shape[-2:]
    tiles = tiles or ScanTiles()
    BK, BV, warps, precision = tiles.resolve(C, K, V, backward)
    BC = max(16, next_pow2(C))
    meta = {"C": C, "K": K, "V": V, "BC": BC, "BK": BK, "BV": BV, "PREC": precision}
    return cdiv(V, BV), {**meta, "num_warps": warps, "num_stages": tiles.stages or (3 if BC <= 16 else 1)}


def _block_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of the per-value-block shares ``x (NV, ...)``."""
    return x.sum(0) if x.shape[0] > 1 else x[0]


def _value_layout(v: torch.Tensor, NC: int, C: int, heads: int | None) -> tuple[int, int, int, int, int]:
    """``(H, L, s_b, s_h, s_t)`` of the contiguous values ``v`` as the scan kernels read them
    (``dplr_scan_kernels._value_rows``): chunked ``(B H, NC, C, V)`` where ``heads`` is ``None``, else the tokens
    ``(B, L, H, V)`` of ``heads`` heads."""
    V = v.shape[-1]
    if heads is None:
        return 1, NC * C, NC * C * V, 0, V
    _, L, H, _ = v.shape
    return H, L, L * H * V, V, H * V


def _scan_fwd(
    Uv, W, Be, Ke, v, D, tiles: ScanTiles | None = None, state_dtype: torch.dtype = torch.float32, heads=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, M_in)`` of ``Uv (BH, NC, C, V)``, ``W, Be, Ke (BH, NC, C, K)``, ``D (BH, NC, K)`` and the values
    ``v`` (``(BH, NC, C, V)``, or ``(B, L, H, V)`` with ``heads``: ``_value_layout``); ``U`` float32, ``M_in``
    stored in ``state_dtype`` (the state itself stays float32 on chip)."""
    BH, NC, C, V = Uv.shape
    K = W.shape[-1]
    NV, meta = _meta(W, V, tiles)
    U = empty((BH, NC, C, V), Uv.device, torch.float32)
    M_in = empty((BH, NC, K, V), Uv.device, state_dtype)
    layout = _value_layout(v, NC, C, heads)
    dplr_scan_fwd_kernel[(NV, BH)](Uv, W, Be, Ke, v, D, U, M_in, NC, *layout, **meta)
    return U, M_in


def _scan_bwd(
    dU, dM_in, W, Be, Ke, v, D, U, M_in, tiles: ScanTiles | None = None, heads=None, out_rows=None, shares=False
):
    """``(dUv, dW, dBe, dKe, dv, dD)``, float32, from the output gradients and the saved tensors (``_scan_fwd``'s
    shapes; ``dv (BH, NC, C, V)`` in either layout of ``v``). ``out_rows``: ``(q, w, do, scale)`` in the
    values' token layout, from which the kernel forms ``dM_in`` on chip (the fused kernels' outputs; ``dM_in``
    is then ``None``). ``shares``: ``dW, dBe, dKe, dD`` as the value blocks' shares ``(NV, ...)``, unsummed
    (the fused backward's last kernel sums them as it reads them)."""
    BH, NC, C, V = U.shape
    K = W.shape[-1]
    NV, meta = _meta(W, V, tiles, backward=True)
    dev, f32 = U.device, torch.float32
    dUv, dv = empty((BH, NC, C, V), dev, f32), empty((BH, NC, C, V), dev, f32)
    dW, dBe, dKe = (empty((NV, BH, NC, C, K), dev, f32) for _ in range(3))
    dD = empty((NV, BH, NC, K), dev, f32)
    layout = _value_layout(v, NC, C, heads)
    rows = (dU, dU, dU, 1.0) if out_rows is None else out_rows  # unread without OUT_ROWS
    dplr_scan_bwd_kernel[(NV, BH)](
        dU, dU if dM_in is None else dM_in, W, Be, Ke, v, D, U, M_in, dUv, dW, dBe, dKe, dv, dD, NC, BH, *layout,
        *rows, OUT_ROWS=out_rows is not None, **meta,
    )  # fmt: skip
    if shares:
        return dUv, dW, dBe, dKe, dv, dD
    return dUv, _block_sum(dW), _block_sum(dBe), _block_sum(dKe), dv, _block_sum(dD)


@torch.library.custom_op("expressivity::dplr_scan_fwd", mutates_args=())
def dplr_scan_fwd(
    Uv: torch.Tensor, W: torch.Tensor, Be: torch.Tensor, Ke: torch.Tensor, v: torch.Tensor, D: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, M_in)`` with the default tiles (``_scan_fwd``, chunked values)."""
    return _scan_fwd(Uv, W, Be, Ke, v, D)


@dplr_scan_fwd.register_fake
def _(Uv, W, Be, Ke, v, D):
    return torch.empty_like(Uv), Uv.new_empty((*Uv.shape[:2], W.shape[-1], Uv.shape[-1]))


@torch.library.custom_op("expressivity::dplr_scan_bwd", mutates_args=())
def dplr_scan_bwd(
    dU: torch.Tensor,
    dM_in: torch.Tensor,
    W: torch.Tensor,
    Be: torch.Tensor,
    Ke: torch.Tensor,
    v: torch.Tensor,
    D: torch.Tensor,
    U: torch.Tensor,
    M_in: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dUv, dW, dBe, dKe, dv, dD)`` with the default tiles (``_scan_bwd``, chunked values)."""
    return _scan_bwd(dU, dM_in, W, Be, Ke, v, D, U, M_in)


@dplr_scan_bwd.register_fake
def _(dU, dM_in, W, Be, Ke, v, D, U, M_in):
    return tuple(torch.empty_like(x) for x in (dU, W, Be, Ke, dU, D))


def _output_grads(dU, dM_in, U, M_in) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``U`` and ``M_in`` as the backward kernel reads them: contiguous, zeros where absent."""
    dU = torch.zeros_like(U) if dU is None else dU.contiguous()
    return dU, torch.zeros_like(M_in) if dM_in is None else dM_in.contiguous()


def _setup_context(ctx, inputs, output):
    Uv, W, Be, Ke, v, D = inputs
    ctx.save_for_backward(W, Be, Ke, v, D, *output)


def _grad(ctx, dU, dM_in):
    W, Be, Ke, v, D, U, M_in = ctx.saved_tensors
    return dplr_scan_bwd(*_output_grads(dU, dM_in, U, M_in), W, Be, Ke, v, D, U, M_in)


dplr_scan_fwd.register_autograd(_grad, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """Eager autograd over the same launches as the custom ops, with explicit tiles."""

    @staticmethod
    def forward(ctx, tiles, Uv, W, Be, Ke, v, D):
        U, M_in = _scan_fwd(Uv, W, Be, Ke, v, D, tiles)
        ctx.save_for_backward(W, Be, Ke, v, D, U, M_in)
        ctx.tiles = tiles
        return U, M_in

    @staticmethod
    def backward(ctx, dU, dM_in):
        W, Be, Ke, v, D, U, M_in = ctx.saved_tensors
        return (None, *_scan_bwd(*_output_grads(dU, dM_in, U, M_in), W, Be, Ke, v, D, U, M_in, ctx.tiles))


def dplr_scan(U_v, W, b_end, k_end, v, decay_end, *, tiles: ScanTiles | None = None):
    """``pytorch.dplr_scan`` on the Triton kernels: ``U_v, v (..., NC, C, V)``, ``W, b_end, k_end (..., NC, C,
    K)``, ``decay_end (..., NC, K)`` (float32) -> ``(U, M)`` of the same leading shape."""
    lead, (NC, C, V), K = U_v.shape[:-3], U_v.shape[-3:], W.shape[-1]
    xs = (U_v, W, b_end, k_end, v, decay_end)
    flat = [x.reshape(-1, *x.shape[len(lead) :]).float().contiguous() for x in xs]
    if torch.compiler.is_compiling() or tiles is None:
        U, M = dplr_scan_fwd(*flat)
    else:
        U, M = _Eager.apply(tiles, *flat)
    return U.reshape(*lead, NC, C, V), M.reshape(*lead, NC, K, V)


#: the chunk sizes of the fused kernels (the stacked block inverse's: one to four blocks of 16), their default
#: (fla's for this rule; the least spilling), and their widest head: a program holds whole ``(C, K)`` tiles.
#: Chunks of 64 at keys wider than 64 need more shared memory than an H100 has (the prep backward, 256 KiB
#: under Triton 3.9: ``python -m benchmarks.ops compile --families delta``)
FUSED_CHUNKS, FUSED_DEFAULT_CHUNK, FUSED_MAX_HEAD_DIM = (16, 32, 64), 16, 128


def fused_chunk(K: int, lower_bound: float | None, chunk: int | None) -> int | None:
    """The chunk size the fused kernels run keys ``K`` wide in under ``lower_bound`` (``chunk``: asked for;
    default ``FUSED_DEFAULT_CHUNK``), or ``None`` where they cannot: no bound (pairwise decays), a bound
    whose factored chunk (``pytorch.factored_chunk``) is under the chunk, a ``chunk`` not in
    ``FUSED_CHUNKS``, or 64 at keys wider than 64."""
    C = FUSED_DEFAULT_CHUNK if chunk is None else chunk
    fits = C in FUSED_CHUNKS and C <= pytorch.factored_chunk(lower_bound) and not (C == 64 and K > 64)
    return C if fits else None


def _chunk_meta(q, v, C: int, tiles: ScanTiles | None):
    """``(B, L, H, K, V, NC, NV, launch keywords)`` of the fused kernels: value blocks of ``tiles.chunk_block_v``
    columns, ``tiles.chunk_warps`` warps (``ScanTiles``)."""
    B, L, H, K = q.shape
    V = v.shape[-1]
    tiles = tiles or ScanTiles()
    BK, _, _, precision = tiles.resolve(C, K, V)
    BV = tiles.chunk_block_v or tiles.block_v or min(max(16, next_pow2(V)), 128 if precision == "bf16" else 64)
    meta = {
        "C": C,
        "BK": BK,
        "BV": BV,
        "PREC": precision,
        "num_warps": tiles.chunk_warps or (2 if BK <= 64 and C <= 16 else 4),
    }
    return B, L, H, K, V, cdiv(L, C), cdiv(V, BV), meta


#: what the fused forward keeps for its backward: the scan's outputs ``U (B H, NC, C, V)``, ``M_in (B H, NC, K,
#: V)``, its inputs ``Wy, Be, Ke (B H, NC, C, K)``, ``D (B H, NC, K)`` and each chunk's ``T`` in ``Tm (NV, B H,
#: NC, C, C)`` (the first of the value blocks' scratches); float32, but ``M_in`` in bfloat16 under ``"bf16"`` products
#: (``state_dtype``): every product reading it rounds it so, only the backward's ``dD = rowsum(M_in o dM)`` sees
#: the rounding
SAVED = ("U", "M_in", "Wy", "Be", "Ke", "D", "Tm")


def state_dtype(geometry) -> torch.dtype:
    """The dtype the fused forward stores each chunk's entering state ``M_in`` in (``SAVED``)."""
    return torch.bfloat16 if geometry[-1]["PREC"] == "bf16" else torch.float32


def _fused_prep(k, v, a, b, w, geometry):
    """``(Uv, Wy, Be, Ke, D, Tm)``: the scan's inputs but the values (``_scan_fwd``; ``v`` itself, in its token
    layout) and each chunk's ``T``, float32; ``geometry``: ``_chunk_meta``'s."""
    B, L, H, K, V, NC, NV, meta = geometry
    C, dev, f32, BH = meta["C"], k.device, torch.float32, B * H
    Uv, D, Tm = empty((BH, NC, C, V), dev, f32), empty((BH, NC, K), dev, f32), empty((NV, BH, NC, C, C), dev, f32)
    Wy, Be, Ke = (empty((BH, NC, C, K), dev, f32) for _ in range(3))
    dplr_prep_kernel[(NC, BH, NV)](k, v, a, b, w, Uv, Wy, Be, Ke, D, Tm, L, H, NC, K, V, **meta)
    return Uv, Wy, Be, Ke, D, Tm


def _fused_out(q, k, v, b, w, U, M_in, scale: float, geometry):
    """The output ``(B, L, H, V)`` in ``q``'s dtype from the scan's outputs ``U``, ``M_in``."""
    B, L, H, K, V, NC, NV, meta = geometry
    o = empty((B, L, H, V), q.device, q.dtype)
    dplr_out_kernel[(NC, B * H, NV)](q, k, v, b, w, U, M_in, o, scale, L, H, NC, K, V, **meta)
    return o


def _fused_fwd(q, k, v, a, b, w, scale: float, C: int, tiles: ScanTiles | None = None):
    """``(o, *SAVED)``: the output ``(B, L, H, V)`` in ``q``'s dtype and what the backward reads (``SAVED``)."""
    geometry = _chunk_meta(q, v, C, tiles)
    Uv, Wy, Be, Ke, D, Tm = _fused_prep(k, v, a, b, w, geometry)
    U, M_in = _scan_fwd(Uv, Wy, Be, Ke, v, D, tiles, state_dtype(geometry), heads=geometry[2])
    return _fused_out(q, k, v, b, w, U, M_in, scale, geometry), U, M_in, Wy, Be, Ke, D, Tm


def _block_shares(geometry, dtype: torch.dtype, device) -> torch.Tensor:
    """An empty gradient written per value block, ``(NV, B, L, H, K)``: in ``dtype`` where one block holds every
    value (the kernels store it finished), else float32 (shares the caller sums, ``_block_sum``)."""
    B, L, H, K, _, _, NV, _ = geometry
    return empty((NV, B, L, H, K), device, dtype if NV == 1 else torch.float32)


def _fused_out_bwd(do, q, k, v, b, w, U, M_in, scale: float, geometry):
    """``(dU, dq, dk_o, db_o, dv_o, dc_o)``: the scan's output gradient ``dU (B H, NC, C, V)`` (that of ``M_in``
    the scan's backward forms itself: ``_scan_bwd``'s ``out_rows``), ``dq`` per value block ``(NV, B, L, H,
    K)`` (in ``q``'s dtype where ``NV`` is 1, else float32), and the output's shares of ``dk, db, dc`` (summed
    over value blocks, float32 ``(B, L, H, K)``) and ``dv`` (float32 ``(B, L, H, V)``) of the output gradient
    ``do`` (contiguous); ``geometry``: ``_chunk_meta``'s."""
    B, L, H, K, V, NC, NV, meta = geometry
    dev, f32, BH, part = q.device, torch.float32, B * H, B * L * H * K
    dU = empty((BH, NC, meta["C"], V), dev, f32)
    dq = _block_shares(geometry, q.dtype, dev)
    dk_o, db_o, dc_o = (_block_shares(geometry, f32, dev) for _ in range(3))
    dv_o = empty((B, L, H, V), dev, f32)
    dplr_out_bwd_kernel[(NC, BH, NV)](
        do, q, k, v, b, w, U, M_in, dU, dq, dk_o, db_o, dv_o, dc_o, scale, L, H, NC, K, V, part, **meta,
    )  # fmt: skip
    return dU, dq, _block_sum(dk_o), _block_sum(db_o), dv_o, _block_sum(dc_o)


def _fused_prep_bwd(k, v, a, b, w, Tm, dUv, dWy, dBe, dKe, dVe, dD, dk_o, db_o, dv_o, dc_o, geometry):
    """``(dk, dv, da, db, dw)`` from the forward's ``Tm``, the scan's input gradients (``dVe (B H, NC, C, V)``:
    the values'; ``dWy, dBe, dKe, dD`` as the scan's value blocks' shares ``(NS, ...)``, ``_scan_bwd(shares=True)``)
    and the output's shares (``_fused_out_bwd``); ``dv (B, L, H, V)`` in ``v``'s dtype, the others per value
    block ``(NV, B, L, H, K)`` in their input's dtype where ``NV`` is 1, else float32."""
    B, L, H, K, V, NC, NV, meta = geometry
    dev, part = k.device, B * L * H * K
    dk, db, da, dw = (_block_shares(geometry, x.dtype, dev) for x in (k, b, a, w))
    dv = empty((B, L, H, V), dev, v.dtype)
    dplr_prep_bwd_kernel[(NC, B * H, NV)](
        k, v, a, b, w, Tm, dUv, dWy, dBe, dKe, dVe, dD, dk_o, db_o, dv_o, dc_o, dk, dv, da, db, dw, L, H, NC, K, V,
        part, NS=dWy.shape[0], **meta,
    )  # fmt: skip
    return dk, dv, da, db, dw


def _fused_bwd(do, q, k, v, a, b, w, U, M_in, Wy, Be, Ke, D, Tm, scale: float, C: int, tiles: ScanTiles | None = None):
    """``(dq, dk, dv, da, db, dw)`` of ``_fused_fwd``'s output gradient ``do``, each in its input's dtype (the
    kernels store them so where one value block holds every value, else their float32 shares are summed)."""
    geometry, do = _chunk_meta(q, v, C, tiles), do.contiguous()
    dU, dq, *shares = _fused_out_bwd(do, q, k, v, b, w, U, M_in, scale, geometry)
    out_rows = (q, w, do, scale)
    scan = _scan_bwd(dU, None, Wy, Be, Ke, v, D, U, M_in, tiles, geometry[2], out_rows, shares=True)
    dUv, dWy, dBe, dKe, dVe, dD = scan
    dk, dv, da, db, dw = _fused_prep_bwd(k, v, a, b, w, Tm, dUv, dWy, dBe, dKe, dVe, dD, *shares, geometry)
    dq, dk, da, db, dw = (_block_sum(x).to(y.dtype) for x, y in ((dq, q), (dk, k), (da, a), (db, b), (dw, w)))
    return dq, dk, dv, da, db, dw


@torch.library.custom_op("expressivity::dplr_chunk_fwd", mutates_args=())
def dplr_chunk_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, w: torch.Tensor,
    scale: float, chunk: int,
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]:  # fmt: skip
    """``(o, *SAVED)`` with the default tiles (``_fused_fwd``); ``SAVED`` are for the backward, which takes no
    gradient through them."""
    return _fused_fwd(q, k, v, a, b, w, scale, chunk)


@dplr_chunk_fwd.register_fake
def _(q, k, v, a, b, w, scale, chunk):
    geometry = _chunk_meta(q, v, chunk, None)
    B, L, H, K, V, NC, NV, _ = geometry
    BH, C = B * H, chunk
    f32 = lambda *s: q.new_empty(s, dtype=torch.float32)  # noqa: E731
    M_in = q.new_empty((BH, NC, K, V), dtype=state_dtype(geometry))
    Wy, Be, Ke = (f32(BH, NC, C, K) for _ in range(3))
    return q.new_empty((B, L, H, V)), f32(BH, NC, C, V), M_in, Wy, Be, Ke, f32(BH, NC, K), f32(NV, BH, NC, C, C)


@torch.library.custom_op("expressivity::dplr_chunk_bwd", mutates_args=())
def dplr_chunk_bwd(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    w: torch.Tensor, U: torch.Tensor, M_in: torch.Tensor, Wy: torch.Tensor, Be: torch.Tensor, Ke: torch.Tensor,
    D: torch.Tensor, Tm: torch.Tensor, scale: float, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(dq, dk, dv, da, db, dw)`` with the default tiles (``_fused_bwd``)."""
    return _fused_bwd(do, q, k, v, a, b, w, U, M_in, Wy, Be, Ke, D, Tm, scale, chunk)


@dplr_chunk_bwd.register_fake
def _(do, q, k, v, a, b, w, U, M_in, Wy, Be, Ke, D, Tm, scale, chunk):
    return tuple(torch.empty_like(x) for x in (q, k, v, a, b, w))


def _chunk_setup_context(ctx, inputs, output):
    *xs, scale, chunk = inputs
    ctx.set_materialize_grads(False)  # no zero-filled gradients for the saved outputs, which get none
    ctx.save_for_backward(*xs, *output[1:])
    ctx.scale, ctx.chunk = scale, chunk


def _chunk_grad(ctx, do, *_saved_grads):
    if do is None:  # a gradient for the saved outputs only, which take none
        return (None,) * 8
    return (*dplr_chunk_bwd(do, *ctx.saved_tensors, ctx.scale, ctx.chunk), None, None)


dplr_chunk_fwd.register_autograd(_chunk_grad, setup_context=_chunk_setup_context)


class _EagerChunk(torch.autograd.Function):
    """Eager autograd over the fused launches with explicit tiles."""

    @staticmethod
    def forward(ctx, tiles, scale, chunk, *xs):
        o, *saved = _fused_fwd(*xs, scale, chunk, tiles)
        ctx.save_for_backward(*xs, *saved)
        ctx.tiles, ctx.scale, ctx.chunk = tiles, scale, chunk
        return o

    @staticmethod
    def backward(ctx, do):
        return (None, None, None, *_fused_bwd(do, *ctx.saved_tensors, ctx.scale, ctx.chunk, ctx.tiles))


def dplr_delta_rule(
    q, k, v, a, b, w, *, scale: float = 1.0, lower_bound: float | None = None, chunk: int | None = None, tiles=None
):
    """``S_t = S_{t-1}(diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T``, ``o_t = scale S_t q_t``: ``pytorch.
    dplr_delta_rule`` (shapes, ``lower_bound``, ``chunk``) on our kernels (``tiles``: ``ScanTiles``). Where
    ``fused_chunk`` gives a chunk size and head dims are at most ``FUSED_MAX_HEAD_DIM``, every part runs in Triton
    (``dplr_chunk_kernels.py`` around the scan; custom ops ``expressivity::dplr_chunk_fwd`` / ``_bwd``);
    otherwise (pairwise decays) the chunk form is PyTorch's with the scan on our kernels."""
    if q.dtype not in KERNEL_DTYPES and q.dtype != torch.float64:
        raise TypeError(f"dplr triton_chunk: inputs must be one of {KERNEL_DTYPES} or float64, got {q.dtype}")
    out_dtype = q.dtype
    q, k, v, a, b, w = kernel_dtype(q, k, v, a, b, w)
    C = fused_chunk(q.shape[-1], lower_bound, chunk)
    if C is not None and max(q.shape[-1], v.shape[-1]) <= FUSED_MAX_HEAD_DIM:
        xs = [x.contiguous() for x in (q, k, v, a, b, w)]
        if torch.compiler.is_compiling() or tiles is None:
            o = dplr_chunk_fwd(*xs, float(scale), C)[0]
        else:
            o = _EagerChunk.apply(tiles, float(scale), C, *xs)
        return o.to(out_dtype)
    scan = functools.partial(dplr_scan, tiles=tiles)
    o = pytorch.dplr_delta_rule(q, k, v, a, b, w, scale=scale, lower_bound=lower_bound, chunk=chunk, scan=scan)
    return o.to(out_dtype)
