"""``python -m benchmarks.ops delta-probe {kernels,grid,dplr}``: where the delta chunk kernels' time goes.

The delta benchmark (``python -m benchmarks.ops delta --profile``) times whole calls and lists their
kernels; this tool launches each of ``triton_chunk``'s split kernels (the gated delta rule, one step per
token, bfloat16 inputs, ``ChunkTiles`` from ``--tiles``) on its own:

- ``kernels``: each kernel's median time (``do_bench``), in the order a forward + backward runs them:
  ``prep`` (``chunk_prep_kernel``), ``fwd`` (the walk), ``out``, ``bwd_state`` (the backward's walk),
  ``bwd_grads``, ``bwd_prep``;
- ``grid --kernel NAME``: one kernel at every ``num_warps`` x ``num_stages`` of ``--warps`` x
  ``--stages`` (the other kernels at the tiles' own), each launch's outputs first checked against the
  tiles' own launch (relative error at most 1e-3: only the order of the float32 sums may differ);
- ``dplr``: RWKV-7's chunk form on ``backend="triton_chunk"`` (its inputs at ``--shape`` in ``--dtype``, RWKV-7's
  decay bound): the inter-chunk scan kernels alone on what the fused chunk kernels hand them (chunks of
  ``fused_chunk``'s default), forward and backward, at every ``block_v`` x ``num_warps`` x ``num_stages`` of
  ``--block-v`` x ``--warps`` x ``--stages`` (``ScanTiles``), each checked as in ``grid`` against the default tiles;
  then the whole call's forward and forward + backward at its defaults, for the scan's share, and at each
  chunk size x precision of ``--chunks`` x ``--precisions`` (the fused kernels' and the scan's products),
  each with its largest relative error against the defaults' output and gradients; then each fused per-chunk
  kernel (``prep``, ``out``, ``out_bwd``, ``prep_bwd``) alone at every ``chunk_warps`` x ``chunk_block_v`` of
  ``--warps`` x ``--chunk-block-v`` and precision of ``--precisions``, checked as in ``grid`` against its
  launch at the defaults.

A configuration Triton cannot build (shared memory) or that faults is reported on its line; a fault
ends the process (CUDA's context is lost), so ``grid`` runs each kernel in its own call. On the CPU it
runs under ``TRITON_INTERPRET=1`` (small shapes; times are the interpreter's).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os

import torch
import torch.nn.functional as F

from benchmarks.ops.common import time_ms
from benchmarks.ops.delta import DPLR_LOWER_BOUND, DTYPES, call, chunk_tiles
from benchmarks.ops.delta import inputs as op_inputs
from seqkernels._triton import cdiv, empty, next_pow2
from seqkernels.delta import chunk_kernels as ck
from seqkernels.delta import triton_chunk as tc
from seqkernels.delta import triton_dplr as td

KERNELS = ("prep", "fwd", "out", "bwd_state", "bwd_grads", "bwd_prep")
#: the tensors each kernel writes (names in ``launches``' buffers), compared across ``grid``'s configurations
WRITES = {
    "prep": ("W", "U", "Tm"),
    "fwd": ("Up", "ckpt"),
    "out": ("o",),
    "bwd_state": ("dU", "dckpt"),
    "bwd_grads": ("dq", "dk", "dW", "dG"),
    "bwd_prep": ("dk", "dv", "dbeta", "dg"),
}


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """``"BxLxHxD"`` -> ``(B, L, H, D)``, one-line error otherwise."""
    parts = text.split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SystemExit(f"error: --shape must be BxLxHxD of positive ints, got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def inputs(shape: tuple[int, int, int, int], device: str) -> tuple[torch.Tensor, ...]:
    """``(q, k, v, g, beta, do)`` of the gated delta rule at ``shape`` ``(B, L, H, D)``: unit ``q``, ``k``,
    log decays in [-0.1, 0], ``beta`` in [0, 1], bfloat16 but ``g`` (seeded: the same every call)."""
    B, T, H, D = shape
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = (F.normalize(r(B, T, H, D), dim=-1).to(device, torch.bfloat16) for _ in range(2))
    v, do = (r(B, T, H, D).to(device, torch.bfloat16) for _ in range(2))
    g = (-0.1 * torch.rand(B, T, H, generator=gen)).to(device)
    beta = torch.rand(B, T, H, generator=gen).to(device, torch.bfloat16)
    return q, k, v, g, beta, do


def launches(shape: tuple[int, int, int, int], tiles: tc.ChunkTiles, device: str) -> tuple[dict, dict]:
    """``(launch, buffers)``: ``launch[name](**options)`` runs that kernel on ``buffers`` (its launch options
    over the tiles' own); run in ``KERNELS`` order once, each kernel's inputs are the earlier ones' outputs.
    The forward's buffers are ``triton_chunk._forward``'s (run once here), the backward's allocated as
    ``_backward`` allocates them."""
    B, T, H, D = shape
    q, k, v, g, beta, do = inputs(shape, device)
    C, NV, tiles, prep, blocks, _ = tc._meta(q, k, v, g, 1, tiles)
    _, _, _, prep_b, blocks_b, own = tc._meta(q, k, v, g, 1, tiles, backward=True)
    BK, VP, NC, f32 = prep["BK"], prep["VP"], cdiv(T, C), torch.float32
    o, W, U, Tm, ckpt = tc._forward(q, k, v, g, beta, D**-0.5, 1, save=True, tiles=tiles)
    buf = {
        "W": W,
        "U": U,
        "Tm": Tm,
        "o": o,
        "ckpt": ckpt,
        "dq": empty((1, B, T, H, D), device, f32),
        "dk": empty((1, B, T, H, D), device, f32),
        "dW": empty((1, B * H, NC * C, BK), device, f32),
        "dU": empty((B * H, NC * C, VP), device, U.dtype),
        "dG": empty((1, B * H, NC * C), device, f32),
        "dv": empty((B, T, H, D), device, torch.bfloat16),
        "dbeta": empty((B, T, H), device, f32),
        "dg": empty((B, T, H), device, f32),
    }
    buf["Up"] = buf["U"]  # the walk writes U' over U
    buf["dckpt"] = empty(ckpt.shape, device, ckpt.dtype)
    b = buf
    fargs = (q, k, g, b["W"], b["U"], b["o"], b["ckpt"], T, H, float(D**-0.5))
    bargs = (q, k, g, b["W"], b["U"], b["ckpt"], do, b["dckpt"], b["dq"], b["dk"], b["dW"], b["dU"], b["dG"])
    bargs = (*bargs, B, T, H, float(D**-0.5))
    pargs = (k, v, g, beta, b["Tm"], b["dW"][0], b["dU"], b["dk"][0], b["dv"], b["dbeta"], b["dG"][0], b["dg"], T, H)
    table = {
        "prep": (
            ck.chunk_prep_kernel,
            (NC, B * H),
            (k, v, g, beta, b["W"], b["U"], b["Tm"], T, H),
            {**prep, "INVERSE": tiles.inverse},
        ),
        "fwd": (ck.chunk_fwd_kernel, (NV, B * H), fargs, {**blocks, "OUT": False, "SAVE": True}),
        "out": (ck.chunk_out_kernel, (NC, B * H), fargs, blocks),
        "bwd_state": (ck.chunk_bwd_state_kernel, (NV, B * H), bargs, {**own["walk"], "GRADS": False}),
        "bwd_grads": (ck.chunk_bwd_grads_kernel, (NC, B * H), bargs, own["grads"]),
        "bwd_prep": (ck.chunk_bwd_prep_kernel, (NC, B * H), pargs, prep_b),
    }

    def bind(kernel, grid, args, meta):
        return lambda **options: kernel[grid](*args, **{**meta, **options})

    return {name: bind(*entry) for name, entry in table.items()}, buf


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _one_line(e: Exception) -> str:
    """A configuration's failure as its row's note: the exception's type and first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def probe_kernels(shape, tiles, device) -> list[tuple[str, float]]:
    """``[(kernel, ms)]`` at the tiles' own launch options."""
    launch, _ = launches(shape, tiles, device)
    for name in KERNELS:
        launch[name]()
    return [(name, time_ms(launch[name], warmup=10, rep=40, device=device)) for name in KERNELS]


def probe_grid(shape, tiles, device, kernel: str, warps, stages):
    """Yield ``(warps, stages, ms or None, note)`` for ``kernel`` at each configuration."""
    launch, buf = launches(shape, tiles, device)
    saved = {}
    for name in KERNELS:
        if name == kernel:  # its inputs as the tiles' own launch sees them, and that launch's outputs
            saved = {n: t.clone() for n, t in buf.items()}
        launch[name]()
        if name == kernel:
            want = {n: buf[n].clone() for n in WRITES[kernel]}
            break
    for w, s in itertools.product(warps, stages):
        for n, t in saved.items():
            buf[n].copy_(t)
        try:
            launch[kernel](num_warps=w, num_stages=s)
        except Exception as e:  # noqa: BLE001 - a configuration Triton cannot build is a row, not the end
            yield w, s, None, _one_line(e)
            continue
        err = max(_rel(buf[n], want[n]) for n in WRITES[kernel])
        if err > 1e-3:
            yield w, s, None, f"differs from the tiles' own launch: relative error {err:.1e}"
            continue
        yield w, s, time_ms(lambda: launch[kernel](num_warps=w, num_stages=s), warmup=10, rep=40, device=device), ""


def _dplr_call_inputs(shape: tuple[int, int, int, int], device: str, dtype: torch.dtype = torch.bfloat16):
    """``(C, q, k, v, a, b, w)``: the fused kernels' chunk size (``triton_dplr.fused_chunk``'s default under the
    delta benchmark's bound) and its ``dplr`` inputs at ``shape`` in ``dtype``; one-line error past the fused
    kernels' head dims."""
    B, T, H, D = shape
    if D > td.FUSED_MAX_HEAD_DIM:
        raise SystemExit(f"error: the fused DPLR kernels take head dims up to {td.FUSED_MAX_HEAD_DIM}, got {D}")
    return td.fused_chunk(D, DPLR_LOWER_BOUND, None), *op_inputs("dplr", B, T, H, D, dtype, device)


def dplr_scan_inputs(
    shape: tuple[int, int, int, int], device: str, dtype: torch.dtype = torch.bfloat16
) -> tuple[list[torch.Tensor], tuple]:
    """``(xs, out_rows)``: the scan's inputs ``(U_v, W, b_end, k_end, v, decay_end)`` as the fused chunk kernels
    hand them over at ``shape`` (``_dplr_call_inputs``; ``(B H, NC, ...)``, but ``v`` the input ``(B, L, H,
    V)``: ``heads=H``) and the rows its backward forms the state's output gradient from, ``(q, w, do, scale)``
    (``do`` seeded Gaussian)."""
    C, q, k, v, a, b, w = _dplr_call_inputs(shape, device, dtype)
    with torch.no_grad():
        Uv, W, Be, Ke, Dd, _ = td._fused_prep(k, v, a, b, w, td._chunk_meta(k, v, C, None))
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(2)).to(device, v.dtype)
    return [Uv, W, Be, Ke, v, Dd], (q, w, do, shape[3] ** -0.5)


