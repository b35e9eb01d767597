"""``python -m benchmarks.ops delta``: check, then time, the delta-rule family's implementations.

Members (``--ops``): ``delta`` (``delta_rule``, DeltaNet), ``gated`` (``gated_delta_rule``, Gated
DeltaNet), ``product`` (``delta_product`` with 2 Householder steps per token, DeltaProduct), ``dplr``
(``dplr_delta_rule``, RWKV-7's update); q and k l2-normalized in the op (``qk_l2norm``) as the mixers
call them, beta in [0, 2], log decays in [-1, 0] (RWKV-7's in (-e^-1/2, 0)). Implementations:

- ``ours-triton``: the fused recurrent Triton kernel (``seqkernels/delta/recurrent_kernels.py``), the
  input dtype, float32 arithmetic;
- ``ours-triton-chunk``: the chunkwise (WY) Triton kernels with the inter-chunk state
  recurrence on chip, outputs and gradients computed there too (``seqkernels/delta/chunk_kernels.py``,
  ``ChunkTiles(fused=True)``: paper 004's design), the input dtype, float32 arithmetic; ``dplr``: our
  per-chunk kernels around our inter-chunk scan (``dplr_chunk_kernels.py``, ``triton_dplr.py``);
- ``ours-triton-chunk-split``: the same kernels with the recurrence only carrying the state, every
  chunk's state stored and read back by per-chunk output and gradient kernels (the default tiles:
  paper 004's baseline; ``--chunk-tiles chunk=32,warps=8``: both with other launch parameters);
- ``ours-triton-chunk-rows``: the split kernels with ``I + A`` inverted row by row
  (``ChunkTiles(inverse="rows")``) instead of by 16 x 16 blocks (the diagonal ones together);
- ``ours-triton-chunk-bf16``: the split kernels with every product's operands rounded to bfloat16
  (``ChunkTiles(precision="bf16")``), the precision of fla's bfloat16 kernels, for the comparison at the
  same precision (without ``--chunk-tiles precision=...``), ``W``, ``U'`` and the states kept in bfloat16
  between kernels as fla keeps them; ``ours-triton-chunk-bf16-f32``: the same with them in float32;
- ``ours-chunk``: the chunkwise (WY) form in PyTorch (``seqkernels/delta/pytorch.py``; ``dplr``: its decays
  factored under RWKV-7's bound);
- ``fla``: fla-core's chunk kernels, computed in bfloat16; where fla refuses its own gated backward
  (Hopper, Triton 3.4-3.7.0, fla issue #640) its ``chunk_bwd_dqkwg`` is ``seqkernels/delta/fla_gated_bwd.py``'s
  Triton kernel (the default ``REGISTERED``; the note says which ran), and ``fla-torch-dqkwg`` the same with
  that file's PyTorch function;
- ``fla-recurrent``: fla's ``fused_recurrent_delta_rule`` (``delta`` and ``product`` only);
- ``fla-triton-unguarded`` (``gated``, only where fla refuses): fla's own Triton backward with the guard
  lifted, to measure what the guard protects against.

Every implementation is checked first, output and every input gradient, against the float64 chunk form
(the per-token loop for ``dplr``) on the first two sequences of the same (dtype-rounded) inputs. Limit:
every input read and the output written once (forward); three times that for forward + backward; over the
measured copy bandwidth. Sections: ``main`` (the state-tracking training shape in float32 and fla's own
benchmark shapes in bfloat16, the defaults of ``--shapes``) and, with ``--sweep``, ``crossover``:
lengths 64 to 4,096 for ``ours-triton`` and ``ours-triton-chunk`` against ``fla``: the crossover ``"auto"`` follows.
``--graph`` also times every implementation replayed from a CUDA graph (the graph engine's view: the
GPU's time without the host's launches), beside the eager time. ``--profile ours-triton-chunk,fla``
also logs those implementations' heaviest device kernels per call (``extra["kernels"]`` in the JSON);
for the split chunk kernels each with its physical limit, the bytes it reads and writes
(``chunk_kernel_bytes``) over the measured copy bandwidth, and its time as a multiple of that.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math

import torch
import torch.nn.functional as F

from benchmarks.ops.common import (
    Impl,
    Problem,
    cli_common,
    copy_bandwidth_gbs,
    environment,
    finish,
    fwd_bwd,
    grads,
    lift_fla_gated_guard,
    max_rel_error,
    no_grad,
    run,
    write_json,
)
from seqkernels import delta as kd
from seqkernels.delta import triton_chunk

log = logging.getLogger("benchmarks.ops.delta")
OPS = ("delta", "gated", "product", "dplr")
#: RWKV-7's lower bound on the log decay: the ``dplr`` inputs' decays lie above it, and every call is told it
DPLR_LOWER_BOUND = -math.exp(-0.5)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: (shape BxLxHxD, dtype, ops) of the main section: the state-tracking training batch in float32, fla's
#: benchmark shapes (B 8, T 2,048-8,192, H 16, D 64/128) in bfloat16, RWKV-7's dplr at the first of them
MAIN = [("256x128x4x16", "fp32", "product,gated,delta,dplr")] + [
    (f"8x{T}x16x{D}", "bf16", "gated,delta,dplr" if (T, D) == (2048, 64) else "gated,delta")
    for D in (64, 128)
    for T in (2048, 8192)
]
SWEEP = [(f"8x{T}x16x64", "bf16") for T in (256, 512, 1024, 2048, 4096)] + [
    (f"256x{T}x4x16", "fp32") for T in (64, 256, 1024, 4096)
]


def inputs(op: str, batch: int, L: int, H: int, D: int, dtype: torch.dtype, device: str, seed: int = 0):
    """The op's inputs in ``dtype`` (decays and gates in float32)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, device=device)  # noqa: E731
    lead = (batch, L, 2) if op == "product" else (batch, L)
    q, k, v, beta = r(batch, L, H, D), r(*lead, H, D), r(*lead, H, D), 2 * u(*lead, H)
    if op == "delta":
        xs = [q, k, v, beta]
    elif op == "gated":
        xs = [q, k, v, -u(batch, L, H), beta]
    elif op == "product":
        xs = [q, k, v, beta]
    else:
        kk = F.normalize(r(batch, L, H, D), dim=-1)
        xs = [q, 0.3 * k, v, -kk, kk * u(batch, L, H, D), DPLR_LOWER_BOUND * u(batch, L, H, D)]
    # q, k, v (and a, b) in the dtype; beta, g and RWKV-7's w stay float32
    return [x.to(dtype) if x.dim() >= 4 and not (op == "dplr" and i == len(xs) - 1) else x for i, x in enumerate(xs)]


