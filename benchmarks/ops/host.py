"""``python -m benchmarks.ops host``: host time per call of every family's Triton op at tiny shapes.

At shapes whose GPU work takes a few microseconds the wall time per call is the host's: input checks,
allocations, Python dispatch, the kernel launches. Per family, ours (``backend="triton"``) and the
peer, forward and forward + backward: the mean wall time of ``n`` back-to-back calls (one device
synchronization at the end), next to the GPU time of one call (``do_bench``, CUDA events). Writes
``<out>/host.json`` (section ``host``).
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.ops.common import BenchRow, cli_common, environment, issue_times, table, time_ms, write_json


def per_call_ms(fn, n: int = 300) -> float:
    """Mean wall time of ``n`` calls, synchronized once at the end (host-bound when the work is tiny)."""
    return issue_times(fn, n, warmup=20)[1] / 1e3


def _fb(fn, xs):
    leaves = [t.detach().clone().requires_grad_(True) for t in xs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    dy = torch.randn_like(out)

    def step():
        y = fn(*leaves)
        y = y[0] if isinstance(y, tuple) else y
        return torch.autograd.grad(y, leaves, dy)

    return step


def cases(dev="cuda"):
    """family -> (dims, [(impl, fn, inputs)])."""
    from seqkernels.fused_rnn import CELLS, fused_rnn
    from seqkernels.mlstm import mlstm
    from seqkernels.newton import flashgru
    from seqkernels.scan import linear_scan
    from seqkernels.ssd import ssd

    r = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    out = {}
    c, x = torch.rand(1, 256, 64, device=dev), r(1, 256, 64)
    impls = [("ours-triton", lambda c_, x_: linear_scan(c_, x_, backend="triton"), [c, x])]
    try:
        from accelerated_scan.scalar import scan as acc

        impls.append(("accelerated-scan", acc, [c.transpose(1, 2).contiguous(), x.transpose(1, 2).contiguous()]))
    except Exception:  # noqa: BLE001
        pass
    out["scan"] = ({"batch": 1, "length": 256, "dim": 64}, impls)
    u, a = r(1, 1, 256, 3, 64), (r(1, 3, 64) * 0.1)
    impls = [("ours-triton", lambda u_, a_: flashgru(u_, a_, 3, backend="triton"), [u, a])]
    try:
        from pararnn import NewtonConfig, ParaRNN
        from pararnn.cells.para_gru import ParaGRU

        net = ParaRNN(
            ParaGRU(64, 64).to(dev),
            config=NewtonConfig(max_iters=3, scan_backend="fused", residual_atol=None, residual_fail=None),
            solver="newton",
        )
        impls.append(("pararnn", net, [r(1, 256, 64)]))
    except Exception:  # noqa: BLE001
        pass
    out["newton"] = ({"cell": "gru", "batch": 1, "length": 256, "dim": 64}, impls)
    spec = CELLS["lstm"]
    wx, R, b = r(2, 16, 2, 4, 32), r(2, 32, 4, 32) * 0.1, r(2, 4, 32)
    impls = [("ours-triton", lambda *t: fused_rnn("lstm", *t, backend="triton"), [wx, R, b])]
    try:
        from flashrnn import flashrnn

        impls.append(
            (
                "flashrnn-triton_fused",
                lambda w_, R_, b_: flashrnn(w_, R_, b_, function="lstm", backend="triton_fused", dtype="float32")[0],
                [r(2, 16, spec.input_gates, 2, 32), r(spec.recurrent_gates, 2, 32, 32) * 0.1, r(4, 2, 32)],
            )
        )
    except Exception:  # noqa: BLE001
        pass
    out["fused_rnn"] = ({"cell": "lstm", "batch": 2, "length": 16, "heads": 2, "head_dim": 32}, impls)
    q = [r(1, 2, 128, 64), r(1, 2, 128, 64), r(1, 2, 128, 64), r(1, 2, 128), 3 + r(1, 2, 128)]
    impls = [("ours-triton", lambda *t: mlstm(*t, backend="triton"), q)]
    try:
        from mlstm_kernels.torch import get_mlstm_kernel

        k = get_mlstm_kernel("chunkwise--triton_xl_chunk")
        impls.append(("mlstm_kernels:triton_xl_chunk", lambda *t: k(*t, autocast_kernel_dtype=torch.float32), q))
    except Exception:  # noqa: BLE001
        pass
    out["mlstm"] = ({"gate": "exp", "batch": 1, "heads": 2, "length": 128, "qk_dim": 64, "v_dim": 64}, impls)
    xs = [
        r(1, 256, 4, 32),
        torch.rand(1, 256, 4, device=dev) * 0.1,
        -torch.rand(4, device=dev),
        r(1, 256, 1, 32),
        r(1, 256, 1, 32),
    ]
    impls = [("ours-triton", lambda *t: ssd(*t, chunk_size=64, backend="triton"), xs)]
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        impls.append(("mamba-ssm", lambda *t: mamba_chunk_scan_combined(*t, chunk_size=64), xs))
    except Exception:  # noqa: BLE001
        pass
    out["ssd"] = ({"batch": 1, "length": 256, "heads": 4, "head_dim": 32, "state": 32}, impls)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops host", description=__doc__.splitlines()[0])
    cli_common(p)
    args = p.parse_args(argv)
    rows = []
    env = environment("cuda")
    for family, (dims, impls) in cases().items():
        for name, fn, xs in impls:
            try:
                fwd = lambda fn=fn, xs=xs: torch.no_grad()(fn)(*xs)  # noqa: E731
                fb = _fb(fn, xs)
                for direction, thunk in (("fwd", fwd), ("fwd+bwd", fb)):
                    wall, gpu = per_call_ms(thunk), time_ms(thunk)
                    rows.append(
                        BenchRow(
                            family,
                            name,
                            direction,
                            "float32",
                            dims,
                            wall,
                            section="host",
                            note=f"GPU time {gpu * 1e3:.1f} us",
                            extra={"gpu_ms": gpu},
                        )
                    )
            except Exception as e:  # noqa: BLE001
                rows.append(
                    BenchRow(
                        family,
                        name,
                        "fwd+bwd",
                        "float32",
                        dims,
                        math.nan,
                        section="host",
                        note=f"failed: {type(e).__name__}: {e}"[:160],
                    )
                )
            if not args.warm_only:
                write_json("host", rows, env, args.out)
    print(table(rows))
    if not args.warm_only:
        print("written:", write_json("host", rows, env, args.out))


if __name__ == "__main__":
    main()
