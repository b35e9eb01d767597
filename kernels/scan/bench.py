"""``python -m kernels.bench scan [--quick] [--out DIR]``: time the linear scans against their limits.

Per shape ``(B, L, D)`` (scan along ``L``, float32): ``torch.add(c, x, out=y)`` on the same bytes
(the bandwidth limit: a forward scan reads ``c`` and ``x`` and writes ``y``), our Triton scan,
``accelerated-scan`` (its Triton scan, in its native ``(B, D, L)`` layout) when installed, and our
torch log-step scan; forward and forward+backward. The 2x2-block scan is timed at one shape.
Every implementation is checked against the float64 reference before it is timed (our Triton
outputs poisoned with NaN first); the gradients of the Triton backward against the analytic
adjoint computed in float64. Writes ``benchmarks/scan-<device>-<date>.json``.
"""

from __future__ import annotations

import argparse
import math

import torch

from kernels.bench import BenchRow, environment, print_table, rel_error, time_ms, write_json
from kernels.scan import triton_scan as ts
from kernels.scan.torch_scan import linear_scan_block2_torch, linear_scan_torch

SHAPES = [(8, 4096, 1024), (8, 16384, 1024), (1, 65536, 256)]
BLOCK2_SHAPES = [(8, 4096, 512)]
QUICK_SHAPES = [(2, 4096, 256), (1, 16384, 64)]
QUICK_BLOCK2 = [(2, 2048, 128)]


def _shift_next(c: torch.Tensor) -> torch.Tensor:
    """``c_{t+1}`` at every ``t`` (zero at the end), along dim 1."""
    return torch.cat([c[:, 1:], torch.zeros_like(c[:, :1])], dim=1)


def _shift_prev(y: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)


def reference_diag(c, x, dy):
    """float64 forward and analytic gradients: ``dx = reverse scan of dy with c_{t+1}``, ``dc = dx y_{t-1}``."""
    c64, x64, dy64 = c.double(), x.double(), dy.double()
    y = linear_scan_torch(c64, x64)
    dx = linear_scan_torch(_shift_next(c64), dy64, reverse=True)
    return y, dx, dx * _shift_prev(y)


def reference_block2(C, x, dy):
    C64, x64, dy64 = C.double(), x.double(), dy.double()
    y = linear_scan_block2_torch(C64, x64)
    CT_next = _shift_next(C64).transpose(2, 3).contiguous()
    dx = linear_scan_block2_torch(CT_next, dy64, reverse=True)
    dC = dx.unsqueeze(3) * _shift_prev(y).unsqueeze(2)  # dC[i, j] = dx[i] y_{t-1}[j]
    return y, dx, dC


def _poisoned(fn):
    saved = ts._alloc
    ts._alloc = lambda like: torch.full_like(like, math.nan)
    try:
        return fn()
    finally:
        ts._alloc = saved


def _fwd_bwd(fn, c, x, dy):
    c = c.detach().requires_grad_()
    x = x.detach().requires_grad_()

    def run():
        y = fn(c, x)
        return torch.autograd.grad(y, (c, x), dy)

    return run


def kernel_note(B: int, L: int, D: int, block2: bool) -> str:
    """Which kernel kind and tile the shipped dispatch runs, forward and backward (``triton_scan``)."""
    parts = []
    for grad in (False, True):
        loop = ts.use_loop(B, L, D, block2, grad)
        tile = ts.loop_config(L, D, block2, grad) if loop else ts.config(L, D, block2, grad)
        desc = f"{tile[0]}x{tile[1]}/{tile[2]}" + (f"/{tile[3]}" if loop else "")  # CH x BD / warps / stages
        parts.append(f"{'bwd' if grad else 'fwd'} {'loop' if loop else 'look-back'} {desc}")
    return ", ".join(parts)


