"""``python -m benchmarks.ops newton [--quick] [--cells gru,lstm] [--lengths ...] [--sweep]``.

FlashGRU / FlashLSTM layers ``x (B, L, D) -> h`` with ``u = x W^T + b`` (one GEMM) and Newton (3
iterations, no tolerance, no residual check), forward and forward + backward, float32, through
``seqkernels.newton.flashgru`` / ``flashlstm``:

- ``ours-triton``: the GEMM + the fused Triton Newton kernel; ``ours-triton (kernel)``: the kernel alone,
  given ``u`` (limit: ``u`` read once, the states written once, over the measured copy bandwidth);
- ``ours-torch``: ``newton_apply`` with the closed-form Jacobian and the torch log-step reduction;
  ``ours-torch (triton scan)``: the same with the Triton scan as the reduction;
- ``ours-triton sequential``: the GEMM + the loop's exact states in the fused kernels with one-step
  chunks (``backend="triton-sequential"``: the cells' ``mode="sequential"`` on CUDA);
- ``ours-reference``: the loop, at ``L <= 2048`` (not with ``--quick``);
- ``pararnn``: ``pararnn-torch``'s ``ParaRNN`` with ``NewtonConfig(scan_backend="fused", max_iters=3)``
  (no early exit, no residual check), given the same weights (its ``a`` are clamped to [-0.5, 0.5], so
  ours are drawn in that range too).

Every implementation is checked first against a float64 loop (``h`` and the gradients of ``x`` and
the recurrent weights); our Triton outputs are poisoned with NaN. ``--sweep``: the fused kernels'
tiles (``NewtonTiles``).
"""

from __future__ import annotations

import argparse
import contextlib
import math

import torch
import torch.nn.functional as F

from benchmarks.ops.common import (
    BenchRow,
    Impl,
    Problem,
    cli_common,
    copy_bandwidth_gbs,
    environment,
    finish,
    max_rel_error,
    no_grad,
    rel_error,
    run,
    time_ms,
    write_json,
)
from seqkernels._triton import poisoned
from seqkernels.newton import (
    flashgru,
    flashgru_jacobian,
    flashgru_step,
    flashlstm,
    flashlstm_jacobian,
    flashlstm_step,
    newton_apply,
)
from seqkernels.newton.triton_ops import NewtonTiles

SWEEP = {
    "gru": [(128, 8, 4), (256, 8, 8), (128, 4, 4), (64, 8, 2), (64, 16, 4)],
    "lstm": [(64, 8, 4), (128, 8, 8), (64, 4, 4), (32, 8, 2), (32, 16, 4)],
}


class Layer:
    """Weights and inputs of one case; ``fn(x, W, b, *weights) -> h (B, L, D)`` per backend."""

    def __init__(self, cell: str, B: int, L: int, D: int, dev: str, seed: int = 0):
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.cell, self.D = cell, D
        self.x = torch.randn(B, L, D, device=dev, generator=gen)
        bound = 1 / math.sqrt(D)
        self.W = (torch.rand(3 * D, D, device=dev, generator=gen) * 2 - 1) * bound
        self.b = torch.zeros(3 * D, device=dev)
        self.a = (torch.randn(3, D, device=dev, generator=gen) * bound).clamp(-0.5, 0.5)
        self.p = (torch.randn(2, D, device=dev, generator=gen) * bound).clamp(-0.5, 0.5)
        self.weights = [self.a] + ([self.p] if cell == "lstm" else [])
        self.dy = torch.randn(B, L, D, device=dev, generator=gen)
        self.args = [self.x, self.W, self.b, *self.weights]

    def u(self, x, W, b):
        """``(1, B, L, 3, D)``: one head."""
        return F.linear(x, W, b).view(1, x.shape[0], x.shape[1], 3, self.D)

    def family(self, backend: str):
        fn = flashgru if self.cell == "gru" else flashlstm

        def run(x, W, b, *w):
            s = fn(self.u(x, W, b), *(t.unsqueeze(0) for t in w), 3, backend=backend)
            return s[0, ..., -self.D :]

        return run

    def newton_triton_scan(self, x, W, b, *w):
        step, jac, structure = (
            (flashgru_step, flashgru_jacobian, "diag")
            if self.cell == "gru"
            else (flashlstm_step, flashlstm_jacobian, "block2")
        )
        u = F.linear(x, W, b).view(x.shape[0], x.shape[1], 3, self.D)
        S = self.D * (1 if self.cell == "gru" else 2)
        s, _ = newton_apply(
            step, u, w, state_size=S, structure=structure, jac=jac, iters=3, backend="triton", check=False
        )
        return s[..., -self.D :]


