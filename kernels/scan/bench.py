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
import json
import math
from pathlib import Path

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
        kind = ts.kernel_kind(B, L, D, block2, grad)
        tile = ts.tile_of(kind, L, D, block2, grad)
        parts.append(f"{'bwd' if grad else 'fwd'} {KIND_NAMES[kind]} {tile_desc(kind, tile)}")
    return ", ".join(parts)


KIND_NAMES = {"loop": "loop", "lookback": "look-back", "seg": "seg look-back"}


def tile_desc(kind: str, tile: tuple) -> str:
    """``CHxBD/warps[/stages]``; segmented: ``CHxNSUBxBD/warps/stages``."""
    if kind == "seg":
        return f"{tile[0]}x{tile[1]}x{tile[2]}/{tile[3]}/{tile[4]}"
    return f"{tile[0]}x{tile[1]}/{tile[2]}" + (f"/{tile[3]}" if kind == "loop" else "")


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
# (triton_scan.config); "loop": (CH, BD, num_warps, stages) of the chunk-loop kernels (loop_config); "seg":
# (CH, NSUB, BD, num_warps, stages) of the segmented look-back kernel (seg_config); knobs:
# overrides of triton_scan's module knobs for that entry: "win" (LOOKBACK_WINDOW, records per diagonal
# look-back step), "one" (ONE_RECORD_FROM_LANE_TILES; ALL: the window at every shape), "spec" (SPECIALIZE_D).
# Earlier H200 sweeps (benchmarks/scan.md): 06:08 and 07:43 (look-back, 64-128-step chunks, 2-8 warps),
# 09:24 (look-back, 16-64-step chunks with BD = 32 * warps, 1-4 warps, windows 1-16, lazy aggregates),
# 09:39 (windows and D specialization at 64 x 64), 10:47 (chunk-loop tiles: 16-64 steps, 16-64 channels,
# 1-2 warps, 3-6 stages; 2x2 chunk loop), 10:58 (chunk-loop tiles around the 10:47 best, 16-channel 2x2
# loop tiles, and a persistent look-back kernel since removed: 1.3-1.5x slower). This list: the shipped
# tiles and their nearest neighbours.
ALL = 10**9
SWEEP = [("lookback", (64, 64, 2), {}), ("loop", (64, 32, 1, 3), {}), ("loop", (64, 32, 1, 4), {}),
         ("loop", (32, 32, 1, 4), {}), ("loop", (32, 16, 1, 4), {}), ("loop", (64, 16, 1, 3), {})]
#: Few lanes (one long sequence): the look-back kernels (a chunk loop runs 8 programs here) and the
#: segmented look-back kernel: segments of 128-1024 steps x 32-128 channels (64-512 KB of c and x:
#: how many segments in flight fit in the 50 MB L2 for the second pass), 1-4 warps, 2-4 stages.
#: The second pass hits in L2 only while the segments in flight (programs per SM, bounded by shared
#: memory: (stages - 1) x CH x BD x 8 bytes forward, x 12 backward, times 132 SMs) fit: deep pipelines
#: on 16-32-step sub-chunks bound the programs per SM and keep many bytes in flight per program.
SWEEP_FEW_LANES = [("lookback", (64, 64, 2), {}), ("lookback", (32, 64, 2), {}),
                   ("seg", (32, 4, 64, 2, 6), {}), ("seg", (32, 4, 64, 2, 4), {}), ("seg", (32, 8, 64, 2, 4), {}),
                   ("seg", (32, 8, 64, 2, 6), {}), ("seg", (32, 16, 64, 2, 6), {}), ("seg", (16, 8, 64, 2, 8), {}),
                   ("seg", (16, 8, 64, 2, 12), {}), ("seg", (16, 16, 64, 2, 12), {}), ("seg", (16, 16, 64, 2, 4), {}),
                   ("seg", (16, 8, 128, 4, 8), {}), ("seg", (16, 4, 128, 4, 8), {}), ("seg", (64, 2, 64, 2, 3), {}),
                   ("seg", (64, 4, 64, 2, 3), {}), ("seg", (32, 8, 32, 1, 6), {}), ("seg", (16, 16, 32, 1, 12), {})]