def bench_diag(shape, rows, dev, add_bw, quick):
    B, L, D = shape
    name = f"({B}, {L}, {D})"
    gen = torch.Generator(device=dev).manual_seed(0)
    c = torch.rand(shape, device=dev, generator=gen) * 0.2 + 0.8  # decays in [0.8, 1.0)
    x = torch.randn(shape, device=dev, generator=gen)
    dy = torch.randn(shape, device=dev, generator=gen)
    nbytes = 4 * c.numel()
    fwd_bytes, fb_bytes = 3 * nbytes, (3 + 5) * nbytes  # fwd: c, x -> y; bwd: c, y, dy -> dx, dc
    y_ref, dx_ref, dc_ref = reference_diag(c, x, dy)

    y = torch.empty_like(x)
    t_add = time_ms(lambda: torch.add(c, x, out=y))
    bw = fwd_bytes / (t_add * 1e-3) / 1e9
    add_bw.append(bw)
    rows.append(BenchRow("scan", "torch.add (same bytes)", name, "fwd", "float32", t_add, t_add, note=f"{bw:.0f} GB/s"))
    lim_f, lim_fb = t_add, t_add * fb_bytes / fwd_bytes

    # ours, Triton: check (poisoned outputs) then time
    def ours_check():
        cc, xx = c.detach().requires_grad_(), x.detach().requires_grad_()
        out = ts.linear_scan_triton(cc, xx)
        gc, gx = torch.autograd.grad(out, (cc, xx), dy)
        return out, gc, gx

    out, gc, gx = _poisoned(ours_check)
    err = max(rel_error(out, y_ref), rel_error(gx, dx_ref), rel_error(gc, dc_ref))
    t = time_ms(lambda: ts.linear_scan_triton(c, x))
    rows.append(BenchRow("scan", "ours triton", name, "fwd", "float32", t, lim_f, rel_error(out, y_ref),
                         note=f"{fwd_bytes / (t * 1e-3) / 1e9:.0f} GB/s; {kernel_note(B, L, D, False)}"))
    t = time_ms(_fwd_bwd(ts.linear_scan_triton, c, x, dy))
    rows.append(BenchRow("scan", "ours triton", name, "fwd+bwd", "float32", t, lim_fb, err))

    try:
        from accelerated_scan.scalar import scan as acc_scan
    except Exception as e:  # noqa: BLE001
        rows.append(BenchRow("scan", "accelerated-scan", name, "fwd", "float32", math.nan, lim_f, note=f"skipped: {e}"))
    else:
        ct, xt, dyt = (t_.transpose(1, 2).contiguous() for t_ in (c, x, dy))
        out = acc_scan(ct, xt).transpose(1, 2)
        t = time_ms(lambda: acc_scan(ct, xt))
        rows.append(BenchRow("scan", "accelerated-scan", name, "fwd", "float32", t, lim_f, rel_error(out, y_ref),
                             note=f"{fwd_bytes / (t * 1e-3) / 1e9:.0f} GB/s, (B, D, L) layout"))
        ctg, xtg = ct.requires_grad_(), xt.requires_grad_()
        gc, gx = torch.autograd.grad(acc_scan(ctg, xtg), (ctg, xtg), dyt)
        err = max(rel_error(gx.transpose(1, 2), dx_ref), rel_error(gc.transpose(1, 2), dc_ref))
        t = time_ms(_fwd_bwd(acc_scan, ct, xt, dyt))
        rows.append(BenchRow("scan", "accelerated-scan", name, "fwd+bwd", "float32", t, lim_fb, err))

    if not quick:
        out = linear_scan_torch(c, x)
        t = time_ms(lambda: linear_scan_torch(c, x), rep=50)
        rows.append(BenchRow("scan", "ours torch (log-step)", name, "fwd", "float32", t, lim_f, rel_error(out, y_ref)))
    del y_ref, dx_ref, dc_ref


def bench_block2(shape, rows, dev, add_bw, quick):
    B, L, D = shape
    name = f"2x2 ({B}, {L}, {D})"
    gen = torch.Generator(device=dev).manual_seed(1)
    C = (torch.rand((B, L, 2, 2, D), device=dev, generator=gen) - 0.5) * 0.9
    C[:, :, 0, 0] += 0.5
    C[:, :, 1, 1] += 0.5
    x = torch.randn((B, L, 2, D), device=dev, generator=gen)
    dy = torch.randn_like(x)
    n = B * L * D * 4
    fwd_bytes, fb_bytes = 8 * n, (8 + 14) * n  # fwd: C(4), x(2) -> y(2); bwd: C, y, dy -> dx, dC
    bw = max(add_bw) if add_bw else math.nan
    lim_f, lim_fb = fwd_bytes / bw / 1e6, fb_bytes / bw / 1e6
    y_ref, dx_ref, dC_ref = reference_block2(C, x, dy)

    def ours_check():
        cc, xx = C.detach().requires_grad_(), x.detach().requires_grad_()
        out = ts.linear_scan_block2_triton(cc, xx)
        gc, gx = torch.autograd.grad(out, (cc, xx), dy)
        return out, gc, gx

    out, gc, gx = _poisoned(ours_check)
    err = max(rel_error(out, y_ref), rel_error(gx, dx_ref), rel_error(gc, dC_ref))
    t = time_ms(lambda: ts.linear_scan_block2_triton(C, x))
    rows.append(BenchRow("scan", "ours triton", name, "fwd", "float32", t, lim_f, rel_error(out, y_ref),
                         note=f"{fwd_bytes / (t * 1e-3) / 1e9:.0f} GB/s; limit at the best torch.add bandwidth; "
                              f"{kernel_note(B, L, D, True)}"))
    t = time_ms(_fwd_bwd(ts.linear_scan_block2_triton, C, x, dy))
    rows.append(BenchRow("scan", "ours triton", name, "fwd+bwd", "float32", t, lim_fb, err))
    if not quick:
        out = linear_scan_block2_torch(C, x)
        t = time_ms(lambda: linear_scan_block2_torch(C, x), rep=50)
        rows.append(BenchRow("scan", "ours torch (log-step)", name, "fwd", "float32", t, lim_f, rel_error(out, y_ref)))


