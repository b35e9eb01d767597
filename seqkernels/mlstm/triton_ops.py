"""The Triton (TFLA) chunkwise mLSTM: ``mlstm_triton`` with ``seqkernels.mlstm.mlstm``'s signature.

Two ``torch.library`` custom ops (namespace ``expressivity``), ``mlstm_chunkwise_fwd`` and
``mlstm_chunkwise_bwd``, wired together with ``register_autograd``. The forward runs the inter-chunk
state kernel and the tiled intra-chunk kernel (``fwd_kernels``); the backward runs the reverse state
kernel and the dQ, dK, dV kernels (``bwd_kernels``). Gate gradients use the identity
``d(log f cumsum)_t = q_t . dq_t - k_t . dk_t`` and ``d(log i)_t = k_t . dk_t`` (the function depends
on ``(q_t, B_t)`` only through ``exp(B_t) q_t`` and on ``(k_t, log i_t, B_t)`` through
``exp(log i_t - B_t) k_t``, ``B`` the cumulative log forget gate), plus the final-state term.

Inputs must be contiguous, on one device (CUDA, or the CPU under ``TRITON_INTERPRET=1``), and of one
dtype: float32, bfloat16 or float16 (float64 only under the interpreter, for tests). Chunk sizes are
powers of two from 16 to 4096; ``S`` need not be a multiple. float32 dots follow
``torch.get_float32_matmul_precision()`` (``_precision``): ``"high"`` 3-pass TF32 (float32-accurate,
the tensor-core default), ``"medium"`` single-pass TF32 (opt-in, as the peers run), ``"highest"`` IEEE.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from seqkernels._triton import cdiv, empty, next_pow2, triton_available
from seqkernels.mlstm.bwd_kernels import gate_grads, inter_chunk_dstates, intra_chunk_dk, intra_chunk_dq, intra_chunk_dv
from seqkernels.mlstm.fwd_kernels import chunk_gates, inter_chunk_states, intra_chunk_h
from seqkernels.mlstm.reference import check_args

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _empty(*shape, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return empty(shape, like.device, dtype or like.dtype)


def _np2(x: int) -> int:
    return max(16, next_pow2(x))


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _precision(dtype: torch.dtype) -> str:
    """``input_precision`` of every ``tl.dot`` of one forward / backward (one value for all kernels).

    float32 follows ``torch.get_float32_matmul_precision()``:

    * ``"high"`` (what the benchmark sets): ``"tf32x3"``, 3-pass TF32 on tensor cores, about
      float32-accurate. The float32 default on tensor cores: the normalizer gradient of mLSTMexp
      (``dd = -sign(d) inv (dh . h)``) and the gate gradients (reverse cumulative sums of
      ``q . dq - k . dk``) are differences of large terms that amplify single-pass TF32 error (df
      3.4% off float64 with single-pass TF32 in the backward, H200).
    * ``"medium"`` (opt-in): ``"tf32"``, single-pass TF32, as ``mlstm_kernels``' and ``fla``'s
      float32 kernels run (their ``tl.dot`` default): about 2x fewer tensor-core passes, relative
      errors ~1e-3 in h and percent-level in the mLSTMexp gate gradients.
    * ``"highest"`` (torch's default): ``"ieee"``, float32 FMA, no tensor cores (slow).

    float64 (interpreter only): ``"ieee"``. bfloat16 / float16 operands are multiplied in their own
    type (the value is ignored)."""
    if dtype == torch.float64:
        return "ieee"
    if dtype != torch.float32:
        return "tf32"
    return _float32_precision()


@torch.compiler.assume_constant_result  # torch.compile reads it once, when it traces
def _float32_precision() -> str:
    return {"highest": "ieee", "high": "tf32x3", "medium": "tf32"}[torch.get_float32_matmul_precision()]


@dataclasses.dataclass(frozen=True)
class MlstmTiles:
    """Tiles, warps, pipeline stages and data-movement options of the TFLA kernels (tiles are
    clipped to the problem at launch).

    Intra-chunk kernels: ``blq`` query rows and ``blkv`` key/value rows of a chunk per block, ``bk``
    the DQK tile (the inner loop of ``intra_chunk_h`` / ``intra_chunk_dv``, the grid's feature blocks of
    dq / dk), ``bv`` the DV tile, ``bv_dqdk`` the DV tile of the dq / dk kernels (the inner loop of
    ``dh V^T`` / ``v dh^T`` / ``dh C^T`` / ``v dC^T``), ``warps`` and ``stages``. Inter-chunk state
    kernels: ``bki x bvi`` state tiles, ``bl`` steps per inner block, ``inter_warps``.

    ``lp_states`` (16-bit inputs only): store the materialized chunk states ``C`` (forward) and ``dC``
    (backward), ``(B, NH, NC + 1, DQK, DV)`` each, in the input dtype instead of float32. Their
    readers cast them to the input dtype before every dot anyway, so ``h`` and all gradients are
    bit-identical; the final state and the initial state's gradient stay float32 (written
    separately). These tensors are most of the HBM traffic at chunk 64 (DQK x DV per 64 steps), so
    this halves it. ``gate_kernels``: gate vectors (forward, backward) and gate gradients by one
    Triton launch each (``chunk_gates``, ``gate_grads``) instead of ~12 small PyTorch ops each.
    """

    blq: int = 64
    blkv: int = 64
    bk: int = 128
    bv: int = 128
    bv_dqdk: int = 128
    bki: int = 64
    bvi: int = 64
    bl: int = 64
    warps: int = 4
    stages: int = 2
    inter_warps: int = 4
    lp_states: bool = True
    gate_kernels: bool = True


@functools.lru_cache(maxsize=16)
def default_tiles(dtype: torch.dtype, prec: str) -> MlstmTiles:
    """The tiles for dots at ``prec`` (``_precision``). 3-pass TF32 (``tf32x3``) splits every float32
    operand tile into a high and a low TF32 part, doubling the dots' shared memory: a DQK tile ``bk``
    of 64, inter-chunk DQK tiles ``bki`` of 32 (more programs for the sequential chunk loop), and a
    ``bv_dqdk`` of 64 (at 128 the dq / dk kernels need 256 KiB, the H100/H200 have 227 KiB). float64
    (interpreter only) uses 32-wide inter-chunk tiles. Measured: ``seqkernels/mlstm/README.md``."""
    big = 64 if dtype != torch.float64 else 32
    if prec == "tf32x3":
        return MlstmTiles(bk=64, bv_dqdk=64, bki=32, bvi=big)
    return MlstmTiles(bki=big, bvi=big)


def _state_dtype(dtype: torch.dtype, tiles: MlstmTiles, fused_inter: bool = True) -> torch.dtype:
    """Storage dtype of the materialized chunk states (``MlstmTiles.lp_states``); float32 for the
    per-chunk loop (``fused_inter=False``), which reads each state back as the next one's start."""
    if tiles.lp_states and fused_inter and dtype in (torch.bfloat16, torch.float16):
        return dtype
    return _acc_dtype(dtype)


