"""``python -m benchmarks.ops scan [--quick] [--sweep]``: the linear scans against their limit and peer.

Per shape ``(B, L, D)`` (scan along ``L``, float32): ``torch.add(c, x, out=y)`` on the same bytes (the
bandwidth limit: a forward scan reads ``c`` and ``x`` and writes ``y``, 12 B per element; forward +
backward moves 32), our Triton scan (``seqkernels.scan``, ``backend="triton"``), ``accelerated-scan``
(its Triton scan, in its native ``(B, D, L)`` layout) when installed, and our torch log-step scan
(forward); forward and forward + backward. The 2x2-block scan at one shape. Every implementation is
checked first against float64 (outputs poisoned with NaN; gradients against the analytic adjoint:
``dx`` = reverse scan of ``dy`` with ``c_{t+1}``, ``dc = dx y_{t-1}``). ``--sweep`` also times the
forward kernel and the backward kernel alone for the default tiles and their neighbours (``ScanTiles``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import torch

from benchmarks.ops.common import (
    BenchRow,
    Impl,
    Problem,
    cli_common,
    environment,
    finish,
    fwd_bwd,
    no_grad,
    rel_error,
    run,
    time_ms,
    write_json,
)
from seqkernels._triton import poisoned
from seqkernels.scan import linear_scan_block2_torch, linear_scan_torch
from seqkernels.scan import triton_ops as ts

SHAPES = [(8, 4096, 1024), (8, 16384, 1024), (1, 65536, 256)]
BLOCK2_SHAPES = [(8, 4096, 512)]
QUICK_SHAPES = [(2, 4096, 256), (1, 16384, 64)]
QUICK_BLOCK2 = [(2, 2048, 128)]

#: Tile sweep: per shape class, the default tile and its nearest neighbours (kind, CH, BD, warps, extra fields).
SWEEP_MANY_LANES = [
    ("loop", 64, 32, 1, {}),
    ("loop", 64, 32, 1, {"stages": 4}),
    ("loop", 32, 32, 1, {"stages": 4}),
    ("loop", 64, 16, 1, {}),
    ("lookback", 64, 64, 2, {}),
]
SWEEP_FEW_LANES = [
    ("lookback", 64, 64, 2, {"window": 4}),
    ("lookback", 64, 64, 2, {"window": 1}),
    ("lookback", 32, 64, 2, {"window": 4}),
    ("lookback", 64, 32, 1, {"window": 4}),
    ("lookback", 64, 64, 2, {"window": 4, "maxnreg": 168}),
]
SWEEP_BLOCK2 = [
    ("lookback", 16, 64, 2, {}),
    ("lookback", 16, 32, 1, {}),
    ("loop", 16, 32, 1, {}),
    ("loop", 32, 16, 1, {}),
]


def _shift_next(c: torch.Tensor) -> torch.Tensor:
    """``c_{t+1}`` at every ``t`` (zero at the end), along dim 1."""
    return torch.cat([c[:, 1:], torch.zeros_like(c[:, :1])], dim=1)


def _shift_prev(y: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)


def reference(c, x, dy, block2: bool):
    """float64 ``y`` and the analytic gradients ``(dx, dc)``."""
    c64, x64, dy64 = c.double(), x.double(), dy.double()
    if not block2:
        y = linear_scan_torch(c64, x64)
        dx = linear_scan_torch(_shift_next(c64), dy64, reverse=True)
        return y, dx, dx * _shift_prev(y)
    y = linear_scan_block2_torch(c64, x64)
    dx = linear_scan_block2_torch(_shift_next(c64).transpose(2, 3).contiguous(), dy64, reverse=True)
    return y, dx, dx.unsqueeze(3) * _shift_prev(y).unsqueeze(2)  # dC[i, j] = dx[i] y_{t-1}[j]


def kernel_note(B: int, L: int, D: int, block2: bool) -> str:
    """The kernel kind and tile the default dispatch runs, forward and backward."""
    parts = []
    for grad in (False, True):
        t = ts.default_tiles(B, L, D, block2, grad)
        tile = f"{t.ch}x{t.bd}/{t.warps}" + (f"/{t.stages}" if t.kind == "loop" else "")
        parts.append(f"{'bwd' if grad else 'fwd'} {t.kind} {tile}")
    return ", ".join(parts)


def _inputs(B, L, D, block2, dev, seed):
    gen = torch.Generator(device=dev).manual_seed(seed)
    if block2:
        c = (torch.rand((B, L, 2, 2, D), device=dev, generator=gen) - 0.5) * 0.9
        c[:, :, 0, 0] += 0.5
        c[:, :, 1, 1] += 0.5
        x = torch.randn((B, L, 2, D), device=dev, generator=gen)
    else:
        c = torch.rand((B, L, D), device=dev, generator=gen) * 0.2 + 0.8  # decays in [0.8, 1.0)
        x = torch.randn((B, L, D), device=dev, generator=gen)
    return c, x, torch.randn(x.shape, device=dev, generator=gen)


def _check(fn, c, x, dy, ref) -> float:
    """Max relative error of ``y, dx, dc`` of ``fn`` (outputs poisoned) against ``ref``."""
    cc, xx = c.detach().requires_grad_(), x.detach().requires_grad_()
    with poisoned():
        y = fn(cc, xx)
        gc, gx = torch.autograd.grad(y, (cc, xx), dy)
    return max(rel_error(y, ref[0]), rel_error(gx, ref[1]), rel_error(gc, ref[2]))


def problem(shape, block2: bool, add_bw: list[float], quick: bool, dev: str) -> Problem:
    B, L, D = shape
    n = 4 * B * L * D  # bytes of one float32 (B, L, D) tensor
    # forward: c, x -> y; backward: c, y, dy -> dx, dc (2x2: C has 4 and x, y 2 such tensors)
    fwd_bytes, fb_bytes = ((4 + 2 + 2) * n, (8 + 4 + 2 + 2 + 2 + 4) * n) if block2 else (3 * n, 8 * n)
    dims = {"kind": "2x2" if block2 else "diag", "batch": B, "length": L, "dim": D}
    pb = Problem("scan", dims, "float32", impls=None)

    def impls():
        c, x, dy = _inputs(B, L, D, block2, dev, 1 if block2 else 0)
        ref = reference(c, x, dy, block2)
        out = []
        if not block2:
            y = torch.empty_like(x)
            t_add = time_ms(lambda: torch.add(c, x, out=y))
            add_bw.append(fwd_bytes / (t_add * 1e-3) / 1e9)
            out.append(Impl("torch.add (same bytes)", lambda: torch.add(c, x, out=y), note=f"{add_bw[-1]:.0f} GB/s"))
        bw = add_bw[-1] if not block2 else max(add_bw, default=math.nan)
        pb.limits.update({"fwd": fwd_bytes / bw / 1e6, "fwd+bwd": fb_bytes / bw / 1e6})
        ours = ts.linear_scan_block2_triton if block2 else ts.linear_scan_triton
        out.append(
            Impl(
                "ours-triton",
                no_grad(ours, c, x),
                fwd_bwd(ours, [c, x], dy),
                lambda: _check(ours, c, x, dy, ref),
                note=kernel_note(B, L, D, block2),
            )
        )
        if not block2:
            try:
                from accelerated_scan.scalar import scan as acc_scan
            except Exception as e:  # noqa: BLE001
                out.append(Impl("accelerated-scan", None, note=f"skipped: {e}"))
            else:
                ct, xt, dyt = (t.transpose(1, 2).contiguous() for t in (c, x, dy))
                layout = lambda fn: (
                    lambda c_, x_: fn(
                        c_.transpose(1, 2).contiguous(),  # noqa: E731
                        x_.transpose(1, 2).contiguous(),
                    ).transpose(1, 2)
                )
                out.append(
                    Impl(
                        "accelerated-scan",
                        no_grad(acc_scan, ct, xt),
                        fwd_bwd(acc_scan, [ct, xt], dyt),
                        lambda: _check(layout(acc_scan), c, x, dy, ref),
                        note="(B, D, L) layout",
                    )
                )
        if not quick:
            torch_fn = linear_scan_block2_torch if block2 else linear_scan_torch
            out.append(
                Impl(
                    "ours-torch",
                    no_grad(torch_fn, c, x),
                    None,
                    lambda: rel_error(torch_fn(c, x), ref[0]),
                    time_kw={"rep": 50},
                )
            )
        return out

    pb.impls = impls
    return pb


def sweep(dev: str, quick: bool) -> list[BenchRow]:
    """Forward kernel and backward kernel alone (``dx, dc`` from ``c, y, dy``) per tile, each checked
    (poisoned outputs) against float64 first."""
    rows = []
    shapes = [(s, False) for s in (QUICK_SHAPES if quick else SHAPES)] + [
        (s, True) for s in (QUICK_BLOCK2 if quick else BLOCK2_SHAPES)
    ]
    for (B, L, D), block2 in shapes:
        c, x, dy = _inputs(B, L, D, block2, dev, 2)
        if block2:
            c = c * 0.5
        y_ref, dx_ref, dc_ref = reference(c, x, dy, block2)
        y = y_ref.float()
        few = B * -(-D // 32) < 16
        entries = SWEEP_BLOCK2 if block2 else SWEEP_FEW_LANES if few else SWEEP_MANY_LANES
        dims = {"kind": "2x2" if block2 else "diag", "batch": B, "length": L, "dim": D}
        for kind, ch, bd, warps, over in entries:
            tiles = ts.ScanTiles(kind, ch, bd, warps, **over)
            name = f"{kind} {ch}x{bd}/{warps}" + "".join(f" {k}={v}" for k, v in over.items())
            try:
                with poisoned():
                    err_f = rel_error(ts.scan_forward(c, x, False, block2, tiles), y_ref)
                    dc, dx = ts.scan_backward(c, y, dy, False, block2, tiles)
                    err_b = max(rel_error(dx, dx_ref), rel_error(dc, dc_ref))
                del dc, dx
                for direction, thunk, err in (
                    ("fwd", lambda: ts.scan_forward(c, x, False, block2, tiles), err_f),
                    ("bwd", lambda: ts.scan_backward(c, y, dy, False, block2, tiles), err_b),
                ):
                    rows.append(
                        BenchRow(
                            "scan",
                            name,
                            direction,
                            "float32",
                            dims,
                            time_ms(thunk),
                            max_rel_err=err,
                            section="sweep",
                            extra=dataclasses.asdict(tiles),
                        )
                    )
            except Exception as e:  # noqa: BLE001 - e.g. a tile that does not compile
                rows.append(
                    BenchRow(
                        "scan",
                        name,
                        "fwd",
                        "float32",
                        dims,
                        math.nan,
                        section="sweep",
                        note=f"failed: {type(e).__name__}: {e}"[:200],
                    )
                )
        del y_ref, dx_ref, dc_ref
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops scan", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small shapes, no torch rows")
    p.add_argument("--sweep", action="store_true", help="also time the tiles (section 'sweep')")
    cli_common(p)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: the scan benchmark needs a CUDA GPU (the Triton scan runs on the CPU only in tests)")
    add_bw: list[float] = []
    problems = [problem(s, False, add_bw, args.quick, "cuda") for s in (QUICK_SHAPES if args.quick else SHAPES)]
    problems += [problem(s, True, add_bw, args.quick, "cuda") for s in (QUICK_BLOCK2 if args.quick else BLOCK2_SHAPES)]
    env = environment("cuda")
    rows = run(problems, warm_only=args.warm_only, checkpoint=lambda rows: write_json("scan", rows, env, args.out))
    if args.sweep and not args.warm_only:
        rows += sweep("cuda", args.quick)
    finish("scan", rows, env, args, baseline="accelerated-scan")


if __name__ == "__main__":
    main()