def _pararnn(layer: Layer):
    """The peer's layer with our weights copied in; returns ``(fn, its leaves, grouping of its weight grads)``."""
    from pararnn import NewtonConfig, ParaRNN
    from pararnn.cells.para_gru import ParaGRU
    from pararnn.cells.para_lstm import ParaLSTM

    cell = (ParaGRU if layer.cell == "gru" else ParaLSTM)(layer.D, layer.D).to(layer.x.device)
    names = ["a_z", "a_r", "a_n"] if layer.cell == "gru" else ["a_f", "a_z", "a_o", "c_f", "c_o"]
    net = ParaRNN(
        cell,
        config=NewtonConfig(max_iters=3, scan_backend="fused", residual_atol=None, residual_fail=None),
        solver="newton",
    )
    vals = list(layer.a.unbind(0)) + (list(layer.p.unbind(0)) if layer.cell == "lstm" else [])
    with torch.no_grad():
        cell.W_x.weight.copy_(layer.W)
        cell.W_x.bias.copy_(layer.b)
        for name, v in zip(names, vals):
            getattr(cell, name).copy_(v)
    leaves = [cell.W_x.weight, cell.W_x.bias, *(getattr(cell, n) for n in names)]
    group = lambda g: [torch.stack(g[:3])] + ([torch.stack(g[3:])] if layer.cell == "lstm" else [])  # noqa: E731
    return net, leaves, group


def problem(cell: str, B: int, L: int, D: int, bw: float, quick: bool, dev: str) -> Problem:
    n = B * L * D
    s_words = 1 if cell == "gru" else 2
    lim_f = (3 + s_words) * 4 * n / (bw * 1e9) * 1e3  # u read, states written
    lim_fb = lim_f + (3 + 2 * s_words + 3) * 4 * n / (bw * 1e9) * 1e3  # u, s, ds read; du written
    pb = Problem(
        "newton", {"cell": cell, "batch": B, "length": L, "dim": D}, "float32", None, {"fwd": lim_f, "fwd+bwd": lim_fb}
    )

    def impls():
        layer = Layer(cell, B, L, D, dev)
        leaves64 = [t.double().requires_grad_() for t in layer.args]
        h64 = layer.family("reference")(*leaves64)
        g64 = torch.autograd.grad(h64, leaves64, layer.dy.double())
        want = [h64, g64[0], *g64[3:]]

        def ours(fn, poison=False):
            leaves = [t.detach().requires_grad_() for t in layer.args]

            def check():
                with poisoned() if poison else contextlib.nullcontext():
                    h = fn(*leaves)
                    g = torch.autograd.grad(h, leaves, layer.dy)
                return max_rel_error([h, g[0], *g[3:]], want)

            return no_grad(fn, *layer.args), lambda: torch.autograd.grad(fn(*leaves), leaves, layer.dy), check

        out = []
        for name, fn, poison in (
            ("ours-triton", layer.family("triton"), True),
            ("ours-triton sequential", layer.family("triton-sequential"), True),
            ("ours-torch", layer.family("torch"), False),
            ("ours-torch (triton scan)", layer.newton_triton_scan, True),
        ):
            out.append(Impl(name, *ours(fn, poison)))
        if L <= 2048 and not quick:
            f, fb, check = ours(layer.family("reference"))
            out.append(Impl("ours-reference", f, fb if L <= 512 else None, check, time_kw={"warmup": 1, "rep": 1}))
        u = layer.u(layer.x, layer.W, layer.b).contiguous()
        w = [t.unsqueeze(0) for t in layer.weights]
        kern = lambda u_, *w_: (flashgru if cell == "gru" else flashlstm)(u_, *w_, 3, backend="triton")  # noqa: E731
        ul = [t.detach().requires_grad_() for t in (u, *w)]
        gs = torch.randn(*u.shape[:3], s_words * D, device=dev)
        out.append(Impl("ours-triton (kernel)", no_grad(kern, u, *w), lambda: torch.autograd.grad(kern(*ul), ul, gs)))
        try:
            net, pleaves, group = _pararnn(layer)
        except Exception as e:  # noqa: BLE001
            out.append(Impl("pararnn", None, note=f"skipped: {type(e).__name__}: {e}"[:200]))
        else:
            x = layer.x.detach().requires_grad_()

            def check_peer():
                h = net(x)
                g = torch.autograd.grad(h, [x, *pleaves], layer.dy)
                return max_rel_error([h, g[0], *group(g[3:])], want)

            out.append(
                Impl(
                    "pararnn",
                    no_grad(net, layer.x),
                    lambda: torch.autograd.grad(net(x), [x, *pleaves], layer.dy),
                    check_peer,
                    note="NewtonConfig(scan_backend='fused', max_iters=3)",
                )
            )
        return out

    pb.impls = impls
    return pb