SWEEP_BLOCK2 = [("lookback", (16, 64, 2), {}), ("lookback", (16, 32, 1), {}),
                ("loop", (16, 32, 1, 3), {}), ("loop", (32, 16, 1, 3), {}), ("loop", (16, 16, 1, 4), {})]
#: Shapes with fewer lanes, for the rule that picks the kernel kind (triton_scan.LOOP_FROM_LANE_TILES):
#: 64 and 128 lane tiles of 32 channels.
DISPATCH_SHAPES = [(2, 16384, 1024), (4, 8192, 1024)]
SWEEP_DISPATCH = [("lookback", (64, 64, 2), {}), ("loop", (64, 32, 1, 3), {}), ("loop", (64, 16, 1, 3), {})]
FEW_LANES = 16  # lane tiles of 32 channels below which a shape gets SWEEP_FEW_LANES
KNOBS = {"win": "LOOKBACK_WINDOW", "one": "ONE_RECORD_FROM_LANE_TILES", "spec": "SPECIALIZE_D"}


def _entries(shape, block2: bool):
    """The sweep entries for one shape (see ``SWEEP``)."""
    if block2:
        return SWEEP_BLOCK2
    if shape in DISPATCH_SHAPES:
        return SWEEP_DISPATCH
    B, _, D = shape
    return SWEEP_FEW_LANES if B * -(-D // 32) < FEW_LANES else SWEEP


CONFIG_OF = {"lookback": "config", "loop": "loop_config", "seg": "seg_config"}


def sweep(dev: str, shapes=None) -> list[BenchRow]:
    """Time the Triton scan's kernels and tiles (``SWEEP``): the forward kernel (``fwd``) and the backward
    kernel alone (``bwd``: ``dx`` and ``dc`` from ``c, y, dy``), each checked first (poisoned outputs)
    against the float64 reference; ``rel err`` is the larger of the two checks. ``shapes``: the shapes to
    sweep (default: all benchmark and dispatch shapes); each row is printed as soon as it is timed."""
    rows = []
    saved = {k: getattr(ts, k) for k in (*CONFIG_OF.values(), "LOOP_FROM_LANE_TILES", "SEG_BELOW_LANE_TILES",
                                         *KNOBS.values())}
    if shapes is None:
        shapes = SHAPES + DISPATCH_SHAPES + [("2x2",) + s for s in BLOCK2_SHAPES]
    try:
        for shape in shapes:
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
                ts.SEG_BELOW_LANE_TILES = ALL if kind == "seg" else 0
                setattr(ts, CONFIG_OF[kind], lambda *a, tile=tile, **k: tile)
                for k, v in over.items():
                    setattr(ts, KNOBS[k], v)
                fields = {"loop": "CH,BD,warps,stages", "seg": "CH,NSUB,BD,warps,stages"}.get(kind, "CH,BD,warps")
                impl = f"{kind} {fields}={tile}"
                impl += "".join(f" {k}={v}" for k, v in over.items())
                err_f = rel_error(_poisoned(lambda: fn(c, x)), y_ref)
                dc, dx = _poisoned(lambda: ts._backward(c, y, dy, False, block2))
                err_b = max(rel_error(dx, dx_ref), rel_error(dc, dc_ref))
                rows.append(BenchRow("scan", impl, name, "fwd", "float32", time_ms(lambda: fn(c, x)), max_rel_err=err_f))
                rows.append(BenchRow("scan", impl, name, "bwd", "float32",
                                     time_ms(lambda: ts._backward(c, y, dy, False, block2)), max_rel_err=err_b))
                print(f"{name} {impl}: fwd {rows[-2].ms:.4f} ms, bwd {rows[-1].ms:.4f} ms, "
                      f"rel err {max(err_f, err_b):.1e}", flush=True)
                del dc, dx
            del y_ref, dx_ref, dc_ref
            torch.cuda.empty_cache()
    finally:
        for k, v in saved.items():
            setattr(ts, k, v)
    return rows


def best_seg_tiles(folder: str) -> tuple[str | None, str | None]:
    """Per direction (forward, backward kernel) of the newest ``scan-sweep-*.json`` in ``folder``, at
    the shape with the most segmented rows: the fastest clean (rel err < 1e-5) segmented tile as
    ``"CH,NSUB,BD,warps,stages"``, or ``"off"`` where a look-back tile was faster; ``None`` without a
    sweep (then ``seg_config``'s tiles run)."""
    files = sorted(Path(folder).glob("scan-sweep-*.json"))
    if not files:
        return None, None
    rows = [r for r in json.loads(files[-1].read_text())["rows"] if r["max_rel_err"] < 1e-5]
    seg_rows = [r for r in rows if r["impl"].startswith("seg ") and " win=" not in r["impl"]]
    if not seg_rows:
        return None, None
    shape = max({r["shape"] for r in seg_rows}, key=lambda sh: sum(r["shape"] == sh for r in seg_rows))
    out = []
    for d in ("fwd", "bwd"):
        best = min((r for r in seg_rows if r["shape"] == shape and r["direction"] == d), key=lambda r: r["ms"])
        lb = [r["ms"] for r in rows if r["impl"].startswith("lookback") and r["shape"] == shape and r["direction"] == d]
        tile = best["impl"].split("=")[1].strip("()").replace(" ", "")
        out.append("off" if lb and min(lb) <= best["ms"] else tile)
    return out[0], out[1]


def _override_seg(fwd: str | None, bwd: str | None) -> None:
    """``--seg`` / ``--seg-bwd``: the segmented kernel's tile per direction (``None``: ``seg_config``'s),
    or ``"off"``: that direction runs the look-back kernel instead (``triton_scan.use_seg``)."""
    shipped_cfg, shipped_use = ts.seg_config, ts.use_seg
    spec = {False: fwd, True: bwd}

    def seg_config(L, D, grad=False):
        s = spec[grad]
        return tuple(int(v) for v in s.split(",")) if s and s != "off" else shipped_cfg(L, D, grad)

    def use_seg(B, L, D, block2, grad=False):
        return spec[grad] != "off" and shipped_use(B, L, D, block2, grad)

    ts.seg_config, ts.use_seg = seg_config, use_seg


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels.bench scan", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes, fewer implementations")
    p.add_argument("--out", default="benchmarks", help="folder for the JSON (default: benchmarks)")
    p.add_argument("--sweep", action="store_true", help="also time the tile configurations (tuning)")
    p.add_argument("--sweep-only", action="store_true", help="only the sweep (no main table)")
    p.add_argument("--sweep-shapes", help="the sweep's shapes, 'B,L,D;B,L,D' (default: all)")
    p.add_argument("--seg", metavar="TILE|off", help="segmented look-back tile CH,NSUB,BD,warps,stages for "
                   "the forward kernel (default: seg_config), or 'off' (the look-back kernel instead)")
    p.add_argument("--seg-bwd", metavar="TILE|off", help="the same for the backward kernel")
    p.add_argument("--seg-from-sweep", metavar="DIR", help="--seg and --seg-bwd from the newest scan-sweep "
                   "JSON in DIR (best_seg_tiles)")
    args = p.parse_args(argv)
    if args.seg_from_sweep:
        args.seg, args.seg_bwd = best_seg_tiles(args.seg_from_sweep)
        print(f"segmented tiles from the sweep: fwd {args.seg}, bwd {args.seg_bwd}")
    if not torch.cuda.is_available():
        raise SystemExit("error: the scan benchmark needs a CUDA GPU (the Triton scan runs on CPU only in tests)")
    dev = "cuda"
    if args.seg or args.seg_bwd:
        _override_seg(args.seg, args.seg_bwd)
    if args.sweep_only:
        shapes = None
        if args.sweep_shapes:
            shapes = [tuple(int(v) for v in part.split(",")) for part in args.sweep_shapes.split(";")]
        env = environment(dev)
        sw = sweep(dev, shapes)
        print_table(sw)
        print("written:", write_json("scan-sweep", sw, env, args.out))
        return
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
