"""``python -m kernels.bench ssd``: time the SSD implementations, after checking each one.

Implementations: ``chunked`` (our chunked PyTorch form), ``triton-q{Q}`` (our Triton kernels at
chunk size ``Q``; float32 at torch's default matmul precision, i.e. 3-pass TF32 products),
``triton-q{Q}-tf32`` (float32 only: single-pass TF32 products, ``torch.set_float32_matmul_precision
("medium")``, the precision mamba-ssm's float32 kernels use) and, when importable, ``mamba-ssm`` (``mamba_chunk_scan_combined``, the pure
Triton SSD of the ``mamba-ssm`` package, at its default chunk size 256). Every implementation is
first checked, forward and all gradients, against the chunked form in float64 on the first two
sequences of the benchmark batch (the chunked form itself is tested against the step-by-step
recurrence in ``tests/kernels/test_ssd.py``); Triton outputs are poisoned with NaN before the check.
Each implementation runs once at the timed shape before its check, so that autotuned kernels
(``mamba-ssm``'s) tune for the timed shape; ``--warm N`` compiles everything in ``N`` processes
first (``kernels.ssd.warm``). The function timed is ``y = ssd(x, dt, A, B, C)`` (no ``D``, no initial state), forward alone (no
autograd) and forward + backward (``torch.autograd.grad`` of ``y`` with a random ``dy`` w.r.t.
``x, dt, A, B, C``).

Physical limits: bytes = every input read once and every output written once (forward: x, dt, B,
C, y; forward + backward adds dy, a second read of the inputs and dx, ddt, dB, dC) over the
measured copy bandwidth; FLOPs = the matrix products of the chunked form counting only the causal
half of each chunk (forward ``H (Q P + 4 P N) + G Q N`` per token, backward twice that) over the
measured matmul rate of the dtype (TF32 for float32; the 3-pass default runs 3x the products, so
its FLOP floor is 3x too low). The larger is the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
from pathlib import Path

import torch

from kernels._triton import float32_matmul_precision
from kernels.bench.common import (
    BenchRow,
    copy_bandwidth_gbs,
    environment,
    matmul_tflops,
    print_table,
    rel_error,
    time_ms,
    write_json,
)
from kernels.ssd import SSD_BACKENDS, ssd

log = logging.getLogger("kernels.ssd.bench")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _peer():
    """``mamba_chunk_scan_combined`` if ``mamba_ssm``'s Triton SSD can be imported, else ``None``."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as err:  # missing, or its CUDA extensions fail to import
        log.warning("mamba-ssm not usable: %s", err)
        return None
    return mamba_chunk_scan_combined


def _at_precision(precision: str, fn):
    """``fn`` run under ``torch.set_float32_matmul_precision(precision)`` (the Triton SSD fixes its
    product precision at the forward call, so the backward follows)."""

    def run(*args):
        with float32_matmul_precision(precision):
            return fn(*args)

    return run


def _implementations(chunks: list[int], peer) -> dict:
    impls = {"chunked": lambda x, dt, A, B, C: ssd(x, dt, A, B, C, chunk_size=64, backend="chunked")}
    if "triton" in SSD_BACKENDS:
        for q in chunks:
            fn = lambda x, dt, A, B, C, q=q: ssd(x, dt, A, B, C, chunk_size=q, backend="triton")  # noqa: E731
            impls[f"triton-q{q}"] = _at_precision("highest", fn)
            impls[f"triton-q{q}-tf32"] = _at_precision("medium", fn)
    if peer is not None:
        impls["mamba-ssm"] = lambda x, dt, A, B, C: peer(x, dt, A, B, C, chunk_size=256)
    return impls