def _config(L: int, DQK: int, DV: int, t: MlstmTiles) -> dict:
    """The launch dict of tiles ``t`` clipped to a chunk of ``L`` steps and head dims ``DQK, DV``."""
    return dict(
        BLQ=min(t.blq, L),
        BLKV=min(t.blkv, L),
        BK=min(t.bk, _np2(DQK)),
        BV=min(t.bv, _np2(DV)),
        BVDP=min(t.bv_dqdk, t.bv, _np2(DV)),
        BKI=min(t.bki, _np2(DQK)),
        BVI=min(t.bvi, _np2(DV)),
        BL=min(t.bl, L),
        W=t.warps,
        ST=t.stages,
        WI=t.inter_warps,
    )


# A kernel that does not fit the chip's shared memory (Triton's OutOfResources) is retried with one
# pipeline stage, then with the caller's smaller tiles (``shrink``: only tiles that are not grid
# dimensions). Precision is never lowered: if nothing fits, a RuntimeError says so. The level that
# compiled is remembered per kernel and compile-time arguments.
_LADDER = ({}, {"num_stages": 1})
_LEVEL: dict = {}


def _launch(kernel, grid, args, meta, shrink: tuple = ()):
    key = (kernel.fn.__name__ if hasattr(kernel, "fn") else repr(kernel), tuple(sorted(meta.items())))
    levels = list(_LADDER) + [dict(_LADDER[-1], **lv) for lv in shrink]
    for level in range(_LEVEL.get(key, 0), len(levels)):
        try:
            kernel[grid](*args, **dict(meta, **levels[level]))
        except Exception as err:  # noqa: BLE001 - only Triton's OutOfResources moves down the ladder
            if type(err).__name__ != "OutOfResources":
                raise
            if level == len(levels) - 1:
                name = key[0]
                raise RuntimeError(
                    f"mLSTM triton kernel {name} does not fit the GPU's shared memory with any of "
                    f"{[dict(meta, **lv) for lv in levels]} ({err}); precision is not lowered to make it fit. "
                    "Use smaller tiles (MlstmTiles, e.g. bv_dqdk=32, bv=64), a smaller chunk, "
                    "or bfloat16 inputs."
                ) from err
            continue
        _LEVEL[key] = level
        return