def call_tiles(op: str, stages: int):
    """``fn(*inputs)`` running ``op`` on the fused recurrent kernel pipelined ``stages`` deep."""
    from seqkernels.delta import triton_ops

    tiles = triton_ops.RecurrentTiles(stages=stages)
    fn = {
        "delta": triton_ops.delta_rule,
        "gated": triton_ops.gated_delta_rule,
        "product": triton_ops.delta_product,
    }.get(op)
    if fn is None:
        return lambda *t: triton_ops.dplr_delta_rule(*t, tiles=tiles)
    return lambda *t: fn(*t, qk_l2norm=True, tiles=tiles)


def call(op: str, backend: str):
    """``fn(*inputs)`` running ``op`` on ``backend``."""
    if op == "delta":
        return lambda *t: kd.delta_rule(*t, qk_l2norm=True, backend=backend)
    if op == "gated":
        return lambda *t: kd.gated_delta_rule(*t, qk_l2norm=True, backend=backend)
    if op == "product":
        return lambda *t: kd.delta_product(*t, qk_l2norm=True, backend=backend)
    return lambda *t: kd.dplr_delta_rule(*t, lower_bound=DPLR_LOWER_BOUND, backend=backend)


def _dplr_bf16(*t):
    """``dplr_delta_rule(backend="triton_chunk")`` with bfloat16 products (``ScanTiles(precision="bf16")``)."""
    from seqkernels.delta import triton_dplr

    return triton_dplr.dplr_delta_rule(*t, lower_bound=DPLR_LOWER_BOUND, tiles=triton_dplr.ScanTiles(precision="bf16"))


def _chunk(op: str, tiles: triton_chunk.ChunkTiles):
    """``fn(*inputs)`` running ``op`` on the chunk kernels with ``tiles``."""
    fn = {
        "delta": triton_chunk.delta_rule,
        "gated": triton_chunk.gated_delta_rule,
        "product": triton_chunk.delta_product,
    }
    return lambda *t: fn[op](*t, qk_l2norm=True, tiles=tiles)


#: the chunk kernels' implementations: what each changes in the ``--chunk-tiles`` (``-bf16`` rows only where
#: those leave the precision to the default: fla's bfloat16 products, the same precision as its kernels)
CHUNK_IMPLS = {
    "ours-triton-chunk": {"fused": True},
    "ours-triton-chunk-split": {"fused": False},
    "ours-triton-chunk-rows": {"fused": False, "inverse": "rows"},
    "ours-triton-chunk-bf16": {"fused": False, "precision": "bf16"},
    "ours-triton-chunk-bf16-f32": {"fused": False, "precision": "bf16", "store": "fp32"},
}