def probe_dplr(shape, device, block_vs, warps, stages=(None,), dtype=torch.bfloat16):
    """Yield ``(block_v, warps, stages, forward ms or None, backward ms or None, note)`` of the scan kernels at
    each ``ScanTiles`` (a ``block_v`` wider than the values is skipped), the backward as the fused call runs
    it (the state's output gradient formed on chip); inputs in ``dtype``."""
    xs, rows = dplr_scan_inputs(shape, device, dtype)
    W, Be, Ke, v, Dd = xs[1:]
    H = shape[2]
    want = td._scan_fwd(*xs, heads=H)
    dU = torch.randn(want[0].shape, generator=torch.Generator().manual_seed(1)).to(device)

    def backward(U, M_in, tiles=None):
        return td._scan_bwd(dU, None, W, Be, Ke, v, Dd, U, M_in, tiles, H, rows)

    want_grads = backward(*want)
    widest = max(16, next_pow2(shape[3]))
    for bv, w, st in itertools.product([bv for bv in block_vs if bv <= widest], warps, stages):
        tiles = td.ScanTiles(block_v=bv, warps=w, stages=st)
        try:
            got = td._scan_fwd(*xs, tiles, heads=H)
            grads = backward(*got, tiles)
        except Exception as e:  # noqa: BLE001 - a configuration that cannot run is a row, not the end
            yield bv, w, st, None, None, _one_line(e)
            continue
        err = max(_rel(a, b) for a, b in zip((*got, *grads), (*want, *want_grads)))
        if err > 1e-3:
            yield bv, w, st, None, None, f"differs from the default tiles: relative error {err:.1e}"
            continue
        fwd = time_ms(lambda: td._scan_fwd(*xs, tiles, heads=H), warmup=10, rep=40, device=device)
        bwd = time_ms(lambda: backward(*got, tiles), warmup=10, rep=40, device=device)
        yield bv, w, st, fwd, bwd, ""