def sweep(cells, lengths, B, D, dev="cuda") -> list[BenchRow]:
    """The fused kernels' tiles ``(ch, bd, warps)``, forward and forward + backward, given ``u``."""
    from seqkernels.newton.gru_kernels import flashgru_fused
    from seqkernels.newton.lstm_kernels import flashlstm_fused

    rows = []
    for cell in cells:
        fn = flashgru_fused if cell == "gru" else flashlstm_fused
        for L in lengths:
            layer = Layer(cell, B, L, D, dev)
            u = layer.u(layer.x, layer.W, layer.b).contiguous().requires_grad_()
            w = [t.unsqueeze(0).requires_grad_() for t in layer.weights]
            ref = None
            for ch, bd, warps in SWEEP[cell]:
                tiles = NewtonTiles(ch, bd, warps)
                s = fn(u, *w, 3, tiles=tiles)[0]
                ref = s if ref is None else ref
                gs = torch.randn_like(s)
                dims = {"cell": cell, "batch": B, "length": L, "dim": D}
                name = f"fused {ch}x{bd}/{warps}"
                with torch.no_grad():
                    t_f = time_ms(lambda: fn(u, *w, 3, tiles=tiles))
                t_fb = time_ms(lambda: torch.autograd.grad(fn(u, *w, 3, tiles=tiles)[0], [u, *w], gs))
                rows.append(
                    BenchRow(
                        "newton", name, "fwd", "float32", dims, t_f, max_rel_err=rel_error(s, ref), section="sweep"
                    )
                )
                rows.append(BenchRow("newton", name, "fwd+bwd", "float32", dims, t_fb, section="sweep"))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops newton", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short lengths, no reference loop")
    p.add_argument("--cells", default="gru,lstm")
    p.add_argument("--lengths", default=None, help="comma-separated L (default 512,2048,8192; --quick 256,1024)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", type=int, default=256, help="D state channels")
    p.add_argument("--sweep", action="store_true", help="also time the fused kernels' tiles (section 'sweep')")
    cli_common(p)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: the newton benchmark needs a CUDA GPU")
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    if any(c not in SWEEP for c in cells):
        raise SystemExit(f"error: unknown cell(s) in {cells}; known: gru, lstm")
    lengths = [int(v) for v in (args.lengths or ("256,1024" if args.quick else "512,2048,8192")).split(",")]
    bw = copy_bandwidth_gbs("cuda")
    problems = [problem(c, args.batch, L, args.dim, bw, args.quick, "cuda") for c in cells for L in lengths]
    env = environment("cuda")
    env["copy_gbs"] = bw
    rows = run(problems, warm_only=args.warm_only, checkpoint=lambda rows: write_json("newton", rows, env, args.out))
    if args.sweep and not args.warm_only:
        rows += sweep(cells, [lengths[len(lengths) // 2]], args.batch, args.dim)
    finish("newton", rows, env, args, baseline="pararnn")


if __name__ == "__main__":
    main()
