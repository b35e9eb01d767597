"""``python -m kernels.ssd.tune``: tile-configuration sweep of the Triton SSD (a tuning aid).

Times, for every ``--configs`` entry (``EXPRESSIVITY_SSD_TILES`` strings, see
``triton_ssd._overrides``; ``default`` = no override), state size, dtype and float32 matmul
precision, on the benchmark's inputs (``kernels.ssd.bench``: batch 16, L 4096, head dim 64, one
group; ``triton.testing.do_bench`` medians):
- ``--kernel all``: ``y = ssd(x, dt, A, B, C)`` forward and forward + backward;
- ``--kernel state``: the ``chunk_state`` kernel alone, forward (``x``, ``B``: the chunk states)
  and reverse (``dy``, ``C``, with the carried-state dots: the backward's state gradients).
``--warm N`` first compiles every configuration in ``N`` processes (``kernels.ssd.warm``). With
``--profile`` it logs where one forward + backward spends its GPU time, per kernel, for our default
configuration and for ``mamba-ssm`` when importable. A failing configuration (e.g. too much shared
memory) is reported and skipped. Results are logged, not written: the benchmark
(``python -m kernels.bench ssd``) is the measurement of record.
"""

from __future__ import annotations

import argparse
import logging
import os

import torch

from kernels.bench.common import time_ms
from kernels.ssd import ssd
from kernels.ssd.bench import DTYPES, _at_precision, _inputs, _peer, _profile

log = logging.getLogger("kernels.ssd.tune")


def tl_precision(dname: str, prec: str) -> str:
    """``tl.dot`` input precision of dtype ``dname`` at torch float32 matmul precision ``prec``."""
    return {"highest": "tf32x3", "high": "tf32x3", "medium": "tf32"}[prec] if dname == "fp32" else "tf32"


def state_calls(xs, Q: int, prec: str) -> list:
    """The two ``chunk_state`` launches of one forward + backward on inputs ``xs = [x, dt, A, B, C]``:
    ``[forward, reverse]`` as argument-free callables (``prec``: ``tl.dot`` input precision)."""
    from kernels.ssd.triton_ssd import _chunk_state, _decays

    x, dt, A, B, C = xs
    dtT, acum = _decays(dt, A, Q)
    prev, _ = _chunk_state(x, B, None, acum, dtT, Q, prec, reverse=False)
    dy = torch.randn_like(x)
    dfinal = torch.randn_like(prev[:, -1])
    return [lambda: _chunk_state(x, B, None, acum, dtT, Q, prec, reverse=False),
            lambda: _chunk_state(dy, C, dfinal, acum, dtT, Q, prec, reverse=True, prev=prev)]


def _cases(args):
    """(N, dtype name, torch precision name) of the sweep."""
    for N in map(int, args.states.split(",")):
        for dname in args.dtypes.split(","):
            for prec in args.precisions.split(",") if dname == "fp32" else ["highest"]:
                yield N, dname, prec


def _warm(args, configs: list[str]) -> None:
    from kernels.ssd.warm import Job, warm

    jobs = []
    for N, dname, prec in _cases(args):
        for cfg in configs:
            tiles = "" if cfg == "default" else cfg
            if args.kernel == "state":
                jobs.append(Job(tl_precision(dname, prec), dname, args.heads, N, tiles=tiles, what="state"))
            else:
                impl = "triton-q128" + ("-tf32" if prec == "medium" else "")
                jobs.append(Job(impl, dname, args.heads, N, tiles=tiles))
    warm(jobs, args.warm)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kernels.ssd.tune", description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--states", default="64")
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--precisions", default="medium", help="float32 matmul precisions (torch names)")
    ap.add_argument("--chunks", default="128")
    ap.add_argument("--configs", default="default", help="';'-separated EXPRESSIVITY_SSD_TILES values")
    ap.add_argument("--kernel", choices=("all", "state"), default="all")
    ap.add_argument("--warm", type=int, default=0, help="compile the configurations in this many processes first")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        raise SystemExit("kernels.ssd.tune needs a CUDA device")
    configs = args.configs.split(";")
    if args.warm:
        _warm(args, configs)
    peer = _peer() if args.profile else None
    for N in map(int, args.states.split(",")):
        xs32 = _inputs(16, 4096, args.heads, 64, 1, N, "cuda")
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            xs = [t.to(dtype) if t.dim() not in (1, 3) else t for t in xs32]
            dy = torch.randn_like(xs[0])
            leaves = [t.detach().requires_grad_(True) for t in xs]
            precisions = args.precisions.split(",") if dtype == torch.float32 else ["highest"]
            for prec in precisions:
                for Q in map(int, args.chunks.split(",")):
                    fn = lambda x, dt, A, B, C, Q=Q: ssd(x, dt, A, B, C, chunk_size=Q, backend="triton")  # noqa: E731
                    ours = _at_precision(prec, fn)
                    if args.profile:
                        os.environ.pop("EXPRESSIVITY_SSD_TILES", None)
                        _profile(ours, xs, dy, f"triton-q{Q} N{N} {dname} {prec}")
                    for cfg in configs:
                        os.environ["EXPRESSIVITY_SSD_TILES"] = "" if cfg == "default" else cfg
                        try:
                            if args.kernel == "state":
                                fwd_call, rev_call = state_calls(xs, Q, tl_precision(dname, prec))
                                fwd, rev = time_ms(fwd_call), time_ms(rev_call)
                                log.info("N%d %s %s q%d %-28s state fwd %7.3f ms  reverse %7.3f ms  sum %7.3f ms",
                                         N, dname, prec, Q, cfg, fwd, rev, fwd + rev)
                                continue
                            with torch.no_grad():
                                fwd = time_ms(lambda: ours(*xs))
                            both = time_ms(lambda: torch.autograd.grad(ours(*leaves), leaves, dy))
                            log.info("N%d %s %s q%d %-28s fwd %7.3f ms  fwd+bwd %7.3f ms",
                                     N, dname, prec, Q, cfg, fwd, both)
                        except Exception as err:  # e.g. out of shared memory: report, go on
                            log.info("N%d %s %s q%d %-28s failed: %s", N, dname, prec, Q, cfg, str(err)[:160])
                    os.environ.pop("EXPRESSIVITY_SSD_TILES", None)
            if peer is not None:
                fn = lambda x, dt, A, B, C: peer(x, dt, A, B, C, chunk_size=256)  # noqa: E731
                _profile(fn, xs, dy, f"mamba-ssm N{N} {dname}")
                with torch.no_grad():
                    fwd = time_ms(lambda: fn(*xs))
                both = time_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, dy))
                log.info("N%d %s mamba-ssm fwd %7.3f ms  fwd+bwd %7.3f ms", N, dname, fwd, both)


if __name__ == "__main__":
    main()