def chunk_impl_tiles(name: str, tiles: triton_chunk.ChunkTiles) -> triton_chunk.ChunkTiles | None:
    """The ``ChunkTiles`` implementation ``name`` runs with, given ``--chunk-tiles`` ``tiles`` (``None``: not
    a chunk-kernel implementation, or a ``-bf16`` row where ``tiles`` chose a precision)."""
    changes = CHUNK_IMPLS.get(name)
    if changes is None or ("precision" in changes and tiles.precision is not None):
        return None
    return dataclasses.replace(tiles, **changes)


def chunk_kernel_bytes(op: str, batch: int, L: int, H: int, D: int, v_bytes: int, tiles) -> dict[str, int]:
    """Bytes each chunk kernel of the split form (``fused=False``) reads and writes in HBM for one forward +
    backward of ``op`` at this problem, as ``triton_chunk`` calls them with ``tiles`` (``ChunkTiles``): the
    tensors and intermediates each kernel touches, in the layout the kernels use (chunks padded to ``C``
    rows, keys and values to ``BK``, ``VP`` columns; tiles that a program per block of value columns reads
    counted once per block). ``q``, ``k`` come normalized (``qk_l2norm``) in float32, in bfloat16 with
    bfloat16 products; ``v``, ``o`` and ``do`` in the inputs' ``v_bytes`` per element; ``beta``, ``g`` and
    the gradients but ``dv`` in float32; ``W``, ``U'``, the states and their gradients in
    ``tiles.store_dtype``."""
    n = 2 if op == "product" else 1
    gated = op == "gated"
    Ts = L * n
    # bfloat16 products only where tiles ask for them (the default never does, for any inputs' dtype)
    C, BK, BV, VP, _, _, _, prec = tiles.resolve(Ts, D, D, torch.float32)
    kb, NV, NC = tiles.store_dtype(prec).itemsize, VP // BV, -(-Ts // C)
    qk_bytes = 2 if prec == "bf16" else 4
    q, k, v = batch * L * H * D * qk_bytes, batch * Ts * H * D * qk_bytes, batch * Ts * H * D * v_bytes
    dq, dk = batch * L * H * D * 4, batch * Ts * H * D * 4
    o = batch * L * H * D * v_bytes  # o and do: in the inputs' dtype
    s = batch * Ts * H * 4  # one per-step scalar (beta, g, dbeta, dg)
    g = s if gated else 0
    rows = batch * H * NC * C
    W, U, Tm, ck = rows * BK * kb, rows * VP * kb, rows * C * 4, batch * H * NC * BK * VP * kb
    dW, dG = rows * BK * 4, rows * 4
    return {
        "chunk_prep_kernel": k + v + s + g + W + U + Tm,
        "chunk_fwd_kernel": NV * (k + g + W) + U + U + ck,
        "chunk_out_kernel": q + k + g + U + ck + o,
        "chunk_bwd_state_kernel": NV * (q + k + g + W) + o + U + ck,
        "chunk_bwd_grads_kernel": 2 * ck + q + k + g + o + 2 * U + dq + dk + dW + dG,
        "chunk_bwd_prep_kernel": k + v + s + g + Tm + dW + U + dk + dG + dk + v + s + g,
    }


#: the ``ChunkTiles`` fields ``--chunk-tiles`` sets (``fused`` is what tells ``ours-triton-chunk`` from
#: ``-split``), and those of them that take a name rather than an int
TILE_FIELDS = tuple(f.name for f in dataclasses.fields(triton_chunk.ChunkTiles) if f.name != "fused")
TEXT_TILE_FIELDS = ("precision", "inverse", "store")


def chunk_tiles(text: str | None) -> triton_chunk.ChunkTiles:
    """``ChunkTiles`` from a list of its fields, e.g.
    ``"chunk=32,warps=4,bwd_warps=8,block_v=32,stages=2,precision=tf32,inverse=rows,store=bf16"``
    (``None``: defaults)."""
    if not text:
        return triton_chunk.ChunkTiles()
    kw = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in TILE_FIELDS:
            raise SystemExit(f"error: --chunk-tiles: unknown field {key!r}; valid: {', '.join(TILE_FIELDS)}")
        if key not in TEXT_TILE_FIELDS and not value.isdigit():
            raise SystemExit(f"error: --chunk-tiles: {key} must be a positive int, got {value!r}")
        kw[key] = value if key in TEXT_TILE_FIELDS else int(value)
    return triton_chunk.ChunkTiles(**kw)