DPLR_KERNELS = ("prep", "out", "out_bwd", "prep_bwd")


def dplr_kernel_launches(shape, device, precision: str, dtype: torch.dtype = torch.bfloat16):
    """``{name: launch}`` of the fused DPLR per-chunk kernels (``DPLR_KERNELS``) at ``shape`` (the delta
    benchmark's ``dplr`` inputs in ``dtype``, its bound, chunks of ``fused_chunk``'s default), each ``launch(tiles)``
    running that kernel alone on the default forward's hand-over at ``ScanTiles`` ``tiles`` (its ``precision``
    over ``precision``) and returning its outputs, those written per value block summed (comparable across
    ``chunk_block_v``)."""
    H, D = shape[2:]
    C, q, k, v, a, b, w = _dplr_call_inputs(shape, device, dtype)

    def at(tiles):
        return td._chunk_meta(q, v, C, dataclasses.replace(tiles, precision=precision))

    with torch.no_grad():
        tiles = td.ScanTiles(precision=precision)
        o, U, M_in, Wy, Be, Ke, Dd, Tm = td._fused_fwd(q, k, v, a, b, w, D**-0.5, C, tiles)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(device, o.dtype)
        dU, _, *shares = td._fused_out_bwd(do, q, k, v, b, w, U, M_in, D**-0.5, at(tiles))
        grads = td._scan_bwd(dU, None, Wy, Be, Ke, v, Dd, U, M_in, tiles, H, (q, w, do, D**-0.5), shares=True)

    def prep(t):  # T from value block 0's scratch (each block inverts the same chunk)
        *outs, T = td._fused_prep(k, v, a, b, w, at(t))
        return *outs, T[0]

    def out_bwd(t):  # dq summed over the value blocks in q's dtype (one block stores it so)
        dU, dq, *rest = td._fused_out_bwd(do, q, k, v, b, w, U, M_in, D**-0.5, at(t))
        return dU, td._block_sum(dq).to(q.dtype), *rest

    def prep_bwd(t):  # every gradient but dv summed over the value blocks, in its input's dtype
        dk, dv, da, db, dw = td._fused_prep_bwd(k, v, a, b, w, Tm, *grads, *shares, at(t))
        return dv, *(td._block_sum(x).to(y.dtype) for x, y in ((dk, k), (da, a), (db, b), (dw, w)))

    return {
        "prep": prep,
        "out": lambda t: (td._fused_out(q, k, v, b, w, U, M_in, D**-0.5, at(t)),),
        "out_bwd": out_bwd,
        "prep_bwd": prep_bwd,
    }


