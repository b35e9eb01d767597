"""SSD with Triton kernels, forward and backward, as ``torch.library`` custom ops.

Same function and arguments as ``pytorch.ssd_chunked``. Forward: the states entering every chunk
(``chunk_state``: chunk states and the recurrence across chunks fused, the state kept on chip),
then the chunk outputs (``chunk_attn``, causal). Backward, with ``E_ts = exp(acum_t - acum_s)``, ``prev_c`` the state
entering chunk ``c`` and ``G_c`` the gradient reaching it:

- ``G_c = sum_{t in c} exp(acum_t) dy_t (x) C_t + exp(acum_last_c) G_{c+1}``, ``G_nc = dfinal``
  (``chunk_state`` in reverse)
- ``dx_s = dt_s [sum_{t>=s} (B_s.C_t) E_ts dy_t + exp(acum_last - acum_s) G_{c+1} B_s]``
- ``dB_s = dt_s [sum_{t>=s} (x_s.dy_t) E_ts C_t + exp(acum_last - acum_s) x_s G_{c+1}]``
- ``dC_t = sum_{s<=t} (dy_t.x_s) E_ts dt_s B_s + exp(acum_t) dy_t prev_c``
- the gradient of ``a_r = dt_r A`` from per-position and per-pair terms that never cancel (a
  difference of row and column sums would, ``tests/kernels/test_ssd.py::test_triton_16bit_decay_gradient``):
  ``da_r = <G_{c+1}, exp(acum_last) prev_c>`` (carried state)
  ``+ sum_{t>=r in c} exp(acum_t) dy_t . (prev_c C_t)`` (entering state, reverse cumulative sum)
  ``+ sum_{s<r in c} dt_s x_s . (exp(acum_last - acum_s) G_{c+1} B_s)`` (chunk state, exclusive
  cumulative sum) ``+ sum_{t>=r>s in c} (dy_t.x_s)(C_t.B_s) exp(acum_t - acum_s) dt_s`` (intra-chunk,
  ``chunk_attn``'s ``DDA``); then ``ddt = x . dx / dt + da A`` and ``dA = sum da dt``.

The step sizes, decays and states are float32; ``x, B, C`` are read in their dtype
(float32 / bfloat16 / float16) and the matrix products accumulate in float32. float32 products
follow ``torch.get_float32_matmul_precision()`` at the forward call (``_precision``): ``"highest"``
(torch's default) and ``"high"`` use 3-pass TF32 (``tf32x3``, float32-accurate on tensor cores),
``"medium"`` single-pass TF32 (``tf32``, as ``mamba-ssm``'s kernels run: ~1e-3 relative errors).
Tiles: ``SsdTiles`` per kernel and ``chunk_attn`` role (defaults ``attn_config`` / ``state_config``),
passed as ``ssd_triton(..., tiles=)``; without it the named set of ``TILE_SETS`` that ``DEVICE_TILES``
picks for the GPU (``default_tiles``). Each kernel launch is a custom op (``expressivity::ssd_chunk_state``, ``ssd_chunk_attn``,
and the per-chunk ``C . B`` products ``ssd_chunk_dots``); the padding, decays and sums around them
are plain torch code in one ``autograd.Function``, so ``torch.compile`` traces and fuses them with
the rest of the model. Eager calls run the launches directly. Under ``torch.func.vmap`` (eagerly:
Dynamo cannot vmap the ``autograd.Function``) each launch folds the vmapped models into its heads
(one launch for every model of the vmap).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from seqkernels._triton import FEW_PROGRAMS, cdiv, empty, float32_matmul_precision, next_pow2, triton_available
from seqkernels.ssd.chunk_kernels import chunk_attn_kernel, chunk_state_kernel

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _empty(*shape: int, device, dtype) -> torch.Tensor:
    return empty(shape, device, dtype)


def _pow2(n: int) -> int:
    return max(16, next_pow2(n))


ATTN_ROLES = ("fwd", "dx", "db", "dc")  # the four chunk_attn launches of a forward + backward


@dataclasses.dataclass(frozen=True)
class SsdTiles:
    """Tiles of the SSD kernels; a field left ``None`` takes the default for the problem
    (``attn_config`` / ``state_config``: the tiles chosen on an H100).

    ``chunk_attn`` runs in four roles (``ATTN_ROLES``): ``fwd`` (``y``), ``dx``, ``db`` (``dB``) and
    ``dc`` (``dC`` and the decay gradient's intra-chunk part). Per role: ``{role}_rows`` rows per
    program ``BT``, ``{role}_cols`` columns per block ``BC`` (a divisor of ``BT``), ``{role}_warps``,
    ``{role}_stages``, and for ``db`` / ``dc`` ``{role}_heads``: the most heads one program sums into
    its per-group output (default 16; fewer: more programs, more partial outputs summed in torch);
    ``attn_rows`` etc. set every role whose own field is ``None``. ``chunk_state``
    (forward and reverse): ``state_rows x state_cols`` state tile, ``state_steps`` steps per block,
    ``state_warps``, ``state_stages``."""

    attn_rows: int | None = None
    attn_cols: int | None = None
    attn_warps: int | None = None
    attn_stages: int | None = None
    attn_heads: int | None = None
    fwd_rows: int | None = None
    fwd_cols: int | None = None
    fwd_warps: int | None = None
    fwd_stages: int | None = None
    dx_rows: int | None = None
    dx_cols: int | None = None
    dx_warps: int | None = None
    dx_stages: int | None = None
    db_rows: int | None = None
    db_cols: int | None = None
    db_warps: int | None = None
    db_stages: int | None = None
    db_heads: int | None = None
    dc_rows: int | None = None
    dc_cols: int | None = None
    dc_warps: int | None = None
    dc_stages: int | None = None
    dc_heads: int | None = None
    state_rows: int | None = None
    state_cols: int | None = None
    state_steps: int | None = None
    state_warps: int | None = None
    state_stages: int | None = None

    @classmethod
    def parse(cls, spec: str) -> SsdTiles:
        """``"fwd_cols=64,attn_stages=2"`` -> ``SsdTiles(fwd_cols=64, attn_stages=2)``; a name of
        ``TILE_SETS`` -> that set."""
        if spec in TILE_SETS:
            return TILE_SETS[spec]
        return cls(**{k.strip(): int(v) for k, v in (item.split("=") for item in spec.split(",") if item)})


# Named tile sets. "h100": the fixed tiles measured on an H100. "h200": the fastest tile of each launch
# on an H200, which splits each chunk's columns into blocks narrower than the rows (as mamba-ssm's
# BLOCK_SIZE_K): the column loop has several iterations to pipeline, the score tiles are (BT, BC)
# instead of (BT, BT) (fewer registers), and less of the diagonal block is masked.
# ``python -m benchmarks.ops ssd --tiles "h100;h200"`` times both.
TILE_SETS: dict[str, SsdTiles] = {
    "h100": SsdTiles(),
    "h200": SsdTiles(
        state_rows=64,
        state_cols=64,
        state_steps=64,
        state_warps=4,
        state_stages=2,
        fwd_rows=64,
        fwd_cols=32,
        fwd_warps=4,
        fwd_stages=2,
        dx_rows=64,
        dx_cols=32,
        dx_warps=4,
        dx_stages=2,
        db_rows=128,
        db_cols=32,
        db_warps=4,
        db_stages=3,
        dc_rows=64,
        dc_cols=32,
        dc_warps=4,
        dc_stages=2,
        dc_heads=8,
    ),
}

#: the tile set per device: the first key contained in ``torch.cuda.get_device_name()`` picks its set,
#: any other device "h100"
DEVICE_TILES: dict[str, str] = {"H200": "h200"}

_FIELDS = {f.name: i for i, f in enumerate(dataclasses.fields(SsdTiles))}


@torch.compiler.assume_constant_result  # torch.compile reads it once, when it traces
def _device_tile_set(index: int) -> str:
    """The ``TILE_SETS`` name ``DEVICE_TILES`` picks for CUDA device ``index`` (-1: not CUDA)."""
    name = torch.cuda.get_device_name(index) if index >= 0 else ""
    return next((v for k, v in DEVICE_TILES.items() if k in name), "h100")


def default_tiles(device: torch.device) -> SsdTiles:
    """The tiles ``ssd_triton`` uses on ``device`` when none are given (``DEVICE_TILES``)."""
    return TILE_SETS[_device_tile_set(device.index if device.type == "cuda" else -1)]


@torch.compiler.assume_constant_result  # torch.compile reads it once, when it traces
def _float32_precision() -> str:
    return {"highest": "tf32x3", "high": "tf32x3", "medium": "tf32"}[torch.get_float32_matmul_precision()]


def _precision(dtype: torch.dtype) -> str:
    """``input_precision`` of every ``tl.dot`` (see the module docstring); 16-bit operands ignore it."""
    return _float32_precision() if dtype == torch.float32 else "tf32"


def attn_config(
    Q: int, DK: int, DV: int, itemsize: int, dda: bool = False, tiles: list[int] = (), Lp: int = 0, lanes: int = 0
) -> dict:
    """Rows per program ``BT``, columns per block ``BC``, warps and stages of one ``chunk_attn``
    launch; ``tiles``: ``[rows, cols, warps, stages, heads]`` of its role (``_attn_tiles``, 0:
    default). Defaults (H100): 128-row tiles (8 warps) only where they fit in shared memory (16-bit
    inputs, head dim and state <= 64) and not with ``DDA`` (its extra ``BT x BT`` float32 tiles, the
    prefix sum's among them, would spill registers); float32 with a 128-wide operand (state 128): 32
    rows; else 64 rows; 4 warps below 128 rows; ``BC = BT``; one pipeline stage where ``BC = BT`` (the
    column loop runs only ``Q / BT`` times; more stages cost shared memory for nothing), else two.
    A small launch (``Lp / BT * lanes`` programs below ``FEW_PROGRAMS``; ``Lp``: the padded length,
    ``lanes``: programs per row tile, 0: no limit) halves its rows, given or default, down to 32:
    Table 6's Mamba2 (batch 16, 100 steps, 4 heads of 16, state 64, float32) runs 32-row programs,
    its compiled training step 13% less GPU time than with 64 (H100). Measured: ``seqkernels/ssd/README.md``."""
    rows, cols, warps, stages = (list(tiles) + [0] * 4)[:4]
    wide = itemsize == 2 and max(DK, DV) <= 64 and not dda
    narrow = itemsize == 4 and max(DK, DV) > 64
    BT = min(Q, rows or (128 if wide else 32 if narrow else 64))
    while lanes and BT > 32 and Lp // BT * lanes < FEW_PROGRAMS:
        BT //= 2
    BC = min(BT, cols or BT)
    if BT % BC or BC < 16:
        raise ValueError(f"ssd triton: {BC} columns per block must divide the {BT} rows and be >= 16")
    return {
        "BT": BT,
        "BC": BC,
        "num_warps": warps or (8 if BT >= 128 else 4),
        "num_stages": stages or (1 if BC == BT else 2),
    }


def state_config(DU: int, DV: int, Q: int, itemsize: int, tiles: list[int] = ()) -> dict:
    """State tile ``BU x BV``, steps per block ``BS``, warps and stages of ``chunk_state``; ``tiles``:
    ``[rows, cols, steps, warps, stages]`` (``_state_tiles``, 0: default). Defaults: 64 x 64 tiles,
    64-step blocks, 4 warps; 16-bit inputs 2 stages, float32 32 x 64 tiles (twice the programs) and
    3 stages. Measured: ``seqkernels/ssd/README.md``."""
    rows, cols, steps, warps, stages = (list(tiles) + [0] * 5)[:5]
    return {
        "BU": min(rows or (64 if itemsize == 2 else 32), _pow2(DU)),
        "BV": min(cols or 64, _pow2(DV)),
        "BS": min(Q, steps or 64),
        "num_warps": warps or 4,
        "num_stages": stages or (2 if itemsize == 2 else 3),
    }


def _attn_tiles(tiles: list[int], role: str) -> list[int]:
    """``[rows, cols, warps, stages, heads]`` of ``role`` from ``_tile_list``'s list (0: default)."""
    own = lambda k: tiles[_FIELDS[f"{role}_{k}"]] if f"{role}_{k}" in _FIELDS else 0  # noqa: E731
    return [own(k) or tiles[_FIELDS[f"attn_{k}"]] for k in ("rows", "cols", "warps", "stages", "heads")]


def _state_tiles(tiles: list[int]) -> list[int]:
    """``[rows, cols, steps, warps, stages]`` of ``chunk_state`` from ``_tile_list``'s list."""
    return [tiles[_FIELDS[f"state_{k}"]] for k in ("rows", "cols", "steps", "warps", "stages")]


def _decays(dt: torch.Tensor, A: torch.Tensor, Q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``dt`` as float32 ``(batch, H, Lp)`` zero-padded, and ``acum`` its in-chunk cumsum of dt*A."""
    batch, L, H = dt.shape
    pad = (-L) % Q
    dtT = F.pad(dt.float().transpose(1, 2), (0, pad)).contiguous()
    acum = (dtT * A.float()[:, None]).view(batch, H, -1, Q).cumsum(-1).view(batch, H, L + pad)
    return dtT, acum


# --- the launches: custom ops that hold one Triton kernel each (opaque to torch.compile) -------------
# Everything around them (padding, decays, the sums of partial results) is plain torch code, so
# Inductor fuses it with the model's own elementwise work. Eagerly the launch functions run directly
# (``_launch``: no dispatcher round trips); while compiling through their custom ops.


def _tile_list(tiles: SsdTiles) -> list[int]:
    """``SsdTiles`` as one int per field, 0 for the default (what ``_Ssd`` carries)."""
    return [v or 0 for v in dataclasses.astuple(tiles)]


def _state_launch_config(u: torch.Tensor, DV: int, Q: int, tiles: list[int]) -> tuple[dict, int]:
    """``state_config`` of a ``chunk_state`` launch and its number of state tiles."""
    cfg = state_config(u.shape[-1], DV, Q, u.element_size(), tiles)
    return cfg, cdiv(u.shape[-1], cfg["BU"]) * cdiv(DV, cfg["BV"])


def _chunk_state_launch(
    u, v, init, acum, dtT, prev, chunk_size: int, precision: str, reverse: bool, tiles: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_state`` (see ``chunk_kernels``): ``(batch, nc + 1, H, DU, DV)`` in ``u``'s dtype, and in
    reverse the per-``(batch, chunk, head, state tile)`` partial sums of ``<out[c+1], exp(acum_last_c)
    prev[c]>`` ``(batch, nc, H, state tiles)`` float32 (forward: an empty tensor)."""
    batch, L, H, DU = u.shape
    DV = v.shape[-1]
    Lp = acum.shape[-1]
    nc = Lp // chunk_size
    out = _empty(batch, nc + 1, H, DU, DV, device=u.device, dtype=u.dtype)
    cfg, ntiles = _state_launch_config(u, DV, chunk_size, tiles)
    dots = _empty(batch, nc, H, ntiles, device=u.device, dtype=torch.float32) if reverse else out.new_empty(0)
    init_strides = init.stride() if init is not None else (0, 0, 0, 0)
    p = prev if prev is not None else out
    chunk_state_kernel[(batch * H, ntiles)](
        u,
        v,
        init if init is not None else out,
        out,
        p,
        dots if reverse else out,
        acum,
        dtT,
        L,
        H,
        Lp,
        nc,
        DU,
        DV,
        H // v.shape[2],
        *u.stride(),
        *v.stride(),
        *init_strides,
        *out.stride(),
        *p.stride(),
        Q=chunk_size,
        REVERSE=reverse,
        HAS_INIT=init is not None,
        PREC=precision,
        **cfg,
    )
    return out, dots


@torch.library.custom_op("expressivity::ssd_chunk_state", mutates_args=())
def ssd_chunk_state(
    u: torch.Tensor,
    v: torch.Tensor,
    init: torch.Tensor | None,
    acum: torch.Tensor,
    dtT: torch.Tensor,
    prev: torch.Tensor | None,
    chunk_size: int,
    precision: str,
    reverse: bool,
    tiles: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_chunk_state_launch`` as a custom op."""
    return _chunk_state_launch(u, v, init, acum, dtT, prev, chunk_size, precision, reverse, tiles)


@ssd_chunk_state.register_fake
def _(u, v, init, acum, dtT, prev, chunk_size, precision, reverse, tiles):
    batch, _, H, DU = u.shape
    nc = acum.shape[-1] // chunk_size
    _, ntiles = _state_launch_config(u, v.shape[-1], chunk_size, tiles)
    dots = u.new_empty(batch, nc, H, ntiles, dtype=torch.float32) if reverse else u.new_empty(0)
    return u.new_empty(batch, nc + 1, H, DU, v.shape[-1]), dots


def _heads_per_program(ratio: int, most: int = 0) -> int:
    """Heads summed by one program when the output is per group: the largest divisor of ``ratio``
    that is <= ``most`` (0: 16)."""
    return max(d for d in range(1, min(ratio, most or 16) + 1) if ratio % d == 0)


def _attn_outputs(q, v, acum, chunk_size, out_heads, dda, tiles) -> tuple[int, dict, int]:
    """Heads per program, ``attn_config`` and row tiles per chunk of a ``chunk_attn`` launch."""
    batch, H, Lp = acum.shape
    hpp = 1 if out_heads == H else _heads_per_program(H // out_heads, tiles[4] if len(tiles) > 4 else 0)
    cfg = attn_config(chunk_size, q.shape[-1], v.shape[-1], q.element_size(), dda, tiles, Lp, batch * (H // hpp))
    return hpp, cfg, chunk_size // cfg["BT"]


def _chunk_attn_launch(
    q,
    k,
    v,
    S,
    acum,
    dtT,
    w,
    cb,
    chunk_size: int,
    precision: str,
    reverse: bool,
    out_heads: int,
    out_dtype: torch.dtype,
    full_dot: bool,
    dda: bool,
    tiles: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run ``chunk_attn``. ``S (batch, nc, H, DK, DV)`` (any strides); ``cb (batch, nc, G, Q, Q)``
    ``q . k`` precomputed per chunk (any strides), or with ``dda`` the ``C . B`` factor of the
    intra-chunk decay gradient. Returns the output ``(batch, L, H / hpp, DV)`` summed over the ``hpp``
    heads of a program (``_heads_per_program``; all heads of a group share one output when
    ``out_heads < H``), the row dots ``(batch, H, Lp)`` float32 of the state term when ``w`` is given
    (and of the whole sum with ``full_dot``), and with ``dda`` the per-row-tile parts of the
    intra-chunk decay gradient ``(batch, H, Q / BT, Lp)`` float32; each unused output is an empty
    tensor."""
    batch, L = q.shape[:2]
    H, Lp = acum.shape[1], acum.shape[2]
    DK, DV = q.shape[-1], v.shape[-1]
    hpp, cfg, ntile = _attn_outputs(q, v, acum, chunk_size, out_heads, dda, tiles)
    out = _empty(batch, L, H // hpp, DV, device=q.device, dtype=out_dtype)
    dot = _empty(batch, H, Lp, device=q.device, dtype=torch.float32) if w is not None else acum.new_empty(0)
    full = _empty(batch, H, Lp, device=q.device, dtype=torch.float32) if full_dot else acum.new_empty(0)
    dda_parts = torch.zeros(batch, H, ntile, Lp, device=q.device, dtype=torch.float32) if dda else acum.new_empty(0)
    w_ = w if w is not None else v
    cb_ = cb if cb is not None else S
    chunk_attn_kernel[(Lp // cfg["BT"], batch * (H // hpp))](
        q,
        k,
        v,
        S,
        w_,
        cb_,
        out,
        dot if w is not None else acum,
        full if full_dot else acum,
        dda_parts if dda else acum,
        acum,
        dtT,
        L,
        H,
        Lp,
        DK,
        DV,
        H // hpp,
        H // q.shape[2],
        H // k.shape[2],
        H // v.shape[2],
        H // w_.shape[2],
        H // cb_.shape[2],
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *S.stride(),
        *w_.stride(),
        *cb_.stride(),
        *out.stride(),
        Q=chunk_size,
        BK=_pow2(DK),
        BV=_pow2(DV),
        HPP=hpp,
        REVERSE=reverse,
        HAS_DOT=w is not None,
        FULL_DOT=full_dot,
        HAS_CB=cb is not None and not dda,
        DDA=dda,
        PREC=precision,
        **cfg,
    )
    return out, dot, full, dda_parts


@torch.library.custom_op("expressivity::ssd_chunk_attn", mutates_args=())
def ssd_chunk_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    S: torch.Tensor,
    acum: torch.Tensor,
    dtT: torch.Tensor,
    w: torch.Tensor | None,
    cb: torch.Tensor | None,
    chunk_size: int,
    precision: str,
    reverse: bool,
    out_heads: int,
    out_dtype: torch.dtype,
    full_dot: bool,
    dda: bool,
    tiles: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_chunk_attn_launch`` as a custom op."""
    return _chunk_attn_launch(
        q, k, v, S, acum, dtT, w, cb, chunk_size, precision, reverse, out_heads, out_dtype, full_dot, dda, tiles
    )


@ssd_chunk_attn.register_fake
def _(q, k, v, S, acum, dtT, w, cb, chunk_size, precision, reverse, out_heads, out_dtype, full_dot, dda, tiles):
    batch, L = q.shape[:2]
    H, Lp = acum.shape[1], acum.shape[2]
    hpp, _, ntile = _attn_outputs(q, v, acum, chunk_size, out_heads, dda, tiles)
    rows = lambda on: acum.new_empty(batch, H, Lp) if on else acum.new_empty(0)  # noqa: E731
    return (
        q.new_empty(batch, L, H // hpp, v.shape[-1], dtype=out_dtype),
        rows(w is not None),
        rows(full_dot),
        acum.new_empty(batch, H, ntile, Lp) if dda else acum.new_empty(0),
    )


def _chunk_dots_launch(q: torch.Tensor, k: torch.Tensor, precision: str) -> torch.Tensor:
    """``q @ k^T`` of ``(..., Q, N)`` float32 operands with single-pass TF32 products where ``precision``
    is ``"tf32"``, else float32 ones."""
    with float32_matmul_precision("high" if precision == "tf32" else "highest"):
        return q @ k.transpose(-1, -2)


@torch.library.custom_op("expressivity::ssd_chunk_dots", mutates_args=())
def ssd_chunk_dots(q: torch.Tensor, k: torch.Tensor, precision: str) -> torch.Tensor:
    """``_chunk_dots_launch`` as a custom op (its matmul precision is not torch.compile's to choose)."""
    return _chunk_dots_launch(q, k, precision)


@ssd_chunk_dots.register_fake
def _(q, k, precision):
    return q.new_empty(*q.shape[:-1], k.shape[-2])


def _fold_heads(t: torch.Tensor | None, dim: int | None, size: int, head_dim: int) -> torch.Tensor | None:
    """``t`` with its ``torch.func.vmap`` dimension ``dim`` (``None``: not vmapped, so repeated) folded
    into its head dimension ``head_dim`` (counted without the vmap dimension): model ``s``'s head
    ``h`` becomes head ``s * H + h``."""
    if t is None:
        return None
    t = t.unsqueeze(0).expand(size, *t.shape) if dim is None else t.movedim(dim, 0)
    return t.movedim(0, head_dim).flatten(head_dim, head_dim + 1)


def _unfold_heads(t: torch.Tensor, size: int, head_dim: int) -> torch.Tensor:
    """Inverse of ``_fold_heads``: the folded heads of ``head_dim`` back into a leading vmap dimension."""
    return t.unflatten(head_dim, (size, -1)).movedim(head_dim, 0)


def _batched(*args) -> bool:
    """Is any argument a ``torch.func`` (vmap, grad) wrapper?"""
    return any(isinstance(a, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(a) for a in args)


def _launch(op, launch, *args):
    """Call the custom op while ``torch.compile`` traces or under ``torch.func`` transforms (its vmap
    rule below), else the launch function itself (no dispatcher round trips)."""
    return (op if torch.compiler.is_compiling() or _batched(*args) else launch)(*args)


# vmap rules of the launches: the vmapped models become more heads (head dimensions counted without
# the vmap dimension), so several models' SSDs are one launch; an empty (unused) output stays unbatched.
@ssd_chunk_state.register_vmap
def _(info, in_dims, u, v, init, acum, dtT, prev, chunk_size, precision, reverse, tiles):
    n = info.batch_size
    args = [_fold_heads(t, d, n, h) for t, d, h in zip((u, v, init, acum, dtT, prev), in_dims[:6], (2, 2, 1, 1, 1, 2))]
    out, dots = ssd_chunk_state(*args, chunk_size, precision, reverse, tiles)
    return (_unfold_heads(out, n, 2), _unfold_heads(dots, n, 2) if reverse else dots), (0, 0 if reverse else None)


@ssd_chunk_attn.register_vmap
def _(
    info,
    in_dims,
    q,
    k,
    v,
    S,
    acum,
    dtT,
    w,
    cb,
    chunk_size,
    precision,
    reverse,
    out_heads,
    out_dtype,
    full_dot,
    dda,
    tiles,
):
    n = info.batch_size
    args = [
        _fold_heads(t, d, n, h)
        for t, d, h in zip((q, k, v, S, acum, dtT, w, cb), in_dims[:8], (2, 2, 2, 2, 1, 1, 2, 2))
    ]
    out, dot, full, dda_parts = ssd_chunk_attn(
        *args, chunk_size, precision, reverse, n * out_heads, out_dtype, full_dot, dda, tiles
    )
    rows = lambda t, on: (_unfold_heads(t, n, 1), 0) if on else (t, None)  # noqa: E731
    (dot, d_dim), (full, f_dim), (dda_parts, p_dim) = (
        rows(dot, w is not None),
        rows(full, full_dot),
        rows(dda_parts, dda),
    )
    return (_unfold_heads(out, n, 2), dot, full, dda_parts), (0, d_dim, f_dim, p_dim)


@ssd_chunk_dots.register_vmap
def _(info, in_dims, q, k, precision):
    n = info.batch_size
    return _unfold_heads(
        ssd_chunk_dots(_fold_heads(q, in_dims[0], n, 2), _fold_heads(k, in_dims[1], n, 2), precision), n, 2
    ), 0


def _chunk_state(u, v, init, acum, dtT, Q, prec, *, reverse, prev=None, tiles: list[int]):
    """``chunk_state``: the states ``(batch, nc + 1, H, DU, DV)`` and, in reverse, the per-``(batch,
    chunk, head)`` sums ``<out[c+1], exp(acum_last_c) prev[c]>`` ``(batch, nc, H)``."""
    out, dots = _launch(ssd_chunk_state, _chunk_state_launch, u, v, init, acum, dtT, prev, Q, prec, reverse, tiles)
    return out, (dots.sum(-1) if reverse else None)


def _chunk_attn(
    q,
    k,
    v,
    S,
    acum,
    dtT,
    Q,
    prec,
    *,
    reverse,
    out_heads,
    out_dtype,
    tiles: list[int],
    w=None,
    full_dot=False,
    cb=None,
    dda=False,
):
    """``chunk_attn`` (``_chunk_attn_launch``): the output, the row dots ``(dot or None, full or None)``
    and the intra-chunk decay gradient ``(batch, H, Lp)`` (``dda``, else ``None``).

    The launch gets its tiles resolved (rows, columns, warps, stages, heads per program), so a traced
    graph names the tiles its output shapes follow from: Inductor's on-disk cache, keyed on the graph,
    then never pairs a graph with output shapes from another version of the tile rules."""
    hpp, cfg, _ = _attn_outputs(q, v, acum, Q, out_heads, dda, tiles)
    tiles = [cfg["BT"], cfg["BC"], cfg["num_warps"], cfg["num_stages"], hpp]
    out, dot, full, dda_parts = _launch(
        ssd_chunk_attn,
        _chunk_attn_launch,
        q,
        k,
        v,
        S,
        acum,
        dtT,
        w,
        cb,
        Q,
        prec,
        reverse,
        out_heads,
        out_dtype,
        full_dot,
        dda,
        tiles,
    )
    return out, (dot if w is not None else None, full if full_dot else None), (dda_parts.sum(2) if dda else None)


def _chunk_dots(q: torch.Tensor, k: torch.Tensor, Q: int, prec: str) -> torch.Tensor:
    """``qk[b, c, g, t, s] = q_t . k_s`` inside each chunk, float32 ``(batch, nc, G, Q, Q)``."""
    batch, L, G, N = q.shape
    pad = (-L) % Q
    chunks = lambda t: F.pad(t.float(), (0, 0, 0, 0, 0, pad)).view(batch, -1, Q, G, N).transpose(2, 3)  # noqa: E731
    return _launch(ssd_chunk_dots, _chunk_dots_launch, chunks(q), chunks(k), prec)


def _forward(x, dt, A, B, C, initial_state, chunk_size: int, precision: str, tiles: list[int]):
    """Returns ``y (batch, L, H, P)`` (no ``D`` term) and the states entering every chunk and the
    final one, ``prev (batch, nc + 1, H, P, N)`` in the dtype of ``x`` (float32 inside the kernel).
    ``precision``: ``input_precision`` of the products (``_precision``)."""
    Q = chunk_size
    H = x.shape[2]
    dtT, acum = _decays(dt, A, Q)
    init = None if initial_state is None else initial_state.float()
    prev, _ = _chunk_state(x, B, init, acum, dtT, Q, precision, reverse=False, tiles=_state_tiles(tiles))
    y, _, _ = _chunk_attn(
        C,
        B,
        x,
        prev[:, :-1].transpose(-1, -2),
        acum,
        dtT,
        Q,
        precision,
        reverse=False,
        out_heads=H,
        out_dtype=x.dtype,
        cb=_chunk_dots(C, B, Q, precision),
        tiles=_attn_tiles(tiles, "fwd"),
    )
    return y, prev


def _in_chunks(t: torch.Tensor, Q: int) -> torch.Tensor:
    """``(batch, H, Lp)`` -> ``(batch, H, nc, Q)``."""
    return t.view(*t.shape[:2], -1, Q)


def _backward(dy, dfinal, x, dt, A, B, C, prev, chunk_size: int, precision: str, tiles: list[int]):
    """Gradients ``(dx, ddt, dA, dB, dC, dinitial_state)`` of ``_forward`` given ``dy`` and the
    gradient ``dfinal (batch, H, P, N)`` of the final state."""
    Q = chunk_size
    batch, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    dtT, acum = _decays(dt, A, Q)
    # G_0..G_nc, and the carried-state decay terms
    grads, carried = _chunk_state(
        dy, C, dfinal, acum, dtT, Q, precision, reverse=True, prev=prev, tiles=_state_tiles(tiles)
    )
    dS = grads[:, 1:]
    cb = _chunk_dots(C, B, Q, precision)
    dx, (x_state, ddt_direct), _ = _chunk_attn(
        B,
        C,
        dy,
        dS.transpose(-1, -2),
        acum,
        dtT,
        Q,
        precision,
        reverse=True,
        out_heads=H,
        out_dtype=x.dtype,
        w=x,
        full_dot=True,
        cb=cb.transpose(-1, -2),
        tiles=_attn_tiles(tiles, "dx"),
    )
    dB, _, _ = _chunk_attn(
        x,
        dy,
        C,
        dS,
        acum,
        dtT,
        Q,
        precision,
        reverse=True,
        out_heads=G,
        out_dtype=torch.float32,
        tiles=_attn_tiles(tiles, "db"),
    )
    dC, (dy_state, _), intra = _chunk_attn(
        dy,
        x,
        B,
        prev[:, :-1],
        acum,
        dtT,
        Q,
        precision,
        reverse=False,
        out_heads=G,
        out_dtype=torch.float32,
        w=C,
        cb=cb,
        dda=True,
        tiles=_attn_tiles(tiles, "dc"),
    )
    dB = dB.view(batch, L, G, -1, N).sum(3)
    dC = dC.view(batch, L, G, -1, N).sum(3)
    # d(dt * A): four sums of terms that do not cancel (module docstring)
    entering = _in_chunks(dy_state, Q).flip(-1).cumsum(-1).flip(-1)
    to_state = F.pad(_in_chunks(dtT * x_state, Q)[..., :-1], (1, 0)).cumsum(-1)
    dda = (entering + to_state + _in_chunks(intra, Q) + carried.transpose(1, 2)[..., None]).view(batch, H, -1)
    ddt = ddt_direct + dda * A.float()[:, None]
    dA = (dda * dtT).sum((0, 2))
    return (dx, ddt[:, :, :L].transpose(1, 2).to(dt.dtype), dA.to(A.dtype), dB.to(B.dtype), dC.to(C.dtype), grads[:, 0])


def _output_grads(x, prev, dy, dprev):
    """``dy`` and the final state's gradient, zeros where autograd passes none."""
    dy = torch.zeros_like(x) if dy is None else dy
    return dy, (torch.zeros_like(prev[:, -1]) if dprev is None else dprev[:, -1].to(prev.dtype))


class _Ssd(torch.autograd.Function):
    """The SSD's autograd: ``_forward`` and ``_backward`` (traced by ``torch.compile``, their launches
    through the custom ops). Under ``torch.func.vmap`` (several models' SSDs at once) the glue runs
    batched and each launch's vmap rule makes the models more heads."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, dt, A, B, C, initial_state, chunk_size, precision, tiles):
        return _forward(x, dt, A, B, C, initial_state, chunk_size, precision, tiles)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dt, A, B, C, initial_state, chunk_size, precision, tiles = inputs
        ctx.save_for_backward(x, dt, A, B, C, output[1])
        ctx.opts = (chunk_size, precision, tiles)
        ctx.init_dtype = None if initial_state is None else initial_state.dtype

    @staticmethod
    def backward(ctx, dy, dprev):
        x, dt, A, B, C, prev = ctx.saved_tensors
        dx, ddt, dA, dB, dC, dinit = _backward(*_output_grads(x, prev, dy, dprev), x, dt, A, B, C, prev, *ctx.opts)
        dinit = None if ctx.init_dtype is None else dinit.to(ctx.init_dtype)
        return dx, ddt, dA, dB, dC, dinit, None, None, None


def _check(x, dt, A, B, C, initial_state, chunk_size) -> None:
    if not triton_available(x):
        raise ValueError(f"ssd backend 'triton' needs a CUDA tensor or TRITON_INTERPRET=1, got a {x.device} tensor")
    if x.dtype not in DTYPES or B.dtype != x.dtype or C.dtype != x.dtype:
        raise TypeError(f"ssd triton: x, B, C must share one dtype of {DTYPES}, got {x.dtype}, {B.dtype}, {C.dtype}")
    if chunk_size not in (16, 32, 64, 128, 256):
        raise ValueError(f"ssd triton: chunk_size must be a power of two in [16, 256], got {chunk_size}")
    if x.shape[-1] > 256 or B.shape[-1] > 256:
        raise ValueError(f"ssd triton: head dim P={x.shape[-1]} and state N={B.shape[-1]} must be <= 256")
    if x.shape[1] == 0:
        raise ValueError("ssd triton: the sequence length must be >= 1")


def ssd_triton(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    *,
    tiles: SsdTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton SSD: ``(y (batch, L, H, P), final_state (batch, H, P, N))``; shapes as ``ssd_reference``;
    ``tiles``: ``SsdTiles`` (default: ``default_tiles(x.device)``, the set ``DEVICE_TILES`` names)."""
    _check(x, dt, A, B, C, initial_state, chunk_size)
    y, prev = _Ssd.apply(
        x, dt, A, B, C, initial_state, chunk_size, _precision(x.dtype), _tile_list(tiles or default_tiles(x.device))
    )
    return y, prev[:, -1].to(x.dtype)
