"""``python -m benchmarks.ops compile [--families scan,mlstm] [--arch 90] [...]``: the compile report.

Compiles Triton kernels for ``sm_<arch>`` with Triton's bundled ``ptxas``, without a GPU or a
driver, exactly with the launch configuration the families pick on CUDA, and prints per kernel:
registers per thread, spilled bytes, shared memory, and the asynchronous copies (loads the software
pipeliner moved to shared memory; 0: not pipelined). Exits 1 when a kernel does not compile or needs
more shared memory than the device has minus ``--headroom``. The counts are those of the installed
Triton, which can differ from the GPU's: the delta backward walk (float32 operands, chunks of 64, head
dims padded to 128, 2 stages) counts 180,480 bytes here under Triton 3.9 (gated) and asked for 245,760
under Triton 3.6 on an H100 (ungated, keys 80, values 72).

- ``scan``: the chunk-loop and look-back kernels (forward and backward, diagonal and 2x2) with the
  default tiles at ``--scan-shapes`` (``B,L,D``), or ``--scan-tiles`` (``kind,ch,bd,warps[,stages]``);
- ``mlstm``: every TFLA forward / backward kernel for ``--mlstm-dtype``, chunk sizes ``--mlstm-chunks``,
  ``DQK = --mlstm-dqk``, ``DV = --mlstm-dv``, both gates, at ``--matmul-precision``;
- ``delta``: the recurrent, chunk and ``chunk_bwd_dqkwg`` kernels at ``--delta-shapes`` (``DTYPE,T,D``)
  with the default tiles, or the chunk kernels' ``--delta-tiles`` (as ``delta``'s ``--chunk-tiles``:
  ``precision=bf16`` compiles them with bfloat16 products and intermediates); the chunk kernels as the
  mixers call them, ``q`` and ``k`` normalized in float32 (``delta_kernels``); and RWKV-7's DPLR kernels
  at the same shapes under its decay bound: the inter-chunk scan and the fused per-chunk kernels
  (``dplr_kernels``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile the real kernels (read when the kernels are decorated)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
_TY = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def compile_kernel(kernel, args: dict, arch: int):
    """``kernel`` compiled for ``sm_<arch>``. ``args``: argument name -> type string (``*fp32``, ``i32``,
    ``fp32``), ``None`` (an argument passed as ``None``: a constexpr) or, for constexprs and the launch
    options ``num_warps`` / ``num_stages`` / ``maxnreg``, the value."""
    args = dict(args)
    opts = {k: args.pop(k) for k in ("num_warps", "num_stages", "maxnreg") if k in args and args[k] is not None}
    args.pop("maxnreg", None)
    const_names = {kernel.arg_names[i] for i in kernel.constexprs} | {n for n, v in args.items() if v is None}
    sig = {n: ("constexpr" if n in const_names else args[n]) for n in kernel.arg_names}
    const = {n: args[n] for n in kernel.arg_names if n in const_names}
    return triton.compile(
        ASTSource(fn=kernel, signature=sig, constexprs=const), target=GPUTarget("cuda", arch, 32), options=opts
    )


def describe(compiled) -> dict:
    """``regs`` (per thread), ``spill`` (bytes of local memory per thread), ``smem`` (bytes), ``async``."""
    out = {
        "regs": getattr(compiled, "n_regs", None),
        "spill": getattr(compiled, "n_spills", None),
        "smem": compiled.metadata.shared,
        "async": compiled.asm["ttgir"].count("async_copy_global_to_local"),
    }
    if out["regs"] is None:  # not loaded on a device: ask cuobjdump
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
        out["regs"], out["spill"] = (int(m.group(1)), int(m.group(2)) + int(m.group(3))) if m else (None, None)
    return out


def scan_kernels(shapes, tiles):
    """``(name, kernel, args)`` of the scan launches: default tiles per shape, or the given tiles."""
    from seqkernels.scan import triton_ops as ts

    ptrs = {n: "*fp32" for n in ("c_ptr", "x_ptr", "out_ptr")}
    cases = []
    for B, L, D in shapes:
        for block2 in (False, True):
            for grad in (False, True):
                cases.append((D, block2, grad, tiles or ts.default_tiles(B, L, D, block2, grad)))
    out = []
    for D, block2, grad, t in cases:
        kernel, _, _, meta, words, _ = ts._plan(1, 64, D, grad, grad, block2, t)
        # the forward passes None for yfwd and dc (constexpr)
        runtime = dict(yfwd_ptr="*fp32", dc_ptr="*fp32") if grad else dict(yfwd_ptr=None, dc_ptr=None)
        if words:
            runtime["ws_ptr"] = "*i64"
        runtime.update(L="i32", D="i32", n_dt="i32")
        name = f"scan {'2x2' if block2 else 'diag'} {'bwd' if grad else 'fwd'} D={D} {t.kind} {t.ch}x{t.bd}/{t.warps}"
        out.append((name, kernel, {**ptrs, **runtime, **meta}))
    return out


def mlstm_kernels(dtype: torch.dtype, L: int, DQK: int, DV: int, exp_gate: bool):
    """``(name, kernel, args)`` of every kernel of one mLSTM forward + backward on CUDA."""
    from seqkernels.mlstm import bwd_kernels, fwd_kernels
    from seqkernels.mlstm import triton_ops as tc

    prec = tc._precision(dtype)
    tiles = tc.default_tiles(dtype, prec)
    cfg = tc._config(L, DQK, DV, tiles)
    t, acc, st = "*" + _TY[dtype], "*fp32", "*" + _TY[tc._state_dtype(dtype, tiles)]
    shape = dict(DQK=DQK, DV=DV, L=L)
    inter = dict(shape, BK=cfg["BKI"], BV=cfg["BVI"], BL=cfg["BL"], EXP=exp_gate, PREC=prec, num_warps=cfg["WI"])
    intra = dict(
        shape,
        BLQ=cfg["BLQ"],
        BLKV=cfg["BLKV"],
        BK=cfg["BK"],
        BV=cfg["BV"],
        EXP=exp_gate,
        PREC=prec,
        num_warps=cfg["W"],
        num_stages=cfg["ST"],
    )
    qk = dict(intra, BV=cfg["BVDP"])
    gate = "exp" if exp_gate else "sig"
    return [
        (f"mlstm {gate} L={L} {name}", kernel, args)
        for name, kernel, args in [
            (
                "fwd inter_chunk_states",
                fwd_kernels.inter_chunk_states,
                dict(
                    inter,
                    k_ptr=t,
                    v_ptr=t,
                    a_ptr=acc,
                    g_ptr=acc,
                    amax_ptr=acc,
                    c0_ptr=acc,
                    n0_ptr=acc,
                    m0_ptr=acc,
                    cst_ptr=st,
                    nst_ptr=acc,
                    mst_ptr=acc,
                    clast_ptr=acc,
                    S="i32",
                    NC="i32",
                    chunk="i32",
                    HAS_INIT=True,
                    FUSED=True,
                ),
            ),
            (
                "fwd intra_chunk_h",
                fwd_kernels.intra_chunk_h,
                dict(
                    intra,
                    q_ptr=t,
                    k_ptr=t,
                    v_ptr=t,
                    b_ptr=acc,
                    li_ptr=acc,
                    cst_ptr=st,
                    nst_ptr=acc,
                    mst_ptr=acc,
                    h_ptr=t,
                    mtok_ptr=acc,
                    dtok_ptr=acc,
                    S="i32",
                    NC="i32",
                    scale="fp32",
                    eps="fp32",
                ),
            ),
            (
                "bwd inter_chunk_dstates",
                bwd_kernels.inter_chunk_dstates,
                dict(
                    inter,
                    q_ptr=t,
                    dh_ptr=t,
                    b_ptr=acc,
                    g_ptr=acc,
                    mtok_ptr=acc,
                    inv_ptr=acc,
                    dd_ptr=acc,
                    mst_ptr=acc,
                    dcl_ptr=acc,
                    dnl_ptr=acc,
                    dcst_ptr=st,
                    dnst_ptr=acc,
                    dc0_ptr=acc,
                    S="i32",
                    NC="i32",
                    scale="fp32",
                    HAS_DLAST=True,
                ),
            ),
            (
                "bwd intra_chunk_dq",
                bwd_kernels.intra_chunk_dq,
                dict(
                    qk,
                    q_ptr=t,
                    k_ptr=t,
                    v_ptr=t,
                    dh_ptr=t,
                    b_ptr=acc,
                    li_ptr=acc,
                    mtok_ptr=acc,
                    inv_ptr=acc,
                    dd_ptr=acc,
                    cst_ptr=st,
                    nst_ptr=acc,
                    mst_ptr=acc,
                    dq_ptr=t,
                    qdq_ptr=acc,
                    S="i32",
                    NC="i32",
                    scale="fp32",
                ),
            ),
            (
                "bwd intra_chunk_dk",
                bwd_kernels.intra_chunk_dk,
                dict(
                    qk,
                    q_ptr=t,
                    k_ptr=t,
                    v_ptr=t,
                    dh_ptr=t,
                    b_ptr=acc,
                    li_ptr=acc,
                    a_ptr=acc,
                    mtok_ptr=acc,
                    inv_ptr=acc,
                    dd_ptr=acc,
                    dcst_ptr=st,
                    dnst_ptr=acc,
                    mst_ptr=acc,
                    dk_ptr=t,
                    kdk_ptr=acc,
                    S="i32",
                    NC="i32",
                    scale="fp32",
                ),
            ),
            (
                "bwd intra_chunk_dv",
                bwd_kernels.intra_chunk_dv,
                dict(
                    intra,
                    q_ptr=t,
                    k_ptr=t,
                    dh_ptr=t,
                    b_ptr=acc,
                    li_ptr=acc,
                    a_ptr=acc,
                    mtok_ptr=acc,
                    inv_ptr=acc,
                    dcst_ptr=st,
                    mst_ptr=acc,
                    dv_ptr=t,
                    S="i32",
                    NC="i32",
                    scale="fp32",
                ),
            ),
        ]
    ]


#: scalar arguments of the delta kernels; every other non-constexpr argument is a pointer
_DELTA_SCALARS = {"B": "i32", "T": "i32", "H": "i32", "scale": "fp32"}
#: pointers in the inputs' dtype (the rest are float32 unless given)
_DELTA_INPUT_DTYPE = {"q", "k", "v", "o", "do", "a", "b", "w"}
#: the chunk kernels' intermediates, typed by ``ChunkTiles.store``
_KEPT = {"Wm", "Um", "ckpt", "dckpt", "dUm"}


def _delta_args(kernel, dtype: torch.dtype, typed=_DELTA_INPUT_DTYPE, types=None, **constexprs) -> dict:
    """``compile_kernel`` arguments for a delta kernel: its scalars, the pointers named in ``types`` (name ->
    type) of that type, the others ``typed`` in ``dtype`` or float32, and ``constexprs`` (launch options
    included)."""
    names = [n for n in kernel.arg_names if n not in constexprs]
    ptr = {n: "*" + _TY[dtype] for n in typed} | (types or {})
    return {n: _DELTA_SCALARS.get(n, ptr.get(n, "*fp32")) for n in names} | constexprs


def delta_kernels(dtype: torch.dtype, T: int, D: int, tiles=None):
    """``(name, kernel, args)`` of the delta family's kernels at head dim ``D`` (keys and values) and ``T``
    steps: the recurrent forward and backward (gated product, 2 steps per token), the chunk kernels (split
    default, on chip, the row inverse) with ``tiles`` (a ``ChunkTiles``; default ``ChunkTiles()``) as the
    mixers call them (``qk_l2norm``: ``q``, ``k`` in float32, bfloat16 with bfloat16 products, ``v``, ``o``,
    ``do`` in ``dtype``), and ``chunk_bwd_dqkwg``'s kernel."""
    from seqkernels._triton import next_pow2
    from seqkernels.delta import chunk_kernels as ck
    from seqkernels.delta import recurrent_kernels as rk
    from seqkernels.delta import triton_ops
    from seqkernels.delta.dqkwg_kernel import dqkwg_kernel
    from seqkernels.delta.triton_chunk import ChunkTiles, _meta

    meta_q = torch.empty(1, T, 1, D, device="meta")
    _, _, _, rec = triton_ops._launch(meta_q, meta_q, meta_q, 2, None)
    # the chunk kernels' constexprs and launch options as triton_chunk launches them
    chunk_q, chunk_g = torch.empty(1, T, 1, D, device="meta", dtype=dtype), torch.empty(1, T, 1, device="meta")
    _, _, tiles, prep, blocks, _ = _meta(chunk_q, chunk_q, chunk_q, chunk_g, 1, tiles or ChunkTiles())
    _, _, _, bwd_prep, bwd_blocks, own = _meta(chunk_q, chunk_q, chunk_q, chunk_g, 1, tiles, backward=True)
    # as the mixers call them (qk_l2norm): q, k normalized in float32 (bfloat16 with bfloat16 products);
    # the default precision, v, dv, o and do those of the inputs' dtype; the intermediates in the kept dtype
    prec = prep["PREC"]
    kept = "*" + _TY[tiles.store_dtype(prec)]
    types = {n: kept for n in _KEPT} | dict.fromkeys(("q", "k"), "*bf16" if prec == "bf16" else "*fp32")
    ptrs = dict(typed={"v", "dv", "o", "do"}, types=types)
    prep, blocks, bwd_prep, bwd_blocks = (dict(m, **ptrs) for m in (prep, blocks, bwd_prep, bwd_blocks))
    walk, grads = (dict(own[n], **ptrs) for n in ("walk", "grads"))
    dq_bk = max(16, next_pow2(D))
    dqkwg = dict(H=1, HV=1, K=D, V=D, BT=64, BK=dq_bk, BV=min(max(16, next_pow2(D)), 32), HAS_W=True)
    dqkwg.update(STATE_V_FIRST=False, num_warps=4 if dq_bk <= 16 else 8)
    cases = [
        ("recurrent fwd", rk.delta_recurrent_fwd_kernel, dict(rec, SAVE=True)),
        ("recurrent bwd", rk.delta_recurrent_bwd_kernel, rec),
        ("chunk prep", ck.chunk_prep_kernel, dict(prep, INVERSE=tiles.inverse)),
        ("chunk prep, row inverse", ck.chunk_prep_kernel, dict(prep, INVERSE="rows")),
        ("chunk fwd (split)", ck.chunk_fwd_kernel, dict(blocks, OUT=False, SAVE=True)),
        ("chunk fwd (on chip)", ck.chunk_fwd_kernel, dict(blocks, OUT=True, SAVE=True)),
        ("chunk out", ck.chunk_out_kernel, blocks),
        ("chunk bwd state (split)", ck.chunk_bwd_state_kernel, dict(walk, GRADS=False)),
        ("chunk bwd state (on chip)", ck.chunk_bwd_state_kernel, dict(bwd_blocks, GRADS=True)),
        ("chunk bwd grads", ck.chunk_bwd_grads_kernel, grads),
        ("chunk bwd prep", ck.chunk_bwd_prep_kernel, bwd_prep),
        ("fla chunk_bwd_dqkwg", dqkwg_kernel, dict(dqkwg, typed={"q", "k", "v", "do", "h", "dh", "w", "dv", "dw"})),
    ]
    dt = _TY[dtype]
    return [(f"delta {dt} T={T} D={D} {name}", kernel, _delta_args(kernel, dtype, **c)) for name, kernel, c in cases]


