"""Registers, spills, shared memory and pipelined loads of the scan kernels, compiled without a GPU.

``python -m kernels.scan.compile_check [--arch 90] [--D 1024] [TILE ...]`` compiles the chunk-loop
kernels (``_loop_kernels.py``) for ``sm_<arch>`` with Triton's bundled ``ptxas`` and prints, per
kernel (forward / backward, diagonal / 2x2): registers per thread, spilled bytes, shared memory, and
how many asynchronous copies (``ttg.async_copy_global_to_local``: loads the software pipeliner
moved into shared memory) the kernel has; 0 means its loads were *not* pipelined. ``TILE``:
``CH,BD,warps,stages`` (diagonal) or ``b2:CH,BD,warps,stages`` (2x2) of the chunk loop, or
``lb:CH,BD,warps`` (the diagonal look-back kernel); default: the shipped ``loop_config`` at ``D``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess

os.environ["TRITON_INTERPRET"] = "0"  # compile the real kernels (read when the kernels are decorated)

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.scan import triton_scan as ts
from kernels.scan._loop_kernels import _block2_loop_kernel, _diag_loop_kernel
from kernels.scan._scan_kernels import _diag_scan_kernel

_POINTERS = {n: "*fp32" for n in ("c_ptr", "x_ptr", "out_ptr", "yfwd_ptr", "dc_ptr")}


def _compile(kernel, runtime: dict, const: dict, warps: int, arch: int):
    """``kernel`` compiled for ``sm_<arch>``: float32 pointers, ``runtime`` arguments (name -> type)
    and compile-time ``const`` ones."""
    sig = {**_POINTERS, **runtime, **{k: "constexpr" for k in const}}
    src = ASTSource(fn=kernel, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))


def compile_loop(block2: bool, tile: tuple[int, int, int, int], grad: bool, D: int, arch: int = 90):
    """The compiled chunk-loop kernel (forward scan, or the backward kernel when ``grad``)."""
    CH, BD, warps, stages = tile
    return _compile(_block2_loop_kernel if block2 else _diag_loop_kernel,
                    dict(L="i32", D="i32", n_dt="i32", n_chunks="i32"),
                    dict(REVERSE=grad, GRAD=grad, CH=CH, BD=BD, STAGES=stages, DC=D if D % 16 == 0 else 0),
                    warps, arch)


def compile_lookback(tile: tuple[int, int, int], grad: bool, D: int, win: int = 1, arch: int = 90):
    """The compiled diagonal look-back kernel (``_scan_kernels._diag_scan_kernel``)."""
    CH, BD, warps = tile
    return _compile(_diag_scan_kernel,
                    dict(ws_ptr="*i64", counter_ptr="*i64", L="i32", D="i32", n_dt="i32", n_lt="i32", n_chunks="i32"),
                    dict(REVERSE=grad, GRAD=grad, CH=CH, BD=BD, WIN=win, DC=D if D % 16 == 0 else 0),
                    warps, arch)


def describe(compiled) -> dict:
    """``regs`` (per thread), ``spill`` (bytes of local memory per thread: spills), ``smem`` (bytes),
    ``async_copies``."""
    out = {"regs": getattr(compiled, "n_regs", None), "spill": getattr(compiled, "n_spills", None),
           "smem": compiled.metadata.shared,
           "async_copies": compiled.asm["ttgir"].count("async_copy_global_to_local")}
    if out["regs"] is None:  # not loaded on a device: ask cuobjdump
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        path = "/tmp/_scan_compile_check.cubin"
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
        out["regs"], out["spill"] = (int(m.group(1)), int(m.group(2)) + int(m.group(3))) if m else (None, None)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels.scan.compile_check", description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--D", type=int, default=1024, help="channel count the kernels are compiled for")
    p.add_argument("tiles", nargs="*", help="CH,BD,warps,stages or b2:CH,BD,warps,stages (chunk loop); "
                   "lb:CH,BD,warps (diagonal look-back)")
    args = p.parse_args(argv)
    tiles = args.tiles or [",".join(map(str, ts.loop_config(4096, args.D, False))),
                           "b2:" + ",".join(map(str, ts.loop_config(4096, args.D, True))),
                           "b2:" + ",".join(map(str, ts.loop_config(4096, args.D, True, True)))]
    print(f"triton {triton.__version__}, sm_{args.arch}, D = {args.D}")
    for spec in tiles:
        prefix, _, numbers = spec.rpartition(":")
        tile = tuple(int(v) for v in numbers.split(","))
        for grad in (False, True):
            if prefix == "lb":
                info = describe(compile_lookback(tile, grad, args.D, arch=args.arch))
            else:
                info = describe(compile_loop(prefix == "b2", tile, grad, args.D, args.arch))
            kind = {"": "loop diag", "b2": "loop 2x2", "lb": "lookback diag"}[prefix]
            name = f"{kind} {'bwd' if grad else 'fwd'} {tile}"
            print(f"{name:32s} " + " ".join(f"{k}={v}" for k, v in info.items()))


if __name__ == "__main__":
    main()
