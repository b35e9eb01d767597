"""The gated delta rule, the delta rule (no decay) and DeltaProduct (``n`` steps per token) on the
chunkwise Triton kernels of ``chunk_kernels.py``, forward and backward.

``gated_delta_chunk``: the kernels as the custom ops ``expressivity::delta_chunk_fwd`` /
``delta_chunk_bwd`` with ``register_autograd`` (and the same launches as an eager ``autograd.Function``
taking explicit ``ChunkTiles``). The forward runs ``chunk_prep_kernel`` (every chunk's ``T``, ``W``,
``U``, in parallel) then ``chunk_fwd_kernel`` (the chunks in order, the state on chip) and
``chunk_out_kernel`` (every chunk's outputs from its stored entering state, in parallel); the backward
``chunk_bwd_state_kernel`` (the chunks in reverse, the state's gradient on chip), ``chunk_bwd_grads_kernel``
(per chunk) then ``chunk_bwd_prep_kernel`` (every chunk's ``T`` backward, in parallel). With
``ChunkTiles(fused=True)`` (paper 004) the sequential kernels also compute the outputs and gradients with
the state on chip, and the per-chunk kernels do not run. Saved for the backward: ``W``, ``U'`` (the
pseudo-values, written over ``U`` by the forward's walk), ``T`` and the state entering every chunk
(float32; ``W``, ``U'`` and the states in bfloat16 with bfloat16 products: ``ChunkTiles.store``).
``qk_l2norm`` is ``l2norm.py``'s kernels (float32 out; bfloat16 with bfloat16 products, which round
``q``, ``k`` to it anyway), the float64 -> float32 casts torch code (autograd
differentiates both); gradients in their input's dtype. The products' default precision and the dtype
the kernels write the output in (and read its gradient in) follow the caller's inputs
(``default_precision``), not the float32 that ``qk_l2norm`` hands the kernels.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from seqkernels._triton import cdiv, empty, next_pow2
from seqkernels.delta.chunk_kernels import (
    chunk_bwd_grads_kernel,
    chunk_bwd_prep_kernel,
    chunk_bwd_state_kernel,
    chunk_fwd_kernel,
    chunk_out_kernel,
    chunk_prep_kernel,
)
from seqkernels.delta.l2norm import l2norm
from seqkernels.delta.members import KERNEL_DTYPES, grads_in_input_dtypes, kernel_dtype, members

PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16")
INVERSES = ("stacked", "rows")


def default_precision(dtype: torch.dtype) -> str:
    """The products' default ``input_precision`` for inputs of ``dtype``: ``"tf32x3"`` (float32-accurate)
    for float32 and float64, ``"tf32"`` (one tensor-core pass, 10-bit mantissas: errors below the 16-bit
    inputs' own rounding) for 16-bit ones."""
    return "tf32x3" if dtype in (torch.float32, torch.float64) else "tf32"


@dataclasses.dataclass(frozen=True)
class ChunkTiles:
    """Launch parameters of the chunk kernels; ``None`` takes the default for the problem.

    - ``chunk``: steps per chunk ``C``, 16, 32 or 64 (default 64 with ``"bf16"`` products at head dims
      (the wider of keys and values, rounded up to a power of two) of 64 and 128, value blocks of 64 columns
      and at least 64 steps, the fastest timed there; else 32, the fastest timed at head dims 16 and 64 with the other precisions, less
      for sequences shorter than that); 64 at head dims above 64 is refused with ``"tf32"`` products, and
      with ``"tf32x3"`` ones when ``fused`` (kernels that need 240-330 KiB of shared memory, more than an
      H100 has: ``python -m benchmarks.ops compile``);
    - ``block_v``: value columns of the state per sequential program, a power of two (default every
      column up to 64, else 64); at chunks of 64 with ``"bf16"`` products at head dims of 64 and above
      blocks narrower than 64 columns are refused, whether they split the values or hold them all (illegal
      memory accesses, and outputs with relative errors of 1.0-1.3, on an H100 with Triton 3.6);
    - ``warps``: default 2 for tiles 16 wide, else 4 (the fastest timed at head dims 16, 64 and 128);
      chunks of 64 with ``"bf16"`` products at tiles narrower than 64 take 8 and refuse fewer (4 warps
      there made an illegal memory access on an H100 with Triton 3.6);
    - ``bwd_warps``: the warps of the backward's state walk and prep kernels (default: ``warps``'s);
    - ``grads_warps``: the warps of ``chunk_bwd_grads_kernel`` (default: ``bwd_warps``'s when either is
      given, else 8 at head dims above 64, the fastest timed there, else ``warps``'s default); at chunks
      of 64 with ``"bf16"`` products above head dim 64, 16 warps anywhere are refused (illegal memory
      accesses on an H100 with Triton 3.6);
    - ``precision``: the ``input_precision`` of every product (default ``default_precision`` of the
      caller's inputs: ``"tf32x3"``, float32-accurate, for float32 ones, ``"tf32"`` for 16-bit ones, whatever
      dtype ``qk_l2norm`` hands the kernels; ``"ieee"``: float32 FMA; ``"bf16"``: both operands rounded to
      bfloat16, one tensor-core pass, relative errors about 1e-2 that grow with the length);
    - ``fused``: ``False`` (default): the sequential kernels only carry the state and store it for every
      chunk, and per-chunk kernels read it back for the outputs and gradients (forward + backward the
      faster at every shape timed: ``benchmarks/ops/results/delta.evidence.md``); ``True``: the sequential
      kernels also compute the outputs and gradients with the state on chip (paper 004; its forward alone
      is the faster at head dim 64, its backward walk spills);
    - ``stages``: Triton's software pipelining depth of the loops over chunks (each stage holds one
      chunk's tiles in shared memory) of every kernel (default 2, but with ``"bf16"`` products at head dims
      above 64 1 for the backward's state walk and 4 for ``chunk_bwd_grads_kernel``, the fastest timed
      there; with float32 operands at chunks of 64 above head dim 64 1 for the walk, whose 2 stages need
      240 KiB of shared memory, more than an H100 has, as 4 stages do for any kernel there);
    - ``inverse``: how ``chunk_prep_kernel`` inverts ``I + A``: ``"stacked"`` (default: the 16 x 16
      diagonal blocks by forward substitution, all together, the rest by block products in registers; the
      faster at every shape timed) or ``"rows"`` (forward substitution over the chunk's ``C`` rows);
    - ``store``: the dtype in which ``W``, ``U'``, the stored states and their gradients (``dU'``, ``dM``)
      go between kernels, ``"fp32"`` or ``"bf16"`` (default: bfloat16 with ``precision="bf16"``, whose
      products round them to bfloat16 anyway, as fla keeps them; else float32). ``T`` and ``dW`` stay
      float32."""

    chunk: int | None = None
    block_v: int | None = None
    warps: int | None = None
    bwd_warps: int | None = None
    grads_warps: int | None = None
    precision: str | None = None
    fused: bool = False
    stages: int | None = None
    inverse: str = "stacked"
    store: str | None = None

    def products(self, dtype: torch.dtype) -> str:
        """The products' ``input_precision`` for the caller's inputs in ``dtype``: ``precision``, else
        ``default_precision(dtype)``."""
        return self.precision or default_precision(dtype)

    def resolve(self, T: int, K: int, V: int, dtype: torch.dtype) -> tuple[int, int, int, int, int, int, int, str]:
        """``(C, BK, BV, VP, warps, bwd_warps, grads_warps, precision)`` for ``T`` steps, keys of width ``K``,
        values of width ``V``, the caller's inputs in ``dtype``."""
        BK, VP = max(16, next_pow2(K)), max(16, next_pow2(V))
        wide = max(BK, VP)
        precision = self.products(dtype)
        if precision not in PRECISIONS:
            raise ValueError(f"delta triton_chunk: precision must be one of {PRECISIONS}, got {precision!r}")
        BV = self.block_v or min(VP, 64)
        C = self.chunk or (
            64 if precision == "bf16" and wide in (64, 128) and T >= 64 and BV == 64 else min(32, max(16, next_pow2(T)))
        )
        if C not in (16, 32, 64):
            raise ValueError(f"delta triton_chunk: chunk must be 16, 32 or 64, got {C}")
        if C == 64 and wide > 64 and (precision == "tf32" or (self.fused and precision == "tf32x3")):
            raise ValueError(
                f"delta triton_chunk: chunk 64 at head dims above 64 with {precision!r} products"
                f"{' on chip (fused)' if precision == 'tf32x3' else ''} needs more shared memory than an H100 "
                "has (227 KiB); use chunk 32 or 'bf16' products"
            )
        if BV < 16 or BV > VP or BV & (BV - 1):
            raise ValueError(f"delta triton_chunk: block_v must be a power of two in [16, {VP}], got {BV}")
        default = 2 if wide <= 16 else 4
        bwd = self.bwd_warps or self.warps
        warps = [self.warps, bwd, self.grads_warps or bwd or (8 if wide > 64 else None)]
        for i, (name, w) in enumerate(zip(("warps", "bwd_warps", "grads_warps"), warps)):
            if w is not None and w not in (1, 2, 4, 8, 16):
                raise ValueError(f"delta triton_chunk: {name} must be 1, 2, 4, 8 or 16, got {w!r}")
            if C == 64 and precision == "bf16" and wide < 64:
                if w is not None and w < 8:
                    raise ValueError(
                        "delta triton_chunk: chunk 64 with bf16 products at head dims below 64 needs 8 "
                        f"{name}, got {w} (4 made an illegal memory access on an H100 with Triton 3.6)"
                    )
                w = 8
            warps[i] = w or default
        if C == 64 and precision == "bf16" and wide >= 64 and BV < 64:  # measured on an H100 with Triton 3.6
            raise ValueError(
                f"delta triton_chunk: block_v {BV} at chunk 64 with bf16 products at head dims of 64 and above "
                "(illegal memory accesses and wrong outputs on an H100 with Triton 3.6); use block_v 64 or chunk 32"
            )
        if C == 64 and precision == "bf16" and wide > 64:  # faults measured on an H100 with Triton 3.6
            if 16 in warps:
                raise ValueError(
                    "delta triton_chunk: chunk 64 with bf16 products at head dims above 64 refuses 16 warps "
                    "(an illegal memory access on an H100 with Triton 3.6)"
                )
        if self.inverse not in INVERSES:
            raise ValueError(f"delta triton_chunk: inverse must be one of {INVERSES}, got {self.inverse!r}")
        if self.stages is not None and (not isinstance(self.stages, int) or self.stages < 1):
            raise ValueError(f"delta triton_chunk: stages must be a positive int, got {self.stages!r}")
        if self.store not in (None, "fp32", "bf16"):
            raise ValueError(f"delta triton_chunk: store must be 'fp32' or 'bf16', got {self.store!r}")
        return C, BK, BV, VP, *warps, precision

    def kernel_stages(self, wide: int, precision: str, chunk: int) -> tuple[int, int, int]:
        """``(stages, walk, grads)``: the pipelining depth of every kernel, of the backward's state walk
        (``fused=False``) and of ``chunk_bwd_grads_kernel`` at head width ``wide`` (padded) with products of
        ``precision`` over chunks of ``chunk`` steps."""
        if self.stages is not None:
            return self.stages, self.stages, self.stages
        if wide > 64 and precision == "bf16":
            return 2, 1, 4
        # float32 operands: the walk over chunks of 64 at 2 stages needs 240 KiB of shared memory
        return (2, 1, 2) if wide > 64 and chunk == 64 else (2, 2, 2)

    def store_dtype(self, precision: str) -> torch.dtype:
        """The dtype of the intermediates kept between kernels at products of ``precision``."""
        bf16 = self.store == "bf16" or (self.store is None and precision == "bf16")
        return torch.bfloat16 if bf16 else torch.float32


def _meta(
    q, k, v, g, nstep: int, tiles: ChunkTiles | None, backward: bool = False
) -> tuple[int, int, ChunkTiles, dict, dict, dict]:
    """``(C, NV, tiles, prep, blocks, own)``: the chunk, the blocks of value columns, the tiles (defaults for
    ``None``), the constexprs of the forward's (the ``backward``'s) launches over whole chunks (``prep``) and
    over blocks of value columns (``blocks``), and the launch options of the backward's split state walk
    (``own["walk"]``) and ``chunk_bwd_grads_kernel`` (``own["grads"]``) over ``blocks``'s."""
    tiles = tiles or ChunkTiles()
    Ts, K, V = k.shape[1], q.shape[-1], v.shape[-1]
    C, BK, BV, VP, warps, bwd_warps, grads_warps, prec = tiles.resolve(Ts, K, V, q.dtype)
    stages, walk_stages, grads_stages = tiles.kernel_stages(max(BK, VP), prec, C)
    meta = {"K": K, "V": V, "BK": BK, "VP": VP, "C": C, "HAS_G": g is not None, "PREC": prec}
    meta.update(num_warps=bwd_warps if backward else warps, num_stages=stages)
    blocks = {**meta, "BV": BV, "NSTEP": nstep}
    own = {
        "walk": {**blocks, "num_stages": walk_stages},
        "grads": {**blocks, "num_warps": grads_warps, "num_stages": grads_stages},
    }
    return C, VP // BV, tiles, meta, blocks, own


def _forward(q, k, v, g, beta, scale: float, nstep: int, save: bool, tiles: ChunkTiles | None = None, out_dtype=None):
    """``(o, W, U, Tm, ckpt)``: the output ``(B, T, H, V)`` in ``out_dtype`` (default ``q``'s); per chunk
    ``W (B H, NC C, BK)``, ``U (B H, NC C, VP)`` (holding ``U'`` once the walk ran) and the entering state
    ``ckpt (B H, NC, BK, VP)`` in ``tiles.store_dtype``, ``Tm (B H, NC C, C)`` float32."""
    B, T, H, _ = q.shape
    Ts = k.shape[1]
    C, NV, tiles, prep, blocks, _ = _meta(q, k, v, g, nstep, tiles)
    fused, BK, VP = tiles.fused, prep["BK"], prep["VP"]
    NC, dev, f32, kept = cdiv(Ts, C), q.device, torch.float32, tiles.store_dtype(prep["PREC"])
    W, U = (empty((B * H, NC * C, n), dev, kept) for n in (BK, VP))
    Tm = empty((B * H, NC * C, C), dev, f32)
    g_arg = beta if g is None else g  # any pointer: HAS_G=False never reads it
    chunk_prep_kernel[(NC, B * H)](k, v, g_arg, beta, W, U, Tm, Ts, H, **prep, INVERSE=tiles.inverse)
    o = empty((B, T, H, v.shape[-1]), dev, out_dtype or q.dtype)
    save = save or not fused
    ckpt = empty((B * H, NC, BK, VP) if save else (1,), dev, kept)
    args = (q, k, g_arg, W, U, o, ckpt, Ts, H, float(scale))
    chunk_fwd_kernel[(NV, B * H)](*args, OUT=fused, SAVE=save, **blocks)
    if not fused:
        chunk_out_kernel[(NC, B * H)](*args, **blocks)
    return o, W, U, Tm, ckpt


def _backward(do, q, k, v, g, beta, W, U, Tm, ckpt, scale: float, nstep: int, tiles: ChunkTiles | None = None):
    """``(dq, dk, dv, dg, dbeta)``: ``dv`` in ``v``'s dtype, the others float32 (``dg`` empty without ``g``)."""
    B, T, H, K = q.shape
    Ts, V = k.shape[1], v.shape[-1]
    C, NV, tiles, prep, blocks, own = _meta(q, k, v, g, nstep, tiles, backward=True)
    fused, BK, VP = tiles.fused, prep["BK"], prep["VP"]
    NC, dev, f32 = cdiv(Ts, C), q.device, torch.float32
    g_arg = beta if g is None else g
    parts = NV if fused else 1  # slices of the value blocks' shares (the split kernel sums them on chip)
    dq, dk_state = empty((parts, B, T, H, K), dev, f32), empty((parts, B, Ts, H, K), dev, f32)
    dW = empty((parts, B * H, NC * C, BK), dev, f32)
    dU = empty((B * H, NC * C, VP), dev, U.dtype)
    dG_state = empty((parts, B * H, NC * C), dev, f32)
    dckpt = ckpt if fused else empty(ckpt.shape, dev, ckpt.dtype)  # fused: never touched
    args = (q, k, g_arg, W, U, ckpt, do, dckpt, dq, dk_state, dW, dU, dG_state, B, Ts, H, float(scale))
    chunk_bwd_state_kernel[(NV, B * H)](*args, GRADS=fused, **(blocks if fused else own["walk"]))
    if not fused:
        chunk_bwd_grads_kernel[(NC, B * H)](*args, **own["grads"])
    dW, dq, dk, dG_state = (x.sum(0) if parts > 1 else x[0] for x in (dW, dq, dk_state, dG_state))
    dv, dbeta = empty((B, Ts, H, V), dev, v.dtype), empty((B, Ts, H), dev, f32)
    dg = empty((B, Ts, H), dev, f32) if g is not None else dq.new_empty(0)
    # dk: the state's part in, the whole gradient out; dg: from the state's part of dG
    dg_arg = dbeta if g is None else dg  # any pointer: HAS_G=False never writes it
    chunk_bwd_prep_kernel[(NC, B * H)](k, v, g_arg, beta, Tm, dW, dU, dk, dv, dbeta, dG_state, dg_arg, Ts, H, **prep)
    return dq, dk, dv, dg, dbeta


@torch.library.custom_op("expressivity::delta_chunk_fwd", mutates_args=())
def delta_chunk_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    scale: float,
    nstep: int,
    precision: str,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(o, W, U, Tm, ckpt)`` with the default tiles at products of ``precision``, ``o`` in ``out_dtype``
    (``_forward``)."""
    tiles = ChunkTiles(precision=precision)
    return _forward(q, k, v, g, beta, scale, nstep, save=True, tiles=tiles, out_dtype=out_dtype)


@delta_chunk_fwd.register_fake
def _(q, k, v, g, beta, scale, nstep, precision, out_dtype):
    B, T, H, K = q.shape
    Ts, V = k.shape[1], v.shape[-1]
    tiles = ChunkTiles(precision=precision)
    C, BK, _, VP, _, _, _, prec = tiles.resolve(Ts, K, V, q.dtype)
    NC, f32, kept = cdiv(Ts, C), torch.float32, tiles.store_dtype(prec)
    W, U = (q.new_empty(B * H, NC * C, n, dtype=kept) for n in (BK, VP))
    Tm = q.new_empty(B * H, NC * C, C, dtype=f32)
    return q.new_empty(B, T, H, V, dtype=out_dtype), W, U, Tm, q.new_empty(B * H, NC, BK, VP, dtype=kept)


@torch.library.custom_op("expressivity::delta_chunk_bwd", mutates_args=())
def delta_chunk_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor,
    W: torch.Tensor,
    U: torch.Tensor,
    Tm: torch.Tensor,
    ckpt: torch.Tensor,
    scale: float,
    nstep: int,
    precision: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input gradients ``(dq, dk, dv, dg, dbeta)`` with the default tiles at products of ``precision``
    (``_backward``): ``dv`` in ``v``'s dtype, the others float32."""
    return _backward(do, q, k, v, g, beta, W, U, Tm, ckpt, scale, nstep, ChunkTiles(precision=precision))


@delta_chunk_bwd.register_fake
def _(do, q, k, v, g, beta, W, U, Tm, ckpt, scale, nstep, precision):
    f = torch.float32
    dg = g.new_empty(g.shape, dtype=f) if g is not None else q.new_empty(0, dtype=f)
    dq, dk = (x.new_empty(x.shape, dtype=f) for x in (q, k))
    return dq, dk, v.new_empty(v.shape), dg, beta.new_empty(beta.shape, dtype=f)


def _setup_context(ctx, inputs, output):
    q, k, v, g, beta, scale, nstep, precision, _ = inputs
    ctx.save_for_backward(q, k, v, g, beta, *output[1:])
    ctx.opts = (scale, nstep, precision)


def _grad(ctx, do, *_):
    q, k, v, g, beta, W, U, Tm, ckpt = ctx.saved_tensors
    grads = delta_chunk_bwd(do.contiguous(), q, k, v, g, beta, W, U, Tm, ckpt, *ctx.opts)
    return (*grads_in_input_dtypes(grads, (q, k, v, g, beta)), None, None, None, None)


delta_chunk_fwd.register_autograd(_grad, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """Eager autograd over the same launches as the custom ops, with explicit tiles."""

    @staticmethod
    def forward(ctx, tiles, out_dtype, q, k, v, g, beta, scale, nstep):
        o, *saved = _forward(q, k, v, g, beta, scale, nstep, save=True, tiles=tiles, out_dtype=out_dtype)
        ctx.save_for_backward(q, k, v, g, beta, *saved)
        ctx.opts, ctx.tiles = (scale, nstep), tiles
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, g, beta, W, U, Tm, ckpt = ctx.saved_tensors
        grads = _backward(do.contiguous(), q, k, v, g, beta, W, U, Tm, ckpt, *ctx.opts, ctx.tiles)
        return (None, None, *grads_in_input_dtypes(grads, (q, k, v, g, beta)), None, None)


def gated_delta_chunk(
    q, k, v, g, beta, *, scale: float, nstep: int = 1, tiles: ChunkTiles | None = None, input_dtype=None
) -> torch.Tensor:
    """Over steps ``s``: ``S_s = exp(g_s) S_{s-1}(I - beta_s k_s k_s^T) + beta_s v_s k_s^T`` (no decay for
    ``g=None``), ``o_t = scale S_{s(t)} q_t`` at each token's last step ``s(t) = nstep t + nstep - 1``.
    ``q (B, T, H, K)``; per step ``k (B, T nstep, H, K)``, ``v (B, T nstep, H, V)``, ``g, beta (B, T nstep, H)``
    -> ``o (B, T, H, V)``; inputs are made contiguous; ``tiles``: ``ChunkTiles``; ``input_dtype``: the dtype
    of the caller's inputs before any cast or normalization (default ``q``'s), which sets the default
    precision (``default_precision``) and ``o``'s dtype (float32 for float64: the kernels write float32,
    bfloat16 or float16, so the output needs no cast, and its gradient comes back in that dtype)."""
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"delta triton_chunk: inputs must be one of {KERNEL_DTYPES}, got {q.dtype}")
    if max(q.shape[-1], v.shape[-1]) > 128:
        raise ValueError(f"delta triton_chunk: head dims up to 128, got K={q.shape[-1]}, V={v.shape[-1]}")
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = None if g is None else g.contiguous()
    input_dtype, tiles = input_dtype or q.dtype, tiles or ChunkTiles()
    precision = tiles.products(input_dtype)
    out_dtype = input_dtype if input_dtype in KERNEL_DTYPES else torch.float32
    args = (q, k, v, g, beta, float(scale), int(nstep))
    if torch.compiler.is_compiling():
        return delta_chunk_fwd(*args, precision, out_dtype)[0]
    tiles = dataclasses.replace(tiles, precision=precision)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args[:5]):
        return _Eager.apply(tiles, out_dtype, *args)
    return _forward(*args, save=False, tiles=tiles, out_dtype=out_dtype)[0]