def _inputs(batch, L, H, P, G, N, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    dt = torch.exp(torch.rand(batch, L, H, generator=g, device=device) * math.log(100) + math.log(1e-3))
    A = -torch.exp(torch.rand(H, generator=g, device=device) * math.log(16))
    return [r(batch, L, H, P), dt, A, r(batch, L, G, N), r(batch, L, G, N)]


def _grads(fn, args, dy):
    args = [a.detach().clone().requires_grad_(True) for a in args]
    y = fn(*args)
    return [y.detach(), *torch.autograd.grad(y, args, dy.to(y.dtype))]


@contextlib.contextmanager
def _poisoned():
    """Triton outputs start as NaN while checking (unwritten elements show as inf error)."""
    if "triton" not in SSD_BACKENDS:
        yield
        return
    from kernels.ssd import triton_ssd

    saved = triton_ssd._empty
    triton_ssd._empty = lambda *shape, device, dtype: torch.full(shape, math.nan, device=device, dtype=dtype)
    try:
        yield
    finally:
        triton_ssd._empty = saved


def _limits(batch, L, H, P, G, N, Q, dtype, bw_gbs, tflops):
    item = torch.finfo(dtype).bits // 8
    x, bc, dt = batch * L * H * P * item, 2 * batch * L * G * N * item, batch * L * H * 4
    fwd_bytes = 2 * x + bc + dt
    bwd_bytes = fwd_bytes + 2 * x + 2 * bc + 2 * dt  # + dy, inputs again, grads out
    fwd_flops = 2 * batch * L * (H * (Q * P / 2 + 2 * P * N) + G * Q * N / 2)
    lim = lambda nbytes, flops: max(nbytes / (bw_gbs * 1e9), flops / (tflops * 1e12)) * 1e3  # noqa: E731
    return {"fwd": lim(fwd_bytes, fwd_flops), "fwd+bwd": lim(fwd_bytes + bwd_bytes, 3 * fwd_flops)}


def _profile(fn, xs, dy, title):
    """Log the CUDA kernels of one fwd+bwd, by total time (where the time goes)."""
    leaves = [t.detach().requires_grad_(True) for t in xs]
    for _ in range(3):
        torch.autograd.grad(fn(*leaves), leaves, dy)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(fn(*leaves), leaves, dy)
        torch.cuda.synchronize()
    log.info("profile %s\n%s", title, prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=48))


