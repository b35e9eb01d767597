"""``python -m benchmarks.ops delta``: time the gated delta rule's implementations, after checking each.

The op: ``kernels.delta.gated_delta_rule(q, k, v, g, beta, qk_l2norm=True)`` (Gated DeltaNet; inputs
float32, ``(B, L, H, D)``, ``g`` a log decay, ``beta`` in [0, 2]). Implementations:

- ``ours-chunk``: the chunkwise (WY) form in PyTorch (``kernels/delta/chunk.py``), float32;
- ``fla``: ``backend="fla"``, fla-core's ``chunk_gated_delta_rule`` in bfloat16; where fla refuses its
  own gated backward (Hopper, Triton 3.4-3.7.0, fla issue #640) its ``chunk_bwd_dqkwg`` is
  ``kernels/delta/fla_gated_bwd.py``'s PyTorch function (the note says which ran);
- ``fla-triton-unguarded`` (only where fla refuses): fla's own Triton ``chunk_bwd_dqkwg`` with fla's
  guard lifted, to measure what the guard protects against: its error is the evidence.

Every implementation is checked first, output and every input gradient, against the chunk form in
float64 on the first two sequences (the chunk form equals the per-token loop to 1e-15 in
``tests/kernels/test_delta.py``). Limit: every input read and the output written once (forward); the
backward reads the inputs, the output gradient and writes a gradient per input; over the measured copy
bandwidth.
"""

from __future__ import annotations

import argparse
import contextlib
import logging

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
    lift_fla_gated_guard,
    max_rel_error,
    no_grad,
    run,
    write_json,
)
from kernels import delta as kd

log = logging.getLogger("benchmarks.ops.delta")


def inputs(batch: int, L: int, H: int, D: int, device: str, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v ``(B, L, H, D)``, g ``(B, L, H)`` (log decay in [-1, 0]), beta ``(B, L, H)`` in [0, 2]."""
    gen = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, device=device)  # noqa: E731
    return [r(batch, L, H, D), r(batch, L, H, D), r(batch, L, H, D), -u(batch, L, H), 2 * u(batch, L, H)]


@contextlib.contextmanager
def _fla_triton_unguarded():
    """fla's Triton ``chunk_bwd_dqkwg`` runs even where fla refuses it (``lift_fla_gated_guard``)."""
    restore = lift_fla_gated_guard()
    try:
        yield
    finally:
        restore()


def implementations() -> dict:
    """name -> (``fn(q, k, v, g, beta)``, context manager factory, note)."""
    op = lambda backend: lambda *t: kd.gated_delta_rule(*t, qk_l2norm=True, backend=backend)  # noqa: E731
    impls = {"ours-chunk": (op("chunk"), contextlib.nullcontext, "")}
    if kd.fla_available():
        from kernels.delta import fla_gated_bwd

        refused = fla_gated_bwd.triton_refuses()
        note = "backward: ours chunk_bwd_dqkwg (fla refuses its own here)" if refused else "fla's Triton backward"
        impls["fla"] = (op("fla"), contextlib.nullcontext, note)
        if refused:
            impls["fla-triton-unguarded"] = (op("fla"), _fla_triton_unguarded, "fla's guard lifted (issue #640)")
    return impls


def problem(batch: int, L: int, H: int, D: int, impls: dict, bw_gbs: float, device: str = "cuda") -> Problem:
    nbytes = 4 * batch * L * H * (4 * D + 2)  # q, k, v, o and g, beta in float32
    limits = {"fwd": nbytes / (bw_gbs * 1e9) * 1e3, "fwd+bwd": 3 * nbytes / (bw_gbs * 1e9) * 1e3}
    pb = Problem("delta", {"batch": batch, "length": L, "heads": H, "head_dim": D}, "fp32", None, limits)

    def build():
        xs = inputs(batch, L, H, D, device)
        small = [t[:2] for t in xs]
        dy, dy_small = torch.randn_like(xs[0]), torch.randn_like(small[0])
        ref = grads(impls["ours-chunk"][0], [t.double() for t in small], dy_small.double())
        out = []
        for name, (fn, context, note) in impls.items():

            def check(fn=fn, context=context):
                with context():
                    fwd_bwd(fn, xs, dy)()  # once at the timed shape first: fla autotunes for it
                    return max_rel_error(grads(fn, small, dy_small), ref)

            def timed(thunk, context=context):
                def call():
                    with context():
                        return thunk()

                return call

            out.append(Impl(name, timed(no_grad(fn, *xs)), timed(fwd_bwd(fn, xs, dy)), check, note))
        return out

    pb.impls = build
    return pb


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ops delta", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--shapes",
        default="256x40x4x16,8x2048x4x64",
        help="comma-separated BxLxHxD (default: the state-tracking training batch and a long one)",
    )
    cli_common(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        raise SystemExit("error: the delta benchmark needs a CUDA GPU")
    impls = implementations()
    bw = copy_bandwidth_gbs("cuda")
    env = environment("cuda")
    env.update(copy_gbs=bw)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    problems = [problem(*shape, impls, bw) for shape in shapes]
    rows = run(
        problems,
        warm_only=args.warm_only,
        log=log.info,
        checkpoint=lambda rows: write_json("delta", rows, env, args.out),
    )
    finish("delta", rows, env, args, baseline="ours-chunk")


if __name__ == "__main__":
    main()