def dplr_kernels(dtype: torch.dtype, T: int, D: int, precision: str | None = None):
    """``(name, kernel, args)`` of RWKV-7's DPLR chunk kernels at head dim ``D`` and ``T`` steps under its decay
    bound, as ``triton_dplr`` launches them with the default tiles at ``precision`` (``ScanTiles``): the
    inter-chunk scan, forward and backward, and (heads up to ``FUSED_MAX_HEAD_DIM``) the fused per-chunk
    kernels, inputs in ``dtype``."""
    from benchmarks.ops.delta import DPLR_LOWER_BOUND
    from seqkernels.delta import dplr_chunk_kernels as dk
    from seqkernels.delta import dplr_scan_kernels as sk
    from seqkernels.delta import triton_dplr as td

    C = td.fused_chunk(D, DPLR_LOWER_BOUND, None)
    W, tiles = torch.empty(1, 1, C, D, device="meta"), td.ScanTiles(precision=precision)
    (_, scan), (scan_blocks, scan_bwd) = td._meta(W, D, tiles), td._meta(W, D, tiles, backward=True)
    fused = D <= td.FUSED_MAX_HEAD_DIM  # the fused path's backward forms the state's output gradient on chip
    scan_bwd = dict(scan_bwd, OUT_ROWS=fused)
    cases = [("dplr scan fwd", sk.dplr_scan_fwd_kernel, scan), ("dplr scan bwd", sk.dplr_scan_bwd_kernel, scan_bwd)]
    state = torch.float32  # the saved states' dtype: bfloat16 under bf16 products on the fused path
    if fused:
        q = torch.empty(1, T, 1, D, device="meta", dtype=dtype)
        geometry = td._chunk_meta(q, q, C, tiles)
        state, meta = td.state_dtype(geometry), geometry[-1]
        cases += [
            ("dplr chunk prep", dk.dplr_prep_kernel, meta),
            ("dplr chunk out", dk.dplr_out_kernel, meta),
            ("dplr chunk out bwd", dk.dplr_out_bwd_kernel, meta),
            ("dplr chunk prep bwd", dk.dplr_prep_bwd_kernel, dict(meta, NS=scan_blocks)),
        ]
    dt = _TY[dtype]
    types = dict.fromkeys(("NC", "K", "V", "BH", "PART", "L", "s_b", "s_h", "s_t"), "i32") | {"M_in": "*" + _TY[state]}
    return [
        (f"dplr {dt} T={T} D={D} C={C} {name}", kernel, _delta_args(kernel, dtype, types=types, **c))
        for name, kernel, c in cases
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops compile", description=__doc__.splitlines()[0])
    p.add_argument("--families", default="scan,mlstm,delta")
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--headroom", type=float, default=0.10, help="shared-memory headroom below the device limit")
    p.add_argument("--scan-shapes", default="8,4096,1024;1,65536,256;8,4096,512")
    p.add_argument("--scan-tiles", default="", help="kind,ch,bd,warps[,stages] instead of the default tiles")
    p.add_argument("--mlstm-dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--mlstm-chunks", default="64,128")
    p.add_argument("--mlstm-dqk", type=int, default=128)
    p.add_argument("--mlstm-dv", type=int, default=256)
    p.add_argument("--matmul-precision", default="high", choices=["high", "medium", "highest"])
    p.add_argument("--delta-shapes", default="bf16,2048,64;bf16,2048,128;fp32,128,16", help="DTYPE,T,D items")
    p.add_argument("--delta-tiles", default="", help="the chunk kernels' ChunkTiles, as --chunk-tiles of `delta`")
    a = p.parse_args(argv)
    torch.set_float32_matmul_precision(a.matmul_precision)
    budget = int(SMEM_LIMIT.get(a.arch, 232448) * (1 - a.headroom))
    print(f"triton {triton.__version__}, sm_{a.arch}, shared-memory budget {budget} B")
    kernels = []
    families = a.families.split(",")
    if "scan" in families:
        from seqkernels.scan.triton_ops import ScanTiles

        tiles = None
        if a.scan_tiles:
            kind, *nums = a.scan_tiles.split(",")
            tiles = ScanTiles(kind, *map(int, nums))
        shapes = [tuple(map(int, s.split(","))) for s in a.scan_shapes.split(";")]
        kernels += scan_kernels(shapes, tiles)
    if "mlstm" in families:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.mlstm_dtype]
        for exp_gate in (True, False):
            for L in map(int, a.mlstm_chunks.split(",")):
                kernels += mlstm_kernels(dtype, L, a.mlstm_dqk, a.mlstm_dv, exp_gate)
    if "delta" in families:
        from benchmarks.ops.delta import chunk_tiles

        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        for item in a.delta_shapes.split(";"):
            dt, T, D = item.split(",")
            kernels += delta_kernels(dtypes[dt], int(T), int(D), chunk_tiles(a.delta_tiles))
            kernels += dplr_kernels(dtypes[dt], int(T), int(D), chunk_tiles(a.delta_tiles).precision)
    bad = 0
    for name, kernel, args in kernels:
        try:
            info = describe(compile_kernel(kernel, args, a.arch))
        except Exception as err:  # noqa: BLE001 - report and go on
            print(f"{name:48s} COMPILE ERROR {type(err).__name__}: {err}"[:300])
            bad += 1
            continue
        over = info["smem"] > budget
        bad += over
        print(f"{name:48s} " + " ".join(f"{k}={v}" for k, v in info.items()) + (" OVER BUDGET" if over else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