# Sweep entries: (kind, tile, knobs). kind "lookback": tile (CH, BD, num_warps) of the look-back kernels
# (triton_scan.config); "loop": (CH, BD, num_warps, stages) of the chunk-loop kernels (loop_config); knobs:
# overrides of triton_scan's module knobs for that entry: "win" (LOOKBACK_WINDOW, records per diagonal
# look-back step), "one" (ONE_RECORD_FROM_LANE_TILES; ALL: the window at every shape), "spec" (SPECIALIZE_D),
# "maxnreg" (LOOKBACK_MAXNREG, the look-back kernels' register cap).
# Earlier H200 sweeps (benchmarks/scan.md): 06:08 and 07:43 (look-back, 64-128-step chunks, 2-8 warps),
# 09:24 (look-back, 16-64-step chunks with BD = 32 * warps, 1-4 warps, windows 1-16, lazy aggregates),
# 09:39 (windows and D specialization at 64 x 64), 10:47 (chunk-loop tiles: 16-64 steps, 16-64 channels,
# 1-2 warps, 3-6 stages; 2x2 chunk loop), 10:58 (chunk-loop tiles around the 10:47 best, 16-channel 2x2
# loop tiles, and a persistent look-back kernel since removed: 1.3-1.5x slower), 11:29 (a segmented
# look-back kernel, 15 tiles at (1, 65536, 256), since removed: 1.19-2.9x slower forward, 1.30-3.4x
# backward; code in commit 17f0f6c), 11:32 (register caps of the look-back kernels at (1, 65536, 256):
# 168 5% faster forward, 3% slower backward, 128 spills; measured with a probe script of commit 6339148).
# This list: the shipped tiles and their nearest neighbours.
ALL = 10**9
SWEEP = [("lookback", (64, 64, 2), {}), ("loop", (64, 32, 1, 3), {}), ("loop", (64, 32, 1, 4), {}),
         ("loop", (32, 32, 1, 4), {}), ("loop", (32, 16, 1, 4), {}), ("loop", (64, 16, 1, 3), {})]
#: Few lanes (one long sequence): the look-back kernels only (a chunk loop runs 8 programs here).
SWEEP_FEW_LANES = [("lookback", (64, 64, 2), {}), ("lookback", (64, 64, 2), {"win": 1, "one": ALL}),
                   ("lookback", (32, 64, 2), {}), ("lookback", (64, 32, 1), {}),
                   ("lookback", (64, 64, 2), {"maxnreg": 168})]
SWEEP_BLOCK2 = [("lookback", (16, 64, 2), {}), ("lookback", (16, 32, 1), {}),
                ("loop", (16, 32, 1, 3), {}), ("loop", (32, 16, 1, 3), {}), ("loop", (16, 16, 1, 4), {})]
#: Shapes with fewer lanes, for the rule that picks the kernel kind (triton_scan.LOOP_FROM_LANE_TILES):
#: 64 and 128 lane tiles of 32 channels.
DISPATCH_SHAPES = [(2, 16384, 1024), (4, 8192, 1024)]
SWEEP_DISPATCH = [("lookback", (64, 64, 2), {}), ("loop", (64, 32, 1, 3), {}), ("loop", (64, 16, 1, 3), {})]
FEW_LANES = 16  # lane tiles of 32 channels below which a shape gets SWEEP_FEW_LANES
KNOBS = {"win": "LOOKBACK_WINDOW", "one": "ONE_RECORD_FROM_LANE_TILES", "spec": "SPECIALIZE_D",
         "maxnreg": "LOOKBACK_MAXNREG"}