def gated_delta_product(q, k, v, beta, g=None, *, scale=None, qk_l2norm=False, tiles: ChunkTiles | None = None):
    """``n = k.shape[2]`` delta steps per token, the decay ``exp(g_t)`` (or none) before them.
    ``q (B, L, H, K)``, ``k (B, L, n, H, K)``, ``v (B, L, n, H, V)``, ``beta (B, L, n, H)``, ``g (B, L, H)``."""
    B, L, n, H, K = k.shape
    out_dtype = q.dtype
    q, k, v, beta = kernel_dtype(q, k, v, beta)
    if qk_l2norm:  # into bfloat16 where the products round q, k to it anyway, else float32
        bf16 = (tiles or ChunkTiles()).products(out_dtype) == "bf16"
        q, k = (l2norm(x, torch.bfloat16 if bf16 else torch.float32) for x in (q, k))
    gs = None
    if g is not None:  # the log decay of each step: g on a token's first, 0 on the others
        gs = F.pad(kernel_dtype(g)[0][:, :, None], (0, 0, 0, n - 1)).reshape(B, L * n, H)
    ks, vs, bs = (x.reshape(B, L * n, H, *x.shape[4:]) for x in (k, v, beta))
    scale = K**-0.5 if scale is None else scale
    o = gated_delta_chunk(q, ks, vs, gs, bs, scale=scale, nstep=n, tiles=tiles, input_dtype=out_dtype)
    return o.to(out_dtype)  # float64 inputs: the kernels' float32 output


delta_rule, gated_delta_rule, delta_product = members(gated_delta_product)