def _warm(args, impls: list[str]) -> None:
    """Compile ``impls`` at the benchmark's shapes (timed batch and the check's 2 sequences) in
    ``args.warm`` processes; ``mamba-ssm``'s autotuning split in ``args.warm_parts``."""
    from kernels.ssd.warm import Job, warm

    H = int(args.heads.split(",")[0])
    jobs = []
    for N in map(int, args.states.split(",")):
        for dname in args.dtypes.split(","):
            for impl in impls:
                if impl.endswith("-tf32") and dname != "fp32":
                    continue
                parts = args.warm_parts if impl == "mamba-ssm" else 1
                jobs += [Job(impl, dname, H, N, args.headdim, args.seqlen, (args.batch, 2), part=i, parts=parts)
                         for i in range(parts)]
    jobs.sort(key=lambda j: j.impl != "mamba-ssm")  # the longest first
    warm(jobs, args.warm)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench ssd", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small shape (CPU-friendly)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", default="64,128")
    ap.add_argument("--headdim", type=int, default=64)
    ap.add_argument("--states", default="64,128")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--chunks", default="64,128,256", help="chunk sizes of the Triton path")
    ap.add_argument("--impls", default="", help="comma-separated name prefixes to run (default: all)")
    ap.add_argument("--profile", default="", help="print a kernel-time profile of this impl's fwd+bwd first")
    ap.add_argument("--warm", type=int, default=0,
                    help="first compile every implementation in this many processes (kernels.ssd.warm)")
    ap.add_argument("--warm-parts", type=int, default=4, help="processes that split one mamba-ssm autotuning")
    ap.add_argument("--out", default="benchmarks")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        args.batch, args.seqlen, args.heads, args.states, args.chunks = 2, 256, "4", "16", "64"
    if device == "cpu":  # the Triton interpreter has no bfloat16 products
        args.dtypes = "fp32"
    peer = _peer() if device == "cuda" else None
    impls = _implementations([int(q) for q in args.chunks.split(",")], peer)
    if args.impls:
        impls = {k: v for k, v in impls.items() if k == "chunked" or k.startswith(tuple(args.impls.split(",")))}
    env = environment(device)
    env["mamba-ssm"] = "importable" if peer is not None else None
    bw = copy_bandwidth_gbs(device, nbytes=1 << 30 if device == "cuda" else 1 << 26)
    rates = {}
    for name, dtype in DTYPES.items():
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 kernels use TF32 products
        rates[name] = matmul_tflops(device, dtype, n=8192 if device == "cuda" else 512)
    env.update(copy_gbs=bw, matmul_tflops=rates)
    log.info("copy %.0f GB/s, matmul %s TFLOP/s", bw, {k: round(v, 1) for k, v in rates.items()})
    rows: list[BenchRow] = []
    P, G = args.headdim, 1
    if args.warm and device == "cuda":
        _warm(args, [k for k in impls if k != "chunked"])
    for H in map(int, args.heads.split(",")):
        for N in map(int, args.states.split(",")):
            shape = f"B{args.batch} L{args.seqlen} H{H} P{P} N{N}"
            full = _inputs(args.batch, args.seqlen, H, P, G, N, device)
            # check: float64 chunked form on the first two sequences
            small = [t[:2] if t.dim() > 1 else t for t in full]
            dy = torch.randn_like(small[0])
            ref = _grads(impls["chunked"], [t.double() for t in small], dy.double())
            for dname, dtype in DTYPES.items():
                if dname not in args.dtypes.split(","):
                    continue
                cast = lambda ts: [t.to(dtype) if t.dim() != 3 and t.dim() != 1 else t for t in ts]  # noqa: E731
                xs = cast(full)
                dy_full = torch.randn_like(xs[0])
                if args.profile in impls:
                    _profile(impls[args.profile], xs, dy_full, f"{args.profile} {shape} {dname}")
                for impl, fn in impls.items():
                    if impl == "chunked" and args.impls and "chunked" not in args.impls.split(","):
                        continue
                    if impl.endswith("-tf32") and dtype != torch.float32:
                        continue
                    try:
                        # once at the timed shape first: autotuned peers tune for it, not for the check's
                        leaves = [t.detach().requires_grad_(True) for t in xs]
                        torch.autograd.grad(fn(*leaves), leaves, dy_full)
                        with _poisoned():
                            out = _grads(fn, cast(small), dy)
                        err = max(rel_error(o, r) for o, r in zip(out, ref))
                        errs = {k: rel_error(o, r) for k, o, r in zip(["y", "dx", "ddt", "dA", "dB", "dC"], out, ref)}
                        del out
                        Q = int(impl.split("-")[1][1:]) if impl.startswith("triton") else (256 if impl == "mamba-ssm" else 64)
                        lim = _limits(args.batch, args.seqlen, H, P, G, N, Q, dtype, bw, rates[dname])
                        with torch.no_grad():
                            fwd_ms = time_ms(lambda: fn(*xs), device=device)
                        bwd_ms = time_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, dy_full), device=device)
                        for direction, ms in (("fwd", fwd_ms), ("fwd+bwd", bwd_ms)):
                            rows.append(BenchRow("ssd", impl, shape, direction, dname, ms, lim[direction], err,
                                                 extra={"rel_errors": errs, "chunk_size": Q}))
                    except torch.cuda.OutOfMemoryError:
                        rows.append(BenchRow("ssd", impl, shape, "fwd+bwd", dname, math.nan, note="out of memory"))
                    except Exception as err:  # a failing implementation is reported, the others still run
                        rows.append(BenchRow("ssd", impl, shape, "fwd+bwd", dname, math.nan, note=f"failed: {err}"[:200]))
                    torch.cuda.empty_cache() if device == "cuda" else None
                    log.info("%s %s %s: %s", shape, dname, impl, [f"{r.direction} {r.ms:.3f} ms err {r.max_rel_err:.1e} {r.note}" for r in rows[-2:]])
                    path = write_json("ssd", rows, env, args.out)  # rewritten after each row: partial runs keep data
            del full, small, ref
    log.info("wrote %s", path)
    table = print_table(rows, baseline="mamba-ssm" if peer is not None else "chunked")
    Path(args.out, "ssd-latest.md").write_text(f"{env['device']}, {env['date']}\n\n{table}\n")
    Path(args.out, "ssd-env.json").write_text(json.dumps(env, indent=1, default=str))
