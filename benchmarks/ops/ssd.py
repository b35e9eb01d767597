"""``python -m benchmarks.ops ssd``: time the SSD implementations and their peers, after checking each.

Implementations: ``ours-torch`` (the chunked PyTorch form), ``ours-triton-q{Q}`` (our Triton kernels
at chunk size ``Q``; float32 at torch's default matmul precision: 3-pass TF32 products),
``ours-triton-q{Q}-tf32`` (float32 only: single-pass TF32 products, ``torch.set_float32_matmul_precision
("medium")``, the precision of the peers' float32 kernels) and the peers when importable:
``mamba-ssm`` (``mamba_chunk_scan_combined``, the pure-Triton SSD of ``mamba-ssm``, chunk 256) and
``fla:chunk_simple_gla`` (``fla-core``'s gated linear attention with a scalar decay per head: the same
recurrence with ``q = C``, ``k = dt B``, ``v = x``, ``g = dt A``; its gradient of ``dt`` is formed by
autograd through that change of variables).

Every implementation is checked first, forward and all gradients, against our chunked form in
float64 on the first two sequences of the batch (the chunked form is tested against the step loop
in ``tests/kernels/test_ssd.py``); our Triton outputs are poisoned with NaN. Each runs once at the
timed shape before its check (autotuned peers tune for the timed shape). Timed: ``y = ssd(x, dt, A,
B, C)`` (no ``D``, no initial state), forward alone and forward + backward w.r.t. ``x, dt, A, B, C``.

Limits: bytes = every input read once and every output written once over the measured copy
bandwidth; FLOPs = the chunked form's matrix products (causal half of each chunk) over the measured
matmul rate of the dtype (TF32 for float32; the 3-pass default runs 3x the products). The larger
is the floor. ``--tiles``: time ours with ``SsdTiles`` fields or ``TILE_SETS`` names (section ``tiles``);
without it ours runs the device's default set (``seqkernels.ssd.triton_ops.DEVICE_TILES``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math

import torch

from benchmarks.ops.common import (
    Impl,
    Problem,
    cli_common,
    copy_bandwidth_gbs,
    environment,
    finish,
    fwd_bwd,
    grads,
    matmul_tflops,
    max_rel_error,
    no_grad,
    run,
    write_json,
)
from seqkernels._triton import float32_matmul_precision, poisoned
from seqkernels.ssd import SSD_BACKENDS, ssd

log = logging.getLogger("benchmarks.ops.ssd")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _mamba():
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as err:  # missing, or its CUDA extensions fail to import
        log.warning("mamba-ssm not usable: %s", err)
        return None
    return lambda x, dt, A, B, C: mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256)


def _fla():
    """``ssd`` through ``fla``'s ``chunk_simple_gla`` (layout ``(B, L, H, D)``, one group)."""
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as err:  # noqa: BLE001
        log.warning("fla-core not usable: %s", err)
        return None

    def fn(x, dt, A, B, C):
        H = x.shape[2]
        k = (B.expand(-1, -1, H, -1) * dt[..., None].to(B.dtype)).contiguous()
        q = C.expand(-1, -1, H, -1).contiguous()
        g = (dt.float() * A.float()).contiguous()
        return chunk_simple_gla(q, k, x, g=g, scale=1.0)[0]

    return fn


def _at_precision(precision: str, fn):
    """``fn`` run under ``torch.set_float32_matmul_precision(precision)`` (the Triton SSD fixes its
    product precision at the forward call, so the backward follows)."""

    def call(*args):
        with float32_matmul_precision(precision):
            return fn(*args)

    return call


def implementations(chunks: list[int], tiles=None) -> dict:
    """name -> ``fn(x, dt, A, B, C) -> y`` (ours, and the peers that import)."""
    impls = {"ours-torch": lambda x, dt, A, B, C: ssd(x, dt, A, B, C, chunk_size=64, backend="torch")}
    if "triton" in SSD_BACKENDS:
        from seqkernels.ssd.triton_ops import ssd_triton

        for q in chunks:
            fn = lambda x, dt, A, B, C, q=q: ssd_triton(x, dt, A, B, C, None, q, tiles=tiles)[0]  # noqa: E731
            impls[f"ours-triton-q{q}"] = _at_precision("highest", fn)
            impls[f"ours-triton-q{q}-tf32"] = _at_precision("medium", fn)
    for name, peer in (("mamba-ssm", _mamba()), ("fla:chunk_simple_gla", _fla())):
        if peer is not None:
            impls[name] = peer
    return impls


