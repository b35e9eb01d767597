"""Probe: the look-back scan kernel at (1, 65536, 256) with capped registers (``maxnreg``).

The shipped forward (64 x 64 tile, 2 warps) compiles to 222 registers per thread on triton 3.6, so
about 4 programs fit per SM while each waits in its look-back. This times the forward and backward
kernels with ``maxnreg`` caps and a few tiles, each checked first against the torch scan with the
output poisoned.   python benchmarks/scan_maxnreg_probe.py
"""

import functools
import itertools

import torch
import triton
import triton.testing

from kernels.scan import linear_scan
from kernels.scan import triton_scan as ts
from kernels.scan._scan_kernels import _diag_scan_kernel


def launch(c, x, out, yfwd, dc, grad, CH, BD, warps, maxnreg):
    B, L, D = x.shape
    n_dt, n_chunks = triton.cdiv(D, BD), triton.cdiv(L, CH)
    n_lt = B * n_dt
    ws = ts._workspace(x.device, ts._WS_OFFSET + n_lt * n_chunks * 3 * BD)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    _diag_scan_kernel[(n_lt * n_chunks,)](
        c, x, out, yfwd, dc, ws[ts._WS_OFFSET:], ws, L, D, n_dt, n_lt, n_chunks,
        REVERSE=grad, GRAD=grad, CH=CH, BD=BD, WIN=ts.LOOKBACK_WINDOW if n_lt < ts.ONE_RECORD_FROM_LANE_TILES else 1,
        DC=D, num_warps=warps, **extra,
    )


def main():
    torch.manual_seed(0)
    B, L, D = 1, 65536, 256
    c = torch.rand(B, L, D, device="cuda") * 0.5 + 0.5
    x = torch.randn(B, L, D, device="cuda")
    dy = torch.randn(B, L, D, device="cuda")
    y_ref = linear_scan(c.double(), x.double(), backend="torch").float()
    # backward reference: dx = reverse scan of dy with shifted coefficients, dc = dx * y_{t-1}
    c_next = torch.cat([c[:, 1:], torch.zeros_like(c[:, :1])], 1)
    dx_ref = linear_scan(c_next.double(), dy.double(), reverse=True, backend="torch").float()
    limit = triton.testing.do_bench(lambda: torch.add(c, x, out=torch.empty_like(x)), warmup=50, rep=300)
    print(f"torch.add same bytes: {limit:.4f} ms")
    print("| tile CH x BD / warps | maxnreg | fwd ms | % of torch.add | bwd ms | fwd err | bwd err |")
    print("|---|---|---|---|---|---|---|")
    for (CH, BD, warps), maxnreg in itertools.product(
        [(64, 64, 2), (64, 32, 1), (32, 64, 2), (32, 32, 1)], [None, 168, 128]
    ):
        try:
            out = torch.full_like(x, float("nan"))
            launch(c, x, out, out, out, False, CH, BD, warps, maxnreg)
            ferr = ((out - y_ref).abs().max() / y_ref.abs().max()).item()
            dxo, dco = torch.full_like(x, float("nan")), torch.full_like(c, float("nan"))
            launch(c, dy, dxo, y_ref, dco, True, CH, BD, warps, maxnreg)
            berr = ((dxo - dx_ref).abs().max() / dx_ref.abs().max()).item()
            out = torch.empty_like(x)
            fwd = functools.partial(launch, c, x, out, out, out, False, CH, BD, warps, maxnreg)
            bwd = functools.partial(launch, c, dy, dxo, y_ref, dco, True, CH, BD, warps, maxnreg)
            tf = triton.testing.do_bench(fwd, warmup=50, rep=300)
            tb = triton.testing.do_bench(bwd, warmup=50, rep=300)
            print(f"| {CH}x{BD}/{warps} | {maxnreg} | {tf:.4f} | {limit / tf:.0%} | {tb:.4f} | {ferr:.1e} | {berr:.1e} |", flush=True)
        except Exception as err:  # noqa: BLE001 - a probe: report and go on
            print(f"| {CH}x{BD}/{warps} | {maxnreg} | error: {type(err).__name__}: {str(err)[:120]} |", flush=True)


if __name__ == "__main__":
    main()