def _gates(i_pre, f_pre, exp_gate: bool, L: int, NC: int, kernel: bool = False):
    """Per-chunk gate vectors (padded to NC*L): b (cumulative log f), li, a = g - b + li; g; max(a).
    ``(B, NH, NC*L)`` x 3 and ``(B, NH, NC)`` x 2, float32 (float64 for float64 inputs). PyTorch (the
    reference), or ``kernel=True``: one ``chunk_gates`` launch."""
    if kernel:
        B, NH, S = i_pre.shape
        dt = _acc_dtype(i_pre.dtype)
        b, li, a = (_empty(B, NH, NC * L, like=i_pre, dtype=dt) for _ in range(3))
        g, amax = (_empty(B, NH, NC, like=i_pre, dtype=dt) for _ in range(2))
        _launch(chunk_gates, (NC, B * NH), (i_pre, f_pre, b, li, a, g, amax, S, NC), dict(L=L, EXP=exp_gate))
        return b, li, a, g, amax
    dt = _acc_dtype(i_pre.dtype)
    S = i_pre.shape[-1]
    pad = NC * L - S
    li = i_pre.to(dt) if exp_gate else F.logsigmoid(i_pre.to(dt))
    lf = F.logsigmoid(f_pre.to(dt))
    li = F.pad(li, (0, pad), value=-math.inf).reshape(*li.shape[:-1], NC, L)
    lf = F.pad(lf, (0, pad), value=0.0).reshape(*lf.shape[:-1], NC, L)
    b = torch.cumsum(lf, -1)
    g = b[..., -1]
    a = g[..., None] - b + li
    flat = lambda t: t.reshape(*t.shape[:-2], NC * L).contiguous()  # noqa: E731
    return flat(b), flat(li), flat(a), g.contiguous(), a.amax(-1).contiguous()


def run_inter_chunk_states(
    k,
    v,
    a,
    g,
    amax,
    c0,
    n0,
    m0,
    *,
    exp_gate: bool,
    L: int,
    fused: bool = True,
    prec: str | None = None,
    tiles: MlstmTiles | None = None,
    state_dtype: torch.dtype | None = None,
):
    """States entering each chunk: ``C (B, NH, NC+1, DQK, DV)`` in ``state_dtype`` (default float32;
    see ``_state_dtype``), ``n (B, NH, NC+1, DQK)``, ``M (B, NH, NC+1)`` (entry ``NC`` is the final
    state), and the final ``C`` again in float32, ``(B, NH, DQK, DV)``. ``fused`` keeps the state on
    chip (paper 004); otherwise one kernel launch per chunk passes the state through memory (needs a
    float32 ``state_dtype``). ``prec``: the dots' input precision (default ``_precision(k.dtype)``);
    ``tiles``: default ``default_tiles``. mLSTMsig: ``n`` stays ``n0``."""
    B, NH, S, DQK = k.shape
    DV = v.shape[-1]
    NC = g.shape[-1]
    acc = _acc_dtype(k.dtype)
    prec = prec or _precision(k.dtype)
    cfg = _config(L, DQK, DV, tiles or default_tiles(k.dtype, prec))
    state_dtype = state_dtype or acc
    if not fused and state_dtype != acc:
        raise ValueError("the per-chunk inter-chunk loop stores float32 states")
    cst = _empty(B, NH, NC + 1, DQK, DV, like=k, dtype=state_dtype)
    nst = _empty(B, NH, NC + 1, DQK, like=k, dtype=acc)
    mst = _empty(B, NH, NC + 1, like=k, dtype=acc)
    c_last = _empty(B, NH, DQK, DV, like=k, dtype=acc)
    has_init = c0 is not None
    if m0 is None:
        m0 = torch.zeros(B, NH, device=k.device, dtype=acc)
    grid = (cdiv(DQK, cfg["BKI"]), cdiv(DV, cfg["BVI"]), B * NH)
    args = dict(
        DQK=DQK, DV=DV, L=L, BK=cfg["BKI"], BV=cfg["BVI"], BL=cfg["BL"], EXP=exp_gate, HAS_INIT=has_init, PREC=prec
    )
    c0_ = c0 if has_init else cst
    n0_ = n0 if has_init else nst
    if fused:
        _launch(
            inter_chunk_states,
            grid,
            (k, v, a, g, amax, c0_, n0_, m0, cst, nst, mst, c_last, S, NC, 0),
            dict(args, FUSED=True, num_warps=cfg["WI"]),
        )
    else:
        if has_init:
            cst[:, :, 0] = c0
            nst[:, :, 0] = n0
        else:
            cst[:, :, 0] = 0
            nst[:, :, 0] = 0
        mst[:, :, 0] = m0
        for c in range(NC):
            _launch(
                inter_chunk_states,
                grid,
                (k, v, a, g, amax, c0_, n0_, m0, cst, nst, mst, c_last, S, NC, c),
                dict(args, FUSED=False, num_warps=cfg["WI"]),
            )
    return cst, nst, mst, c_last