def inputs(batch, L, H, P, G, N, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    dt = torch.exp(torch.rand(batch, L, H, generator=g, device=device) * math.log(100) + math.log(1e-3))
    A = -torch.exp(torch.rand(H, generator=g, device=device) * math.log(16))
    return [r(batch, L, H, P), dt, A, r(batch, L, G, N), r(batch, L, G, N)]


def limits(batch, L, H, P, G, N, Q, dtype, bw_gbs, tflops) -> dict:
    item = torch.finfo(dtype).bits // 8
    x, bc, dt = batch * L * H * P * item, 2 * batch * L * G * N * item, batch * L * H * 4
    fwd_bytes = 2 * x + bc + dt
    bwd_bytes = fwd_bytes + 2 * x + 2 * bc + 2 * dt  # + dy, inputs again, grads out
    fwd_flops = 2 * batch * L * (H * (Q * P / 2 + 2 * P * N) + G * Q * N / 2)
    lim = lambda nbytes, flops: max(nbytes / (bw_gbs * 1e9), flops / (tflops * 1e12)) * 1e3  # noqa: E731
    return {"fwd": lim(fwd_bytes, fwd_flops), "fwd+bwd": lim(fwd_bytes + bwd_bytes, 3 * fwd_flops)}


def problem(batch, L, H, P, N, dname, impls: dict, bw, rates, section="main", device="cuda") -> Problem:
    dtype = DTYPES[dname]
    pb = Problem(
        "ssd",
        {"batch": batch, "length": L, "heads": H, "head_dim": P, "state": N},
        dname,
        None,
        limits(batch, L, H, P, 1, N, 128, dtype, bw, rates[dname]),
        section,
    )

    def build():
        full = inputs(batch, L, H, P, 1, N, device)
        small = [t[:2] if t.dim() > 1 else t for t in full]
        dy_small = torch.randn_like(small[0])
        ref = grads(impls["ours-torch"], [t.double() for t in small], dy_small.double())
        cast = lambda ts: [t.to(dtype) if t.dim() not in (1, 3) else t for t in ts]  # noqa: E731
        xs, xs_small = cast(full), cast(small)
        dy = torch.randn_like(xs[0])
        out = []
        for name, fn in impls.items():
            if name.endswith("-tf32") and dtype != torch.float32:
                continue
            if name == "ours-torch" and section != "main":
                continue

            def check(fn=fn, name=name):
                fwd_bwd(fn, xs, dy)()  # once at the timed shape first: autotuned peers tune for it
                with poisoned() if name.startswith("ours") else contextlib.nullcontext():
                    return max_rel_error(grads(fn, xs_small, dy_small), ref)

            out.append(Impl(name, no_grad(fn, *xs), fwd_bwd(fn, xs, dy), check))
        return out

    pb.impls = build
    return pb


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops ssd", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small shape")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", default="64")
    ap.add_argument("--headdim", type=int, default=64)
    ap.add_argument("--states", default="64,128")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--chunks", default="128", help="chunk sizes of ours-triton")
    ap.add_argument("--impls", default="", help="comma-separated name prefixes to run (default: all)")
    ap.add_argument(
        "--tiles",
        default="",
        help="';'-separated tile sets to time ours with: SsdTiles fields or "
        "TILE_SETS names, e.g. 'h100;h200;fwd_cols=64,attn_stages=2' (section 'tiles')",
    )
    cli_common(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        raise SystemExit("error: the ssd benchmark needs a CUDA GPU")
    if args.quick:
        args.batch, args.seqlen, args.heads, args.states = 2, 512, "8", "64"
    chunks = [int(q) for q in args.chunks.split(",")]
    impls = implementations(chunks)
    if args.impls:
        impls = {k: v for k, v in impls.items() if k == "ours-torch" or k.startswith(tuple(args.impls.split(",")))}
    bw = copy_bandwidth_gbs("cuda")
    rates = {name: matmul_tflops("cuda", dtype) for name, dtype in DTYPES.items()}
    env = environment("cuda")
    env.update(copy_gbs=bw, matmul_tflops=rates)
    dnames = [d for d in args.dtypes.split(",") if d]
    shapes = [(H, N) for H in map(int, args.heads.split(",")) for N in map(int, args.states.split(","))]
    problems = [
        problem(args.batch, args.seqlen, H, args.headdim, N, dn, impls, bw, rates) for H, N in shapes for dn in dnames
    ]
    for spec in filter(None, args.tiles.split(";")):
        from seqkernels.ssd.triton_ops import SsdTiles

        tiles = SsdTiles.parse(spec)
        tuned = {f"{k}[{spec}]": v for k, v in implementations(chunks, tiles).items() if k.startswith("ours-triton")}
        problems += [
            problem(
                args.batch,
                args.seqlen,
                H,
                args.headdim,
                N,
                dn,
                {"ours-torch": impls["ours-torch"], **tuned},
                bw,
                rates,
                section="tiles",
            )
            for H, N in shapes
            for dn in dnames
        ]
    rows = run(
        problems, warm_only=args.warm_only, log=log.info, checkpoint=lambda rows: write_json("ssd", rows, env, args.out)
    )
    finish("ssd", rows, env, args, baseline="mamba-ssm" if "mamba-ssm" in impls else "fla:chunk_simple_gla")


if __name__ == "__main__":
    main()