def probe_dplr_kernels(shape, device, warps, precisions, block_vs=(None,), dtype=torch.bfloat16):
    """Yield ``(kernel, precision, warps, block_v, ms or None, note)``: each fused DPLR per-chunk kernel alone
    at each ``ScanTiles.chunk_warps`` x ``chunk_block_v`` of ``warps`` x ``block_vs`` (``None`` the default;
    one wider than the values is skipped) and each precision, its outputs checked as in ``grid`` against its
    launch at the defaults (within 1e-2 at another ``chunk_block_v``: one value block stores the gradients in
    the inputs' dtype, several sum float32 shares first, and under ``"bf16"`` products each block's partial sums
    over the values are rounded to bfloat16 before their next product); inputs in ``dtype``."""
    widest = max(16, next_pow2(shape[3]))
    for prec in precisions:
        launch = dplr_kernel_launches(shape, device, prec, dtype)
        for name in DPLR_KERNELS:
            want = launch[name](td.ScanTiles())
            for n, bv in itertools.product(warps, [bv for bv in block_vs if bv is None or bv <= widest]):
                tiles = td.ScanTiles(chunk_warps=n, chunk_block_v=bv)
                try:
                    got = launch[name](tiles)
                except Exception as e:  # noqa: BLE001 - a configuration that cannot run is a row, not the end
                    yield name, prec, n, bv, None, _one_line(e)
                    continue
                err = max(_rel(x, y) for x, y in zip(got, want))
                if err > (1e-3 if bv is None else 1e-2):
                    yield name, prec, n, bv, None, f"differs from the defaults: relative error {err:.1e}"
                    continue
                ms = time_ms(lambda: launch[name](tiles), warmup=10, rep=40, device=device)
                yield name, prec, n, bv, ms, ""


