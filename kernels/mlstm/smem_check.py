"""Shared memory of the mLSTM Triton kernels, compiled for a GPU target without a GPU.

``python -m kernels.mlstm.smem_check [--dtype fp32|bf16] [--chunks 64,128] [--dqk 128] [--dv 256]
[--arch 90] [--matmul-precision high|medium|highest]`` compiles every forward/backward kernel (mLSTMexp and mLSTMsig) with exactly the
launch configuration ``triton_chunkwise`` would pick on CUDA (``_config``, ``_precision``,
``_bwd_qk_config``) for ``sm_<arch>`` and prints ``metadata.shared`` per kernel
against the device limit (232,448 bytes = 227 KiB on the H100/H200). Needs only Triton's CUDA
backend (ptxas ships with the wheel), not a driver or a GPU. Exits 1 if a kernel exceeds the budget
(the limit minus ``--headroom``, default 10%, since another Triton version may allocate a little
differently).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # compile the real kernels (read when the kernels are decorated)

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.mlstm import triton_bwd, triton_fwd
from kernels.mlstm import triton_chunkwise as tc

SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}

_TY = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _compile(kernel, args: dict, arch: int):
    """``args``: kernel argument name -> type string (``*fp32``, ``i32``, ``fp32``) or, for
    constexprs and launch options (``num_warps``, ``num_stages``), the value."""
    fn = kernel
    opts = {k: args.pop(k) for k in ("num_warps", "num_stages") if k in args}
    sig, const = {}, {}
    for name in fn.arg_names:
        val = args[name]
        if name in _constexpr_names(fn):
            sig[name] = "constexpr"
            const[name] = val
        else:
            sig[name] = val
    src = ASTSource(fn=kernel, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)


def _constexpr_names(fn):
    return {fn.arg_names[i] for i in fn.constexprs}


def kernel_args(dtype: torch.dtype, L: int, DQK: int, DV: int, exp_gate: bool):
    """(name, kernel, args) for every kernel launch of one forward + backward on CUDA."""
    prec = tc._precision(dtype)
    cfg = tc._config(L, DQK, DV, dtype, prec)
    t, acc = "*" + _TY[dtype], "*fp32"
    shape = dict(DQK=DQK, DV=DV, L=L)
    inter = dict(shape, BK=cfg["BKI"], BV=cfg["BVI"], BL=cfg["BL"], EXP=exp_gate, PREC=prec, num_warps=cfg["WI"])
    intra = dict(shape, BLQ=cfg["BLQ"], BLKV=cfg["BLKV"], BK=cfg["BK"], BV=cfg["BV"], EXP=exp_gate,
                 PREC=prec, num_warps=cfg["W"], num_stages=cfg["ST"])
    qk = dict(intra, **tc._bwd_qk_config(cfg, prec))
    out = [
        ("fwd inter_chunk_states", triton_fwd.inter_chunk_states,
         dict(inter, k_ptr=t, v_ptr=t, a_ptr=acc, g_ptr=acc, amax_ptr=acc, c0_ptr=acc, n0_ptr=acc, m0_ptr=acc,
              cst_ptr=acc, nst_ptr=acc, mst_ptr=acc, S="i32", NC="i32", chunk="i32", HAS_INIT=True,
              FUSED=True)),
        ("fwd intra_chunk_h", triton_fwd.intra_chunk_h,
         dict(intra, q_ptr=t, k_ptr=t, v_ptr=t, b_ptr=acc, li_ptr=acc, cst_ptr=acc, nst_ptr=acc, mst_ptr=acc,
              h_ptr=t, mtok_ptr=acc, dtok_ptr=acc, S="i32", NC="i32", scale="fp32", eps="fp32")),
        ("bwd inter_chunk_dstates", triton_bwd.inter_chunk_dstates,
         dict(inter, q_ptr=t, dh_ptr=t, b_ptr=acc, g_ptr=acc, mtok_ptr=acc, inv_ptr=acc, dd_ptr=acc, mst_ptr=acc,
              dcl_ptr=acc, dnl_ptr=acc, dcst_ptr=acc, dnst_ptr=acc, S="i32", NC="i32", scale="fp32",
              HAS_DLAST=True)),
        ("bwd intra_chunk_dq", triton_bwd.intra_chunk_dq,
         dict(qk, q_ptr=t, k_ptr=t, v_ptr=t, dh_ptr=t, b_ptr=acc, li_ptr=acc, mtok_ptr=acc, inv_ptr=acc,
              dd_ptr=acc, cst_ptr=acc, nst_ptr=acc, mst_ptr=acc, dq_ptr=t, qdq_ptr=acc, S="i32", NC="i32",
              scale="fp32")),
        ("bwd intra_chunk_dk", triton_bwd.intra_chunk_dk,
         dict(qk, q_ptr=t, k_ptr=t, v_ptr=t, dh_ptr=t, b_ptr=acc, li_ptr=acc, a_ptr=acc, mtok_ptr=acc,
              inv_ptr=acc, dd_ptr=acc, dcst_ptr=acc, dnst_ptr=acc, mst_ptr=acc, dk_ptr=t, kdk_ptr=acc,
              S="i32", NC="i32", scale="fp32")),
        ("bwd intra_chunk_dv", triton_bwd.intra_chunk_dv,
         dict(intra, q_ptr=t, k_ptr=t, dh_ptr=t, b_ptr=acc, li_ptr=acc, a_ptr=acc, mtok_ptr=acc, inv_ptr=acc,
              dcst_ptr=acc, mst_ptr=acc, dv_ptr=t, S="i32", NC="i32", scale="fp32")),
    ]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--gates", default="exp,sig")
    p.add_argument("--chunks", default="64,128")
    p.add_argument("--dqk", type=int, default=128)
    p.add_argument("--dv", type=int, default=256)
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--headroom", type=float, default=0.10)
    p.add_argument("--matmul-precision", default="high", choices=["high", "medium", "highest"],
                   help="torch float32 matmul precision: high = 3-pass TF32 (kernels.bench), medium = TF32")
    a = p.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    limit = SMEM_LIMIT.get(a.arch, 232448)
    budget = int(limit * (1 - a.headroom))
    torch.set_float32_matmul_precision(a.matmul_precision)
    print(f"triton {triton.__version__}, sm_{a.arch}, limit {limit} B, budget {budget} B "
          f"({a.headroom:.0%} headroom), {a.dtype}, DQK={a.dqk}, DV={a.dv}")
    bad = 0
    for gate in a.gates.split(","):
        for L in map(int, a.chunks.split(",")):
            for name, kernel, args in kernel_args(dtype, L, a.dqk, a.dv, gate == "exp"):
                show = {k: args[k] for k in ("BLQ", "BLKV", "BK", "BV", "num_stages", "PREC")
                        if k in args}
                try:
                    smem = _compile(kernel, dict(args), a.arch).metadata.shared
                except Exception as err:  # noqa: BLE001 - report and go on
                    print(f"  {gate} L={L:4d} {name:24s} COMPILE ERROR {type(err).__name__}: {err}"[:300])
                    bad += 1
                    continue
                ok = smem <= budget
                bad += not ok
                print(f"  {gate} L={L:4d} {name:24s} {smem:7d} B {'ok ' if ok else 'OVER'} {show}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