@contextlib.contextmanager
def _fla_torch_dqkwg():
    """Where fla refuses its gated ``chunk_bwd_dqkwg``, ours runs as the PyTorch function, not the Triton kernel."""
    from seqkernels.delta import fla_gated_bwd

    saved, fla_gated_bwd.REGISTERED = fla_gated_bwd.REGISTERED, "torch"
    try:
        yield
    finally:
        fla_gated_bwd.REGISTERED = saved


@contextlib.contextmanager
def _fla_triton_unguarded():
    """fla's Triton ``chunk_bwd_dqkwg`` runs even where fla refuses it (``lift_fla_gated_guard``)."""
    restore = lift_fla_gated_guard()
    try:
        yield
    finally:
        restore()


def implementations(
    op: str,
    names: set[str] | None = None,
    stages: tuple[int, ...] = (),
    tiles: triton_chunk.ChunkTiles | None = None,
) -> dict:
    """name -> (``fn(*inputs)``, context manager factory, note) for ``op`` (``names``: only these;
    ``stages``: also ``ours-triton-sN``, the recurrent kernel pipelined ``N`` deep; ``tiles``: the chunk
    kernels' launch parameters, default ``ChunkTiles()``)."""
    impls = {"ours-triton": (call(op, "triton"), contextlib.nullcontext, "fused recurrent")}
    for n in stages:
        impls[f"ours-triton-s{n}"] = (call_tiles(op, n), contextlib.nullcontext, f"loads pipelined {n} deep")
    if op != "dplr":
        tiles = tiles or triton_chunk.ChunkTiles()
        fields = dataclasses.fields(tiles)
        named = ", ".join(f"{f.name}={getattr(tiles, f.name)}" for f in fields if getattr(tiles, f.name) != f.default)
        notes = {
            "ours-triton-chunk": f"chunkwise, state on chip {named}".strip(),
            "ours-triton-chunk-split": f"chunkwise, states via HBM {named}".strip(),
            "ours-triton-chunk-rows": f"split, I + A row by row {named}".strip(),
            "ours-triton-chunk-bf16": "split, bfloat16 products (fla's)",
            "ours-triton-chunk-bf16-f32": "split, bfloat16 products, float32 intermediates",
        }
        for name, note in notes.items():
            impl_tiles = chunk_impl_tiles(name, tiles)
            if impl_tiles is not None:
                impls[name] = (_chunk(op, impl_tiles), contextlib.nullcontext, note)
    else:
        impls["ours-triton-chunk"] = (call(op, "triton_chunk"), contextlib.nullcontext, "fused chunk kernels, scan")
        impls["ours-triton-chunk-bf16"] = (_dplr_bf16, contextlib.nullcontext, "the same, bfloat16 products (fla's)")
    impls["ours-chunk"] = (call(op, "chunk"), contextlib.nullcontext, "")
    if kd.fla_available():
        from seqkernels.delta import fla_gated_bwd

        refused = op == "gated" and fla_gated_bwd.triton_refuses()
        note = "backward: our Triton chunk_bwd_dqkwg (fla refuses its own here)" if refused else "fla's Triton backward"
        impls["fla"] = (call(op, "fla"), contextlib.nullcontext, note)
        if op in ("delta", "product"):
            impls["fla-recurrent"] = (call(op, "fla_recurrent"), contextlib.nullcontext, "")
        if refused:
            torch_bwd = "backward: our PyTorch chunk_bwd_dqkwg"
            impls["fla-torch-dqkwg"] = (call(op, "fla"), _fla_torch_dqkwg, torch_bwd)
            unguarded = (call(op, "fla"), _fla_triton_unguarded, "fla's guard lifted (issue #640)")
            impls["fla-triton-unguarded"] = unguarded
    keep = lambda k: names is None or k in names or k.startswith("ours-triton-s")  # noqa: E731
    return {k: v for k, v in impls.items() if keep(k)}


