"""``python -m benchmarks.ops scan-probe {few,many,host,pieces}``: where the scan's time goes, against its peer.

The scan benchmark (``python -m benchmarks.ops scan``) gives one row per implementation; this tool
breaks the rows that miss their targets down (``seqkernels/scan/README.md`` quotes its output):

- ``few``: forward and backward kernels alone at the few-lane shape (1, 65536, 256) for a grid of
  look-back tiles (32-512 steps per chunk, 32-256 channels, 1-16 warps, look-back windows of 4 and 8
  records), against ``torch.add`` on the same bytes and accelerated-scan's forward;
- ``many``: the same for the chunk-loop tiles at (8, 4096, 1024) (32 or 64 steps, 16-64 channels,
  1-2 warps, 3-6 pipeline stages) and, for comparison, a few look-back tiles (which split the
  sequence), with the bandwidth limit of the backward (20 B per element);
- ``host``: forward + backward through ``torch.autograd.grad`` at (1, 65536, 256), ours and the
  peer's: ``do_bench`` (as the benchmark times it), the host's issue time per call in a loop of
  calls and the completion time, the same work replayed from a CUDA graph (the GPU's time alone), the
  issue time at a tiny shape, and a ``torch.profiler`` table of five calls;
- ``pieces``: host microseconds per call of each layer of the eager path (the kernel launch, the
  allocation, the custom autograd function, ``autograd.grad``) for ours and the peer's.

Every tile is checked against float64 before it is timed (outputs poisoned with NaN). Needs a CUDA
GPU and accelerated-scan.
"""

from __future__ import annotations

import argparse
import gc

import torch

from benchmarks.ops.common import fwd_bwd, graph_replay, issue_times, no_grad, rel_error, time_ms
from benchmarks.ops.scan import _inputs, reference
from seqkernels._triton import poisoned
from seqkernels.scan import triton_ops as ts

FEW = (1, 65536, 256)
MANY = (8, 4096, 1024)
TINY = (1, 256, 64)


def min_median_issue(fn, n: int, rounds: int = 5) -> str:
    hs = sorted(issue_times(fn, n)[0] for _ in range(rounds))
    return f"{hs[0]:.1f} / {hs[rounds // 2]:.1f} us (min / median of {rounds} rounds)"


def _peer():
    from accelerated_scan import scalar

    return scalar