def time_dplr_calls(shape, device, chunks, precisions, dtype=torch.bfloat16):
    """Yield ``(chunk, precision, forward ms, forward + backward ms, relative error)`` of
    ``dplr_delta_rule(backend="triton_chunk")`` at ``shape`` (inputs in ``dtype``, RWKV-7's bound): first at its
    defaults (``chunk`` and ``precision`` ``None``), then at each chunk x ``ScanTiles.precision``; the error
    is the largest over the output and every gradient against the defaults' (0 for the defaults)."""
    xs = [x.requires_grad_() for x in op_inputs("dplr", *shape, dtype, device)]
    do = torch.randn(xs[2].shape, device=device, dtype=xs[2].dtype)

    def run(fn):
        with torch.no_grad():
            fwd = time_ms(lambda: fn(*xs), warmup=10, rep=40, device=device)
        both = time_ms(lambda: torch.autograd.grad(fn(*xs), xs, do), warmup=10, rep=40, device=device)
        o = fn(*xs)
        return fwd, both, [o.detach().float(), *(g.float() for g in torch.autograd.grad(o, xs, do))]

    fwd, both, want = run(call("dplr", "triton_chunk"))
    yield None, None, fwd, both, 0.0
    for C, prec in itertools.product(chunks, precisions):
        tiles = td.ScanTiles(precision=prec)
        fn = lambda *t, C=C, tiles=tiles: td.dplr_delta_rule(  # noqa: E731
            *t, lower_bound=DPLR_LOWER_BOUND, chunk=C, tiles=tiles
        )
        try:
            fwd, both, got = run(fn)
        except Exception as e:  # noqa: BLE001 - a configuration that cannot run is a row, not the end
            yield C, prec, None, None, _one_line(e)
            continue
        yield C, prec, fwd, both, max(_rel(a, b) for a, b in zip(got, want))


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"error: {what} must be comma-separated ints, got {text!r}") from None
    return values


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops delta-probe", description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("kernels", "grid", "dplr"), help="what to probe (see the module docstring)")
    p.add_argument("--shape", default="8x2048x16x128", help="BxLxHxD (default 8x2048x16x128)")
    p.add_argument("--tiles", default="precision=bf16", help="ChunkTiles fields (default precision=bf16)")
    p.add_argument("--kernel", choices=KERNELS, help="grid: the kernel to launch at each configuration")
    p.add_argument("--warps", default="4,8", help="grid, dplr: comma-separated num_warps (default 4,8)")
    p.add_argument("--stages", default="1,2,3,4", help="grid, dplr: comma-separated num_stages (default 1,2,3,4)")
    p.add_argument("--block-v", default="16,32,64", help="dplr: comma-separated block_v (default 16,32,64)")
    p.add_argument("--chunks", default="16,32,64", help="dplr: comma-separated chunk sizes (default 16,32,64)")
    p.add_argument(
        "--chunk-block-v",
        default="",
        help="dplr: comma-separated chunk_block_v of the per-chunk kernels (default theirs)",
    )
    p.add_argument(
        "--precisions", default="tf32x3,tf32", help="dplr: comma-separated ScanTiles precisions (default tf32x3,tf32)"
    )
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="dplr: the inputs' dtype (default bf16)")
    args = p.parse_args(argv)
    shape, tiles = parse_shape(args.shape), chunk_tiles(args.tiles)
    if args.part == "grid" and args.kernel is None:
        raise SystemExit(f"error: grid needs --kernel, one of {', '.join(KERNELS)}")
    warps, stages, block_vs, chunks = (
        _ints(args.warps, "--warps"),
        _ints(args.stages, "--stages"),
        _ints(args.block_v, "--block-v"),
        _ints(args.chunks, "--chunks"),
    )
    chunk_block_vs = _ints(args.chunk_block_v, "--chunk-block-v") if args.chunk_block_v else (None,)
    precisions = tuple(args.precisions.split(","))
    if torch.cuda.is_available():
        device = "cuda"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        device = "cpu"
    else:
        raise SystemExit("error: the delta probe needs a CUDA GPU (or TRITON_INTERPRET=1 on the CPU)")
    on = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    if args.part == "dplr":
        where, dtype = f"{'x'.join(map(str, shape))} {args.dtype} on {on}", DTYPES[args.dtype]
        for bv, w, st, fwd, bwd, note in probe_dplr(shape, device, block_vs, warps, stages, dtype):
            result = f"forward {fwd:.4f} backward {bwd:.4f} ms" if fwd is not None else note
            print(f"delta-probe dplr scan {where} block_v={bv} warps={w} stages={st}: {result}", flush=True)
        for C, prec, fwd, both, err in time_dplr_calls(shape, device, chunks, precisions, dtype):
            what = "defaults" if C is None else f"chunk={C} precision={prec}"
            result = f"forward {fwd:.4f} fwd+bwd {both:.4f} ms, vs defaults {err:.1e}" if fwd is not None else err
            print(f"delta-probe dplr call {where} {what}: {result}", flush=True)
        for name, prec, n, bv, ms, note in probe_dplr_kernels(shape, device, warps, precisions, chunk_block_vs, dtype):
            result = f"{ms:.4f} ms" if ms is not None else note
            what = f"{name} precision={prec} chunk_warps={n}" + ("" if bv is None else f" chunk_block_v={bv}")
            print(f"delta-probe dplr kernel {where} {what}: {result}", flush=True)
        return
    try:
        tiles.resolve(shape[1], shape[3], shape[3], torch.bfloat16)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    where = f"{'x'.join(map(str, shape))} [{args.tiles}] on {on}"
    if args.part == "kernels":
        rows = probe_kernels(shape, tiles, device)
        print(f"delta-probe kernels {where}: " + "  ".join(f"{n} {ms:.4f}" for n, ms in rows) + " ms", flush=True)
        return
    for w, s, ms, note in probe_grid(shape, tiles, device, args.kernel, warps, stages):
        result = f"{ms:.4f} ms" if ms is not None else note
        print(f"delta-probe grid {where} {args.kernel} warps={w} stages={s}: {result}", flush=True)


if __name__ == "__main__":
    main()