def _check(q, k, v, i_pre, f_pre, input_gate, initial_state, chunk_size):
    check_args(q, k, v, i_pre, f_pre, input_gate, initial_state)
    if not triton_available(q):
        raise ValueError(f"the triton mLSTM needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU), got {q.device}")
    if q.dtype not in DTYPES:
        raise TypeError(f"the triton mLSTM supports {[str(d) for d in DTYPES]}, got {q.dtype}")
    if q.dtype == torch.float64 and q.is_cuda:
        raise TypeError(
            "the triton mLSTM runs float64 only under TRITON_INTERPRET=1; on CUDA use float32 or backend='torch'"
        )
    for name, t in (("k", k), ("v", v), ("i_pre", i_pre), ("f_pre", f_pre)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, q has {q.dtype}; pass one dtype")
    for name, t in (("q", q), ("k", k), ("v", v), ("i_pre", i_pre), ("f_pre", f_pre)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous())")
    if not (isinstance(chunk_size, int) and 16 <= chunk_size <= 4096 and chunk_size & (chunk_size - 1) == 0):
        raise ValueError(f"triton chunk_size must be a power of two in [16, 4096], got {chunk_size!r}")


def _forward(
    q,
    k,
    v,
    i_pre,
    f_pre,
    c0,
    n0,
    m0,
    exp_gate: bool,
    chunk_size: int,
    eps: float,
    fused_inter: bool,
    prec: str,
    tiles: MlstmTiles | None = None,
    state_dtype: torch.dtype | None = None,
):
    """Returns ``h``, the entering states ``C, n, M`` (``NC + 1`` each; ``C`` in ``state_dtype``,
    default ``_state_dtype`` of the tiles), per-step ``m`` and normalizer dot ``d`` (padded to
    ``NC * L``; one unused element each for mLSTMsig), the final ``C`` in float32 and the final ``M``
    copy. ``prec``: ``input_precision`` of every dot (``_precision``; the backward reuses it)."""
    B, NH, S, DQK = q.shape
    DV = v.shape[-1]
    L = chunk_size
    NC = cdiv(S, L)
    tiles = tiles or default_tiles(q.dtype, prec)
    b, li, a, g, amax = _gates(i_pre, f_pre, exp_gate, L, NC, tiles.gate_kernels)
    cst, nst, mst, c_last = run_inter_chunk_states(
        k,
        v,
        a,
        g,
        amax,
        c0,
        n0,
        m0,
        exp_gate=exp_gate,
        L=L,
        fused=fused_inter,
        prec=prec,
        tiles=tiles,
        state_dtype=state_dtype or _state_dtype(q.dtype, tiles, fused_inter),
    )
    cfg = _config(L, DQK, DV, tiles)
    h = _empty(*v.shape, like=v)
    mtok, dtok = (_empty(B, NH, NC * L if exp_gate else 1, like=q, dtype=mst.dtype) for _ in range(2))
    grid = (NC * (L // cfg["BLQ"]), cdiv(DV, cfg["BV"]), B * NH)
    _launch(
        intra_chunk_h,
        grid,
        (q, k, v, b, li, cst, nst, mst, h, mtok, dtok, S, NC, 1.0 / math.sqrt(DQK), eps),
        dict(
            DQK=DQK,
            DV=DV,
            L=L,
            BLQ=cfg["BLQ"],
            BLKV=cfg["BLKV"],
            BK=cfg["BK"],
            BV=cfg["BV"],
            EXP=exp_gate,
            PREC=prec,
            num_warps=cfg["W"],
            num_stages=cfg["ST"],
        ),
    )
    return h, cst, nst, mst, mtok, dtok, c_last, mst[:, :, -1].clone()


@torch.library.custom_op("expressivity::mlstm_chunkwise_fwd", mutates_args=())
def mlstm_chunkwise_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i_pre: torch.Tensor,
    f_pre: torch.Tensor,
    c0: torch.Tensor | None,
    n0: torch.Tensor | None,
    m0: torch.Tensor | None,
    exp_gate: bool,
    chunk_size: int,
    eps: float,
    fused_inter: bool,
    prec: str,
    state_dtype: torch.dtype,
) -> tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor
]:
    """The forward (``_forward``) with the default tiles, storing the chunk states in ``state_dtype``
    (resolved by the caller, ``_state_dtype``, so that a traced graph names it: a cached graph then
    never disagrees with a changed tile default)."""
    return _forward(
        q, k, v, i_pre, f_pre, c0, n0, m0, exp_gate, chunk_size, eps, fused_inter, prec, state_dtype=state_dtype
    )


@mlstm_chunkwise_fwd.register_fake
def _(q, k, v, i_pre, f_pre, c0, n0, m0, exp_gate, chunk_size, eps, fused_inter, prec, state_dtype):
    B, NH, S, DQK = q.shape
    DV = v.shape[-1]
    NC = -(-S // chunk_size)
    acc = _acc_dtype(q.dtype)
    e = lambda *s: q.new_empty(*s, dtype=acc)  # noqa: E731
    ntok = NC * chunk_size if exp_gate else 1
    cst = q.new_empty(B, NH, NC + 1, DQK, DV, dtype=state_dtype)
    return (
        torch.empty_like(v),
        cst,
        e(B, NH, NC + 1, DQK),
        e(B, NH, NC + 1),
        e(B, NH, ntok),
        e(B, NH, ntok),
        e(B, NH, DQK, DV),
        e(B, NH),
    )


def _gate_grads_torch(qdq, kdk, i_pre, f_pre, dlast, exp_gate: bool):
    """``di, df`` (``(B, NH, S)``, the pre-activations' dtype) from the row sums ``qdq, kdk``
    (``(NKB, B, NH, NC*L)`` float32 partial sums over feature blocks): ``d log f_t = sum_{s >= t}
    (q.dq - k.dk)_s + dlast`` (``dlast (B, NH)``: the final-state term, or None), ``df = d log f *
    sigmoid(-f)``, ``di = k.dk`` (mLSTMexp) or ``k.dk * sigmoid(-i)``. The PyTorch reference of
    ``bwd_kernels.gate_grads``."""
    S = i_pre.shape[-1]
    qdq, kdk = qdq.sum(0)[..., :S], kdk.sum(0)[..., :S]
    d_logf = (qdq - kdk).flip(-1).cumsum(-1).flip(-1)
    if dlast is not None:
        d_logf = d_logf + dlast[..., None]
    i32, f32 = i_pre.to(qdq.dtype), f_pre.to(qdq.dtype)
    di = kdk if exp_gate else kdk * torch.sigmoid(-i32)
    df = d_logf * torch.sigmoid(-f32)
    # contiguous, as the fake kernel (and torch.compile's plan) has them: kdk is a slice when S % L != 0
    return di.to(i_pre.dtype).contiguous(), df.to(f_pre.dtype).contiguous()


def _gate_grads(qdq, kdk, i_pre, f_pre, dlast, exp_gate: bool, block: int = 1024):
    """``_gate_grads_torch`` in one ``gate_grads`` launch (one program per batch*head, walking the
    sequence backwards in blocks of at most ``block`` steps, a power of two)."""
    B, NH, S = i_pre.shape
    di, df = torch.empty_like(i_pre), torch.empty_like(f_pre)
    has_dlast = dlast is not None
    _launch(
        gate_grads,
        (B * NH,),
        (qdq, kdk, i_pre, f_pre, dlast if has_dlast else qdq, di, df, S, qdq.shape[-1]),
        dict(NKB=qdq.shape[0], BS=min(block, _np2(S)), EXP=exp_gate, HAS_DLAST=has_dlast),
    )
    return di, df


def _backward(
    dh,
    dc_last,
    dn_last,
    q,
    k,
    v,
    i_pre,
    f_pre,
    h,
    cst,
    nst,
    mst,
    mtok,
    dtok,
    c_last,
    exp_gate: bool,
    chunk_size: int,
    eps: float,
    prec: str,
    tiles: MlstmTiles | None = None,
):
    """Gradients ``dq, dk, dv, di, df`` and of the initial state ``dC0, dn0`` (float32; the initial
    ``m0``'s gradient, ``<C0, dC0> + <n0, dn0>``, is formed by the caller). ``dc_last, dn_last``:
    gradients of the final state (both or neither); ``c_last``: the final ``C`` in float32; the
    state gradients ``dC`` are stored in ``cst``'s dtype (``MlstmTiles.lp_states``)."""
    B, NH, S, DQK = q.shape
    DV = v.shape[-1]
    L = chunk_size
    NC = cdiv(S, L)
    tiles = tiles or default_tiles(q.dtype, prec)
    cfg = _config(L, DQK, DV, tiles)
    acc = mst.dtype
    scale = 1.0 / math.sqrt(DQK)
    dh = dh.contiguous()
    b, li, a, g, _ = _gates(i_pre, f_pre, exp_gate, L, NC, tiles.gate_kernels)
    if exp_gate:
        pad = NC * L - S
        lower = torch.exp(-mtok)
        inv = 1.0 / (torch.maximum(dtok.abs(), lower) + eps)
        hdot = F.pad((dh.to(acc) * h.to(acc)).sum(-1), (0, pad))
        dd = -torch.sign(dtok) * (dtok.abs() > lower).to(acc) * inv * hdot
    else:
        inv = dd = mtok  # unused
    dcst = _empty(*cst.shape, like=cst)
    dnst = _empty(*nst.shape, like=nst)
    dc0 = _empty(*c_last.shape, like=c_last)
    has_dlast = dc_last is not None
    grid = (cdiv(DQK, cfg["BKI"]), cdiv(DV, cfg["BVI"]), B * NH)
    _launch(
        inter_chunk_dstates,
        grid,
        (
            q,
            dh,
            b,
            g,
            mtok,
            inv,
            dd,
            mst,
            dc_last if has_dlast else dc0,
            dn_last if has_dlast else dnst,
            dcst,
            dnst,
            dc0,
            S,
            NC,
            scale,
        ),
        dict(
            DQK=DQK,
            DV=DV,
            L=L,
            BK=cfg["BKI"],
            BV=cfg["BVI"],
            BL=cfg["BL"],
            EXP=exp_gate,
            HAS_DLAST=has_dlast,
            PREC=prec,
            num_warps=cfg["WI"],
        ),
    )
    common = dict(
        DQK=DQK,
        DV=DV,
        L=L,
        BLQ=cfg["BLQ"],
        BLKV=cfg["BLKV"],
        BK=cfg["BK"],
        BV=cfg["BV"],
        EXP=exp_gate,
        PREC=prec,
        num_warps=cfg["W"],
        num_stages=cfg["ST"],
    )
    common_qk = dict(common, BV=cfg["BVDP"])
    shrink_qk = ({"BV": max(16, common_qk["BV"] // 2)},) if common_qk["BV"] > 16 else ()
    nkb = cdiv(DQK, cfg["BK"])
    dq, dk, dv = (_empty(*t.shape, like=t) for t in (q, k, v))
    qdq, kdk = (_empty(nkb, B, NH, NC * L, like=q, dtype=acc) for _ in range(2))
    _launch(
        intra_chunk_dq,
        (NC * (L // cfg["BLQ"]), nkb, B * NH),
        (q, k, v, dh, b, li, mtok, inv, dd, cst, nst, mst, dq, qdq, S, NC, scale),
        common_qk,
        shrink_qk,
    )
    _launch(
        intra_chunk_dk,
        (NC * (L // cfg["BLKV"]), nkb, B * NH),
        (q, k, v, dh, b, li, a, mtok, inv, dd, dcst, dnst, mst, dk, kdk, S, NC, scale),
        common_qk,
        shrink_qk,
    )
    _launch(
        intra_chunk_dv,
        (NC * (L // cfg["BLKV"]), cdiv(DV, cfg["BV"]), B * NH),
        (q, k, dh, b, li, a, mtok, inv, dcst, mst, dv, S, NC, scale),
        common,
    )
    dlast = None
    if has_dlast:  # the final state's term of d log f (constant over the sequence)
        dlast = (c_last * dc_last).sum((-1, -2)) + (nst[:, :, -1] * dn_last).sum(-1)
    di, df = (_gate_grads if tiles.gate_kernels else _gate_grads_torch)(qdq, kdk, i_pre, f_pre, dlast, exp_gate)
    return dq, dk, dv, di, df, dc0, dnst[:, :, 0].clone()


@torch.library.custom_op("expressivity::mlstm_chunkwise_bwd", mutates_args=())
def mlstm_chunkwise_bwd(
    dh: torch.Tensor,
    dc_last: torch.Tensor | None,
    dn_last: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i_pre: torch.Tensor,
    f_pre: torch.Tensor,
    h: torch.Tensor,
    cst: torch.Tensor,
    nst: torch.Tensor,
    mst: torch.Tensor,
    mtok: torch.Tensor,
    dtok: torch.Tensor,
    c_last: torch.Tensor,
    exp_gate: bool,
    chunk_size: int,
    eps: float,
    prec: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward (``_backward``) with the default tiles."""
    return _backward(
        dh,
        dc_last,
        dn_last,
        q,
        k,
        v,
        i_pre,
        f_pre,
        h,
        cst,
        nst,
        mst,
        mtok,
        dtok,
        c_last,
        exp_gate,
        chunk_size,
        eps,
        prec,
    )


@mlstm_chunkwise_bwd.register_fake
def _(
    dh, dc_last, dn_last, q, k, v, i_pre, f_pre, h, cst, nst, mst, mtok, dtok, c_last, exp_gate, chunk_size, eps, prec
):
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        torch.empty_like(i_pre),
        torch.empty_like(f_pre),
        torch.empty_like(c_last),
        torch.empty_like(nst[:, :, 0]),
    )


def _last_state_grads(dh, dclast, dnst, h, c_last, nst):
    """The gradients reaching the final state (the only user-visible state output), zeros where
    autograd passes none."""
    dc_last = None if dclast is None else dclast.contiguous()
    dn_last = None if dnst is None else dnst[:, :, -1].contiguous()
    if dc_last is not None and dn_last is None:
        dn_last = torch.zeros_like(nst[:, :, -1])
    if dn_last is not None and dc_last is None:
        dc_last = torch.zeros_like(c_last)
    return (torch.zeros_like(h) if dh is None else dh), dc_last, dn_last


def _initial_state_grads(c0, n0, dc0, dn0):
    """``(dC0, dn0, dm0)`` for a given initial state (``dm0 = <C0, dC0> + <n0, dn0>``), else Nones."""
    if c0 is None:
        return None, None, None
    dm0 = (c0.to(dc0.dtype) * dc0).sum((-1, -2)) + (n0.to(dn0.dtype) * dn0).sum(-1)
    return dc0.to(c0.dtype), dn0.to(n0.dtype), dm0.to(c0.dtype)


def _setup_context(ctx, inputs, output):
    q, k, v, i_pre, f_pre, c0, n0, m0, exp_gate, chunk_size, eps, _, prec, _ = inputs
    h, cst, nst, mst, mtok, dtok, c_last, _ = output
    ctx.save_for_backward(q, k, v, i_pre, f_pre, c0, n0, h, cst, nst, mst, mtok, dtok, c_last)
    ctx.opts = (exp_gate, chunk_size, eps, prec)
    ctx.set_materialize_grads(False)  # see _Eager


def _grad(ctx, dh, dcst, dnst, dmst, dmtok, ddtok, dclast, dm_last):
    q, k, v, i_pre, f_pre, c0, n0, h, cst, nst, mst, mtok, dtok, c_last = ctx.saved_tensors
    dh, dc_last, dn_last = _last_state_grads(dh, dclast, dnst, h, c_last, nst)
    dq, dk, dv, di, df, dc0, dn0 = mlstm_chunkwise_bwd(
        dh, dc_last, dn_last, q, k, v, i_pre, f_pre, h, cst, nst, mst, mtok, dtok, c_last, *ctx.opts
    )
    return (dq, dk, dv, di, df, *_initial_state_grads(c0, n0, dc0, dn0), None, None, None, None, None, None)


mlstm_chunkwise_fwd.register_autograd(_grad, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """Eager autograd over the same launches as the custom ops (no dispatcher round trips), with
    explicit tiles."""

    @staticmethod
    def forward(ctx, tiles, q, k, v, i_pre, f_pre, c0, n0, m0, exp_gate, chunk_size, eps, fused_inter, prec):
        out = _forward(q, k, v, i_pre, f_pre, c0, n0, m0, exp_gate, chunk_size, eps, fused_inter, prec, tiles)
        h, cst, nst, mst, mtok, dtok, c_last, _ = out
        ctx.save_for_backward(q, k, v, i_pre, f_pre, c0, n0, h, cst, nst, mst, mtok, dtok, c_last)
        ctx.opts, ctx.tiles = (exp_gate, chunk_size, eps, prec), tiles
        ctx.mark_non_differentiable(cst, mst, mtok, dtok, out[-1])
        # unused outputs get None, not zeros: autograd would otherwise zero-fill a gradient for each,
        # (B, NH, NC+1, DQK, DV) for cst (545 MB at the benchmark shape) on every backward
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dh, dcst, dnst, dmst, dmtok, ddtok, dclast, dm_last):
        q, k, v, i_pre, f_pre, c0, n0, h, cst, nst, mst, mtok, dtok, c_last = ctx.saved_tensors
        dh, dc_last, dn_last = _last_state_grads(dh, dclast, dnst, h, c_last, nst)
        dq, dk, dv, di, df, dc0, dn0 = _backward(
            dh, dc_last, dn_last, q, k, v, i_pre, f_pre, h, cst, nst, mst, mtok, dtok, c_last, *ctx.opts, ctx.tiles
        )
        return (None, dq, dk, dv, di, df, *_initial_state_grads(c0, n0, dc0, dn0), None, None, None, None, None)


def mlstm_triton(
    q,
    k,
    v,
    i_pre,
    f_pre,
    *,
    input_gate="exp",
    chunk_size=64,
    initial_state=None,
    return_last_state=False,
    eps=1e-6,
    fused_inter=True,
    tiles: MlstmTiles | None = None,
):
    """TFLA chunkwise mLSTM (see the module docstring); same contract as ``seqkernels.mlstm.mlstm``.

    ``fused_inter=False`` runs the inter-chunk state recurrence as one kernel launch per chunk
    (the baseline of paper 004) instead of keeping the state on chip; results are bit-identical.
    ``tiles``: ``MlstmTiles`` (default ``default_tiles``).
    """
    _check(q, k, v, i_pre, f_pre, input_gate, initial_state, chunk_size)
    exp_gate = input_gate == "exp"
    c0 = n0 = m0 = None
    if initial_state is not None:
        acc = _acc_dtype(q.dtype)
        if exp_gate:
            c0, n0, m0 = (t.to(acc).contiguous() for t in initial_state)
        else:
            c0 = initial_state[0].to(acc).contiguous()
            n0 = torch.zeros(c0.shape[:-1], device=c0.device, dtype=acc)
            m0 = torch.zeros(c0.shape[:-2], device=c0.device, dtype=acc)
    prec = _precision(q.dtype)
    args = (q, k, v, i_pre, f_pre, c0, n0, m0, exp_gate, chunk_size, float(eps), bool(fused_inter), prec)
    if torch.compiler.is_compiling():
        out = mlstm_chunkwise_fwd(*args, _state_dtype(q.dtype, default_tiles(q.dtype, prec), bool(fused_inter)))
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args[:8]):
        out = _Eager.apply(tiles, *args)
    else:
        out = _forward(*args, tiles)
    h, cst, nst, mst, _, _, c_last, m_last = out
    if not return_last_state:
        return h
    if exp_gate:
        return h, (c_last, nst[:, :, -1], m_last)
    return h, (c_last,)