def _tile_grid(shape, cfgs) -> None:
    c, x, dy = _inputs(*shape, False, "cuda", 0)
    y_ref, dx_ref, dc_ref = reference(c, x, dy, False)
    y = y_ref.float()
    out = torch.empty_like(x)
    t_add = time_ms(lambda: torch.add(c, x, out=out))
    peer = _peer()
    ct, xt, dyt = (t.transpose(1, 2).contiguous() for t in (c, x, dy))
    t_pf = time_ms(no_grad(peer.scan, ct, xt))
    t_pfb = time_ms(fwd_bwd(peer.scan, [ct, xt], dyt))
    bwd_limit = t_add * 20 / 12  # the backward moves 20 B per element, torch.add 12
    print(
        f"{shape}: torch.add {t_add:.4f} ms; accelerated-scan fwd {t_pf:.4f} ({t_add / t_pf:.0%} of add), "
        f"fwd+bwd {t_pfb:.4f}; backward limit {bwd_limit:.4f}",
        flush=True,
    )
    rows = []
    for t in cfgs:
        try:
            with poisoned():
                err = rel_error(ts.scan_forward(c, x, False, False, t), y_ref)
                dc, dx = ts.scan_backward(c, y, dy, False, False, t)
                err = max(err, rel_error(dx, dx_ref), rel_error(dc, dc_ref))
            del dc, dx
            f = time_ms(lambda t=t: ts.scan_forward(c, x, False, False, t))
            b = time_ms(lambda t=t: ts.scan_backward(c, y, dy, False, False, t))
        except Exception as e:  # noqa: BLE001 - a tile that does not compile or fit
            print(f"{t}: failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        name = f"{t.kind} {t.ch}x{t.bd}/{t.warps}" + (f"/{t.stages}" if t.kind == "loop" else f" window {t.window}")
        name += f" maxnreg {t.maxnreg}" if t.maxnreg else ""
        rows.append((f + b, name))
        print(
            f"{name}: fwd {f:.4f} ({t_add / f:.0%} of add, {f / t_pf:.2f}x peer), bwd {b:.4f} "
            f"({bwd_limit / b:.0%} of its limit), sum {f + b:.4f} ({(f + b) / t_pfb:.2f}x peer fwd+bwd); "
            f"err {err:.1e}",
            flush=True,
        )
    rows.sort()
    print("fastest sums:", "; ".join(f"{n} {s:.4f}" for s, n in rows[:5]), flush=True)


def few() -> None:
    cfgs = [ts.default_tiles(*FEW, False, False), ts.default_tiles(*FEW, False, True)]
    grid = [
        (64, 32, (1, 2, 4)),
        (64, 64, (2, 4, 8)),
        (64, 128, (4, 8)),
        (64, 256, (8, 16)),
        (128, 32, (2, 4, 8)),
        (128, 64, (4, 8)),
        (128, 128, (8, 16)),
        (256, 32, (4, 8)),
        (256, 64, (8, 16)),
        (512, 32, (8, 16)),
    ]
    cfgs += [ts.ScanTiles("lookback", ch, bd, w, window=win) for ch, bd, ws in grid for w in ws for win in (4, 8)]
    _tile_grid(FEW, cfgs)


def many() -> None:
    cfgs = [ts.default_tiles(*MANY, False, False)]
    cfgs += [
        ts.ScanTiles("loop", ch, bd, w, st)
        for ch in (64, 32)
        for bd in (32, 16, 64)
        for w in (1, 2)
        for st in (3, 4, 6)
        if (ch, bd, w) != (64, 64, 1)
    ]
    cfgs += [ts.default_tiles(*MANY, False, False, kind="lookback")]
    cfgs += [ts.ScanTiles("lookback", ch, bd, w, window=1) for ch, bd, w in ((64, 64, 2), (64, 32, 1), (128, 32, 4))]
    _tile_grid(MANY, cfgs)


def _fwd_bwd_calls(shape) -> dict:
    """Forward + backward through ``torch.autograd.grad`` at ``shape``, ours and the peer's (its
    ``(B, D, L)`` layout), as thunks."""
    peer = _peer()
    c, x, dy = _inputs(*shape, False, "cuda", 0)
    ct, xt, dyt = (t.transpose(1, 2).contiguous() for t in (c, x, dy))
    return {"ours": fwd_bwd(ts.linear_scan_triton, [c, x], dy), "accelerated-scan": fwd_bwd(peer.scan, [ct, xt], dyt)}


def host() -> None:
    from torch.profiler import ProfilerActivity, profile

    for shape, n in ((FEW, 50), (TINY, 300)):
        for name, fn in _fwd_bwd_calls(shape).items():
            loops = ", ".join("host {:.1f} / done {:.1f} us".format(*issue_times(fn, n)) for _ in range(3))
            line = f"{shape} {name} fwd+bwd per call: {loops}"
            if shape == FEW:
                line += f"; do_bench {time_ms(fn):.4f} ms, CUDA graph replay {time_ms(graph_replay(fn)):.4f} ms"
            print(line, flush=True)
    for name, fn in _fwd_bwd_calls(TINY).items():  # the profiler at the tiny shape: the host's share alone
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        print(f"--- torch.profiler, {name}, 5 calls at {TINY}", flush=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)


def _layers(shape) -> dict:
    """One thunk per layer of the eager paths at ``shape``, ours and the peer's."""
    peer = _peer()
    b, length, d = shape
    c, x, dy = _inputs(*shape, False, "cuda", 5)
    y = ts.scan_forward(c, x, False, False)
    out, dx, dc = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    ct, xt, dyt, yt = (t.transpose(1, 2).contiguous() for t in (c, x, dy, y))
    st = torch.empty_like(xt)
    ours_in = [t.detach().clone().requires_grad_(True) for t in (c, x)]
    peer_in = [t.detach().clone().requires_grad_(True) for t in (ct, xt)]
    return {
        "torch.add(out=)": lambda: torch.add(c, x, out=out),
        "torch.empty_like": lambda: torch.empty_like(x),
        "ours: forward kernel launch (_launch)": lambda: ts._launch(c, x, out, None, None, False, False, False, None),
        "ours: backward kernel launch (_launch)": lambda: ts._launch(c, dy, dx, y, dc, True, True, False, None),
        "ours: scan_forward": lambda: ts.scan_forward(c, x, False, False),
        "ours: scan_backward": lambda: ts.scan_backward(c, y, dy, False, False),
        "ours: linear_scan_triton, no grad": lambda: ts.linear_scan_triton(c, x),
        "ours: linear_scan_triton, grad": lambda: ts.linear_scan_triton(*ours_in),
        "ours: forward + autograd.grad": fwd_bwd(ts.linear_scan_triton, [c, x], dy),
        "peer: forward kernel launch": lambda: peer.forward_scan[(b, d)](
            ct, xt, st, seqlen=length, enable_fp_fusion=False
        ),
        "peer: backward kernel launch": lambda: peer.backward_scan[(b, d)](
            ct, yt, dyt, st, out, seqlen=length, enable_fp_fusion=False
        ),
        "peer: Scan.apply, grad": lambda: peer.Scan.apply(*peer_in),
        "peer: forward + autograd.grad": fwd_bwd(peer.Scan.apply, [ct, xt], dyt),
    }


def pieces() -> None:
    gc.disable()
    try:
        for shape, n in ((TINY, 200), (FEW, 20)):
            for name, fn in _layers(shape).items():
                print(f"{shape} {name}: host {min_median_issue(fn, n)}", flush=True)
    finally:
        gc.enable()


PARTS = {"few": few, "many": many, "host": host, "pieces": pieces}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops scan-probe", description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="+", choices=sorted(PARTS), help="what to probe (see the module docstring)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: the scan probe needs a CUDA GPU")
    for part in args.parts:
        PARTS[part]()


if __name__ == "__main__":
    main()