def problem(op, batch, L, H, D, dtype_name, impls, bw_gbs, section="main", device="cuda", tiles=None) -> Problem:
    dtype = DTYPES[dtype_name]
    n = 2 if op == "product" else 1
    per_token = {"delta": 2 * D + n * (2 * D), "gated": 4 * D, "product": D + n * 2 * D, "dplr": 6 * D}[op]
    nbytes = dtype.itemsize * batch * L * H * per_token + 4 * batch * L * H * n  # + beta/g in f32
    limits = {"fwd": nbytes / (bw_gbs * 1e9) * 1e3, "fwd+bwd": 3 * nbytes / (bw_gbs * 1e9) * 1e3}
    dims = {"kind": op, "batch": batch, "length": L, "heads": H, "head_dim": D}

    def kernel_limits(name: str) -> dict[str, float]:
        impl_tiles = chunk_impl_tiles(name, tiles or triton_chunk.ChunkTiles())
        if impl_tiles is None or impl_tiles.fused:
            return {}
        kernel_bytes = chunk_kernel_bytes(op, batch, L, H, D, dtype.itemsize, impl_tiles)
        return {kernel: b / (bw_gbs * 1e9) * 1e3 for kernel, b in kernel_bytes.items()}

    pb = Problem("delta", dims, dtype_name, None, limits, section, None if op == "dplr" else kernel_limits)

    def build():
        xs = inputs(op, batch, L, H, D, dtype, device)
        small = [t[:2] for t in xs]
        dy = torch.randn(batch, L, H, D, device=device, dtype=dtype)
        dy_small = dy[:2]
        ref_backend = "reference" if op == "dplr" else "chunk"
        ref = grads(call(op, ref_backend), [t.double() for t in small], dy_small.double())
        out = []
        for name, (fn, context, note) in impls.items():

            def check(fn=fn, context=context):
                with context():
                    fwd_bwd(fn, xs, dy)()  # once at the timed shape first: fla autotunes for it
                    return max_rel_error(grads(fn, small, dy_small), ref)

            def timed(thunk, context=context):
                def run_it():
                    with context():
                        return thunk()

                return run_it

            out.append(Impl(name, timed(no_grad(fn, *xs)), timed(fwd_bwd(fn, xs, dy)), check, note))
        return out

    pb.impls = build
    return pb


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops delta", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--shapes",
        default=None,
        help="BxLxHxD:DTYPE:OPS items separated by ';' (default: the main section, module docstring)",
    )
    ap.add_argument("--impls", default=None, help="comma-separated implementation names (default: all)")
    ap.add_argument(
        "--sweep", action="store_true", help="add the crossover section (ours-triton, ours-triton-chunk against fla)"
    )
    ap.add_argument("--no-main", action="store_true", help="skip the main section")
    ap.add_argument(
        "--graph",
        action="store_true",
        help="also time every implementation replayed from a CUDA graph (the training engine's view, no host)",
    )
    ap.add_argument(
        "--profile",
        default="",
        metavar="PREFIXES",
        help="comma-separated implementation-name prefixes (e.g. ours-triton-chunk,fla): also log and store "
        "each one's heaviest device kernels per call (torch.profiler)",
    )
    ap.add_argument(
        "--stages",
        default="",
        help="comma-separated pipelining depths: also time ours-triton-sN with RecurrentTiles(stages=N)",
    )
    ap.add_argument(
        "--chunk-tiles",
        default=None,
        help=f"ours-triton-chunk(-split)'s ChunkTiles, e.g. chunk=32,warps=8 (fields: {', '.join(TILE_FIELDS)})",
    )
    cli_common(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        raise SystemExit("error: the delta benchmark needs a CUDA GPU")
    names = None if args.impls is None else set(args.impls.split(","))
    stages = tuple(int(n) for n in args.stages.split(",") if n)
    tiles = chunk_tiles(args.chunk_tiles)
    main_items = MAIN if args.shapes is None else [tuple(item.split(":")) for item in args.shapes.split(";") if item]
    bw = copy_bandwidth_gbs("cuda")
    env = environment("cuda")
    env.update(copy_gbs=bw)
    problems = []
    for shape, dtype_name, ops in [] if args.no_main else main_items:
        for op in ops.split(","):
            if op not in OPS:
                raise SystemExit(f"error: unknown op {op!r}; valid: {', '.join(OPS)}")
            dims = tuple(int(v) for v in shape.split("x"))
            impls = implementations(op, names, stages, tiles)
            problems.append(problem(op, *dims, dtype_name, impls, bw, tiles=tiles))
    if args.sweep:
        sweep_names = {"ours-triton", "ours-triton-chunk", "ours-triton-chunk-split", "ours-triton-chunk-rows", "fla"}
        sweep_impls = implementations("gated", sweep_names, tiles=tiles)
        for shape, dtype_name in SWEEP:
            dims = tuple(int(v) for v in shape.split("x"))
            problems.append(problem("gated", *dims, dtype_name, sweep_impls, bw, section="crossover", tiles=tiles))
    rows = run(
        problems,
        warm_only=args.warm_only,
        log=log.info,
        checkpoint=lambda rows: write_json("delta", rows, env, args.out),
        graph=args.graph,
        profile=(lambda name: any(name.startswith(p) for p in args.profile.split(","))) if args.profile else None,
    )
    finish("delta", rows, env, args, baseline="ours-triton")


if __name__ == "__main__":
    main()