def _entries(shape, block2: bool):
    """The sweep entries for one shape (see ``SWEEP``)."""
    if block2:
        return SWEEP_BLOCK2
    if shape in DISPATCH_SHAPES:
        return SWEEP_DISPATCH
    B, _, D = shape
    return SWEEP_FEW_LANES if B * -(-D // 32) < FEW_LANES else SWEEP


def sweep(dev: str) -> list[BenchRow]:
    """Time the Triton scan's kernels and tiles (``SWEEP``): the forward kernel (``fwd``) and the backward
    kernel alone (``bwd``: ``dx`` and ``dc`` from ``c, y, dy``), each checked first (poisoned outputs)
    against the float64 reference; ``rel err`` is the larger of the two checks."""
    rows = []
    saved = {k: getattr(ts, k) for k in ("config", "loop_config", "LOOP_FROM_LANE_TILES", *KNOBS.values())}
    try:
        for shape in SHAPES + DISPATCH_SHAPES + [("2x2",) + s for s in BLOCK2_SHAPES]:
            block2 = shape[0] == "2x2"
            B, L, D = shape[1:] if block2 else shape
            gen = torch.Generator(device=dev).manual_seed(2)
            if block2:
                c = torch.rand((B, L, 2, 2, D), device=dev, generator=gen) * 0.5
                x = torch.randn((B, L, 2, D), device=dev, generator=gen)
                fn, ref = ts.linear_scan_block2_triton, reference_block2
            else:
                c = torch.rand((B, L, D), device=dev, generator=gen) * 0.2 + 0.8
                x = torch.randn((B, L, D), device=dev, generator=gen)
                fn, ref = ts.linear_scan_triton, reference_diag
            dy = torch.randn_like(x)
            y_ref, dx_ref, dc_ref = ref(c, x, dy)
            y = y_ref.float()
            name = f"{'2x2 ' if block2 else ''}({B}, {L}, {D})"
            for kind, tile, over in _entries(shape, block2):
                for k, v in saved.items():
                    setattr(ts, k, v)
                ts.LOOP_FROM_LANE_TILES = 0 if kind == "loop" else ALL
                setattr(ts, "loop_config" if kind == "loop" else "config",
                        lambda L_, D_, b_, g_=False, tile=tile: tile)
                for k, v in over.items():
                    setattr(ts, KNOBS[k], v)
                impl = f"{kind} {'CH,BD,warps,stages' if kind == 'loop' else 'CH,BD,warps'}={tile}"
                impl += "".join(f" {k}={v}" for k, v in over.items())
                err_f = rel_error(_poisoned(lambda: fn(c, x)), y_ref)
                dc, dx = _poisoned(lambda: ts._backward(c, y, dy, False, block2))
                err_b = max(rel_error(dx, dx_ref), rel_error(dc, dc_ref))
                rows.append(BenchRow("scan", impl, name, "fwd", "float32", time_ms(lambda: fn(c, x)), max_rel_err=err_f))
                rows.append(BenchRow("scan", impl, name, "bwd", "float32",
                                     time_ms(lambda: ts._backward(c, y, dy, False, block2)), max_rel_err=err_b))
                del dc, dx
            del y_ref, dx_ref, dc_ref
            torch.cuda.empty_cache()
    finally:
        for k, v in saved.items():
            setattr(ts, k, v)
    return rows


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels.bench scan", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes, fewer implementations")
    p.add_argument("--out", default="benchmarks", help="folder for the JSON (default: benchmarks)")
    p.add_argument("--sweep", action="store_true", help="also time the tile configurations (tuning)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: the scan benchmark needs a CUDA GPU (the Triton scan runs on CPU only in tests)")
    dev = "cuda"
    rows: list[BenchRow] = []
    add_bw: list[float] = []
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        bench_diag(shape, rows, dev, add_bw, args.quick)
        torch.cuda.empty_cache()
    for shape in QUICK_BLOCK2 if args.quick else BLOCK2_SHAPES:
        bench_block2(shape, rows, dev, add_bw, args.quick)
    env = environment(dev)
    print(f"# scan benchmark on {env['device']}, {env['date']}; limit = torch.add on the same bytes")
    print_table(rows, baseline="accelerated-scan")
    print("written:", write_json("scan", rows, env, args.out))
    if args.sweep:
        sw = sweep(dev)
        print("# tile sweep")
        print_table(sw)
        print("written:", write_json("scan-sweep", sw, env, args.out))
