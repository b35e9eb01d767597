"""``python -m kernels.bench newton [--quick] [--device cpu] [--cells gru,lstm] [--lengths ...]``.

FlashGRU / FlashLSTM layers ``x (B, L, D) -> states`` with ``u = x W^T + b`` (one GEMM) and
Newton (3 iterations, no tolerance, no residual check), forward and forward+backward, float32:

- ``ours fused``: the GEMM + one fused Triton Newton kernel (``kernels.newton.fused_*``);
- ``ours fused (kernel)``: the kernel alone, given ``u`` (its limit: ``u`` read once and the
  states written once, over the measured copy bandwidth);
- ``ours parallel-triton`` / ``ours parallel``: ``kernels.newton.newton_apply`` with the closed-form
  Jacobian and the Triton / torch log-step scan;
- ``ours sequential``: the loop (``sequential_apply``), at ``L <= 2048``;
- ``pararnn ParaGRU/ParaLSTM fused``: ``pararnn-torch``'s ``ParaRNN`` with
  ``NewtonConfig(scan_backend="fused", max_iters=3)`` (no early exit, no residual check), given the
  same weights (its cells define the same functions; its ``a`` are clamped to [-0.5, 0.5], so ours
  are drawn in that range too).

Every implementation is checked against a float64 sequential loop (forward, and the gradients of
``x`` and the recurrent weights) before it is timed; our fused outputs are poisoned with NaN first.
``--device cpu`` times parallel (torch) vs sequential at ``L`` in {256, 1024, 4096}.
Writes ``benchmarks/newton-<device>-<date>.json``.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from kernels.bench import BenchRow, copy_bandwidth_gbs, environment, print_table, rel_error, time_ms, write_json
from kernels.newton import newton_apply, sequential_apply

# ---------------------------------------------------------------- the two cells in torch


def gru_step(h, u, a):
    z = torch.sigmoid(a[0] * h + u[..., 0, :])
    r = torch.sigmoid(a[1] * h + u[..., 1, :])
    c = torch.tanh(a[2] * (h * r) + u[..., 2, :])
    return (1 - z) * h + z * c


def gru_jac(h, u, a):
    z = torch.sigmoid(a[0] * h + u[..., 0, :])
    r = torch.sigmoid(a[1] * h + u[..., 1, :])
    c = torch.tanh(a[2] * (h * r) + u[..., 2, :])
    return (1 - z) + (c - h) * z * (1 - z) * a[0] + z * (1 - c * c) * a[2] * (r + h * r * (1 - r) * a[1])


def _lstm_gates(s, u, a, p):
    D = u.shape[-1]
    cp, h = s[..., :D], s[..., D:]
    f = torch.sigmoid(a[0] * h + u[..., 0, :] + p[0] * cp)
    z = torch.tanh(a[1] * h + u[..., 1, :])
    c = f * cp + (1 - f) * z
    o = torch.sigmoid(a[2] * h + u[..., 2, :] + p[1] * c)
    return cp, f, z, c, o


def lstm_step(s, u, a, p):
    _, _, _, c, o = _lstm_gates(s, u, a, p)
    return torch.cat([c, o * torch.tanh(c)], dim=-1)


def lstm_jac(s, u, a, p):
    cp, f, z, c, o = _lstm_gates(s, u, a, p)
    tc = torch.tanh(c)
    df = (cp - z) * f * (1 - f)
    j_cc = f + df * p[0]
    j_ch = df * a[0] + (1 - f) * (1 - z * z) * a[1]
    do = tc * o * (1 - o)
    dh_dc = do * p[1] + o * (1 - tc * tc)
    rows = [torch.stack([j_cc, j_ch], -2), torch.stack([dh_dc * j_cc, do * a[2] + dh_dc * j_ch], -2)]
    return torch.stack(rows, -3)


class Problem:
    """Weights and inputs of one benchmark case; ``out(states)`` is what the loss sees (``h``)."""

    def __init__(self, cell: str, B: int, L: int, D: int, dev: str, seed: int = 0):
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.cell, self.B, self.L, self.D = cell, B, L, D
        self.x = torch.randn(B, L, D, device=dev, generator=gen)
        bound = 1 / math.sqrt(D)
        self.W = (torch.rand(3 * D, D, device=dev, generator=gen) * 2 - 1) * bound
        self.b = torch.zeros(3 * D, device=dev)
        self.a = (torch.randn(3, D, device=dev, generator=gen) * bound).clamp(-0.5, 0.5)
        self.p = (torch.randn(2, D, device=dev, generator=gen) * bound).clamp(-0.5, 0.5)
        self.weights = [self.a] + ([self.p] if cell == "lstm" else [])
        self.S = D if cell == "gru" else 2 * D
        self.dy = torch.randn(B, L, D, device=dev, generator=gen)

    def u(self, x, W, b):
        return F.linear(x, W, b).view(x.shape[0], x.shape[1], 3, self.D)

    def out(self, s):
        return s[..., -self.D:]

    def step(self):
        return gru_step if self.cell == "gru" else lstm_step

    def jac(self):
        return gru_jac if self.cell == "gru" else lstm_jac

    def structure(self):
        return "diag" if self.cell == "gru" else "block2"


# ---------------------------------------------------------------- implementations: fn(x, W, b, *weights) -> h


def impl_fused(pb: Problem):
    from kernels.newton.fused_gru import flashgru_fused
    from kernels.newton.fused_lstm import flashlstm_fused

    def fn(x, W, b, *w):
        u = pb.u(x, W, b).unsqueeze(0)
        if pb.cell == "gru":
            s = flashgru_fused(u, w[0].unsqueeze(0), 3)[0]
        else:
            s = flashlstm_fused(u, w[0].unsqueeze(0), w[1].unsqueeze(0), 3)[0]
        return pb.out(s[0])

    return fn


def impl_newton(pb: Problem, backend: str):
    def fn(x, W, b, *w):
        s, _ = newton_apply(
            pb.step(), pb.u(x, W, b), w, state_size=pb.S, structure=pb.structure(), jac=pb.jac(),
            iters=3, backend=backend, check=False,
        )
        return pb.out(s)

    return fn


def impl_sequential(pb: Problem):
    def fn(x, W, b, *w):
        return pb.out(sequential_apply(pb.step(), pb.u(x, W, b), w, state_size=pb.S))

    return fn


def impl_pararnn(pb: Problem):
    """The peer's layer with our weights copied into its parameters (its fused path reads them itself).

    ``fn.leaves`` lists the peer's own parameters in the order ``(W, b, a..., p...)``, which the
    checks and the fwd+bwd timing differentiate instead of ours.
    """
    from pararnn import NewtonConfig, ParaRNN
    from pararnn.cells.para_gru import ParaGRU
    from pararnn.cells.para_lstm import ParaLSTM

    cell = (ParaGRU if pb.cell == "gru" else ParaLSTM)(pb.D, pb.D).to(pb.x.device)
    names = ["a_z", "a_r", "a_n"] if pb.cell == "gru" else ["a_f", "a_z", "a_o", "c_f", "c_o"]
    cfg = NewtonConfig(max_iters=3, scan_backend="fused", residual_atol=None, residual_fail=None)
    layer = ParaRNN(cell, config=cfg, solver="newton")
    vals = list(pb.a.unbind(0)) + (list(pb.p.unbind(0)) if pb.cell == "lstm" else [])
    with torch.no_grad():
        cell.W_x.weight.copy_(pb.W)
        cell.W_x.bias.copy_(pb.b)
        for name, v in zip(names, vals):
            getattr(cell, name).copy_(v)
    k = 3

    def fn(x, *_):
        return layer(x)

    fn.leaves = [cell.W_x.weight, cell.W_x.bias, *(getattr(cell, n) for n in names)]
    fn.group = lambda grads: [torch.stack(grads[2:2 + k])] + ([torch.stack(grads[2 + k:])] if pb.cell == "lstm" else [])
    return fn


# ---------------------------------------------------------------- checking and timing


def reference(pb: Problem):
    """float64 loop: ``h`` and the gradients of ``(x, W, b, *weights)`` for the loss ``<h, dy>``."""
    leaves = [t.double().requires_grad_() for t in (pb.x, pb.W, pb.b, *pb.weights)]
    h = impl_sequential(pb)(*leaves)
    grads = torch.autograd.grad(h, leaves, pb.dy.double())
    return h.detach(), grads


def _leaves(fn, pb: Problem):
    """``(inputs to call fn with, tensors to differentiate)``; the peer differentiates its own parameters."""
    x = pb.x.detach().requires_grad_()
    if hasattr(fn, "leaves"):
        return [x, pb.W, pb.b, *pb.weights], [x, *fn.leaves]
    ours = [x] + [t.detach().requires_grad_() for t in (pb.W, pb.b, *pb.weights)]
    return ours, ours


def fwd_bwd(fn, pb: Problem):
    args, leaves = _leaves(fn, pb)

    def run():
        return torch.autograd.grad(fn(*args), leaves, pb.dy)

    return run


def check(fn, pb: Problem, ref) -> float:
    """Max relative error of ``h`` and the gradients of ``x`` and the recurrent weights."""
    h_ref, g_ref = ref
    args, leaves = _leaves(fn, pb)
    h = fn(*args)
    grads = torch.autograd.grad(h, leaves, pb.dy)
    weights = fn.group(grads[1:]) if hasattr(fn, "group") else list(grads[3:])
    errs = [rel_error(h, h_ref), rel_error(grads[0], g_ref[0])] + [rel_error(g, r) for g, r in zip(weights, g_ref[3:])]
    return max(errs)


def _poison_fused():
    from kernels.newton import fused_gru, fused_lstm

    saved = (fused_gru._alloc, fused_lstm._alloc)
    nan = lambda shape, like: torch.full(shape, math.nan, device=like.device)  # noqa: E731
    fused_gru._alloc = fused_lstm._alloc = nan
    return lambda: (setattr(fused_gru, "_alloc", saved[0]), setattr(fused_lstm, "_alloc", saved[1]))


def bench_gpu(cells, lengths, B, D, quick, dev: str = "cuda") -> list[BenchRow]:
    rows: list[BenchRow] = []
    bw = copy_bandwidth_gbs(dev, nbytes=1 << 30 if dev == "cuda" else 1 << 20)
    print(f"# copy bandwidth {bw:.0f} GB/s")
    for cell in cells:
        for L in lengths:
            pb = Problem(cell, B, L, D, dev)
            shape = f"{cell} B={B} L={L} D={D}"
            n = B * L * D
            s_words = 1 if cell == "gru" else 2
            lim_f = (3 + s_words) * 4 * n / (bw * 1e9) * 1e3  # u read, states written
            lim_fb = lim_f + (3 + 2 * s_words + 3) * 4 * n / (bw * 1e9) * 1e3  # u, s, ds read; du written
            ref = reference(pb)
            impls = [("ours fused", impl_fused(pb)), ("ours parallel-triton", impl_newton(pb, "triton")),
                     ("ours parallel", impl_newton(pb, "torch"))]
            if L <= 2048 and not quick:
                impls.append(("ours sequential", impl_sequential(pb)))
            try:
                impls.append((f"pararnn Para{cell.upper()} fused", impl_pararnn(pb)))
            except Exception as e:  # noqa: BLE001
                rows.append(BenchRow("newton", "pararnn", shape, "fwd", "float32", math.nan, note=f"skipped: {e}"))
            args = (pb.x, pb.W, pb.b, *pb.weights)
            for name, fn in impls:
                restore = _poison_fused() if name == "ours fused" else (lambda: None)
                try:
                    err = check(fn, pb, ref)
                except Exception as e:  # noqa: BLE001
                    rows.append(BenchRow("newton", name, shape, "fwd", "float32", math.nan, note=f"failed: {e}"[:200]))
                    continue
                finally:
                    restore()
                slow = name == "ours sequential"
                kw = dict(warmup=1, rep=1) if slow else {}
                with torch.no_grad():
                    t = time_ms(lambda: fn(*args), device=dev, **kw)
                rows.append(BenchRow("newton", name, shape, "fwd", "float32", t, lim_f, err))
                if not slow or L <= 512:
                    t = time_ms(fwd_bwd(fn, pb), device=dev, **kw)
                    rows.append(BenchRow("newton", name, shape, "fwd+bwd", "float32", t, lim_fb, err))
            # the fused kernel alone, given u
            from kernels.newton.fused_gru import flashgru_fused
            from kernels.newton.fused_lstm import flashlstm_fused

            u = pb.u(pb.x, pb.W, pb.b).unsqueeze(0).contiguous()
            a, p = pb.a.unsqueeze(0), pb.p.unsqueeze(0)
            kern = (lambda u_, a_, p_: flashgru_fused(u_, a_, 3)[0]) if cell == "gru" else (lambda u_, a_, p_: flashlstm_fused(u_, a_, p_, 3)[0])
            with torch.no_grad():
                t = time_ms(lambda: kern(u, a, p), device=dev)
            rows.append(BenchRow("newton", "ours fused (kernel)", shape, "fwd", "float32", t, lim_f))
            ul, al, pl = (t_.detach().requires_grad_() for t_ in (u, a, p))
            s = kern(ul, al, pl)
            gs = torch.randn_like(s)
            leaves = (ul, al, pl) if cell == "lstm" else (ul, al)
            t = time_ms(lambda: torch.autograd.grad(kern(ul, al, pl), leaves, gs), device=dev)
            rows.append(BenchRow("newton", "ours fused (kernel)", shape, "fwd+bwd", "float32", t, lim_fb))
            del pb, ref
            if dev == "cuda":
                torch.cuda.empty_cache()
    return rows


# first sweep (H200, 2026-11-21): 8 channels per program beat 16/32 (more programs), long chunks beat short
SWEEP = {"gru": [(128, 8, 4), (256, 8, 8), (128, 4, 4), (64, 8, 2), (256, 8, 4), (64, 16, 4)],
         "lstm": [(64, 8, 4), (128, 8, 8), (64, 4, 4), (128, 8, 4), (32, 8, 2), (32, 16, 4)]}


def sweep(cells, lengths, B, D, dev="cuda") -> list[BenchRow]:
    """Time the fused kernels' configurations ``(CH, BD, num_warps)``, forward and backward."""
    from kernels.newton import fused_gru, fused_lstm

    rows = []
    for cell in cells:
        mod = fused_gru if cell == "gru" else fused_lstm
        saved = mod.config
        try:
            for L in lengths:
                pb = Problem(cell, B, L, D, dev)
                u = pb.u(pb.x, pb.W, pb.b).unsqueeze(0).contiguous().requires_grad_()
                w = [t.unsqueeze(0).requires_grad_() for t in pb.weights]
                fn = fused_gru.flashgru_fused if cell == "gru" else fused_lstm.flashlstm_fused
                ref = None
                for cfg in SWEEP[cell]:
                    mod.config = lambda L_, D_, cfg=cfg: cfg
                    s = fn(u, *w, 3)[0]
                    ref = s if ref is None else ref
                    gs = torch.randn_like(s)
                    with torch.no_grad():
                        t_f = time_ms(lambda: fn(u, *w, 3), device=dev)
                    t_fb = time_ms(lambda: torch.autograd.grad(fn(u, *w, 3)[0], [u, *w], gs), device=dev)
                    name = f"fused CH,BD,warps={cfg}"
                    shape = f"{cell} B={B} L={L} D={D}"
                    rows.append(BenchRow("newton", name, shape, "fwd", "float32", t_f, max_rel_err=rel_error(s, ref)))
                    rows.append(BenchRow("newton", name, shape, "fwd+bwd", "float32", t_fb))
        finally:
            mod.config = saved
    return rows


def bench_cpu(cells, lengths, B, D) -> list[BenchRow]:
    rows = []
    for cell in cells:
        for L in lengths:
            pb = Problem(cell, B, L, D, "cpu")
            shape = f"{cell} B={B} L={L} D={D}"
            args = (pb.x, pb.W, pb.b, *pb.weights)
            seq = impl_sequential(pb)
            with torch.no_grad():
                h_seq = seq(*args)
                t_seq = time_ms(lambda: seq(*args), warmup=1, rep=200, device="cpu")
            rows.append(BenchRow("newton", "ours sequential", shape, "fwd", "float32", t_seq))
            par = impl_newton(pb, "torch")
            with torch.no_grad():
                err = rel_error(par(*args), h_seq)
                t = time_ms(lambda: par(*args), warmup=1, rep=200, device="cpu")
            rows.append(BenchRow("newton", "ours parallel", shape, "fwd", "float32", t, max_rel_err=err,
                                 note=f"{t_seq / t:.2f}x vs sequential"))
    return rows


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels.bench newton", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short lengths, no sequential loop")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--cells", default="gru,lstm")
    p.add_argument("--lengths", default=None, help="comma-separated L (default: 512,2048,8192 on CUDA; 256,1024,4096 on CPU)")
    p.add_argument("--batch", type=int, default=None, help="B (default 8 on CUDA, 4 on CPU)")
    p.add_argument("--dim", type=int, default=None, help="D state channels (default 256 on CUDA, 64 on CPU)")
    p.add_argument("--out", default="benchmarks")
    p.add_argument("--sweep", action="store_true", help="also time the fused kernels' tile configurations")
    args = p.parse_args(argv)
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    bad = [c for c in cells if c not in ("gru", "lstm")]
    if bad:
        raise SystemExit(f"error: unknown cell(s) {bad}; known: gru, lstm")
    if dev == "cpu":
        lengths = [int(v) for v in (args.lengths or "256,1024,4096").split(",")]
        rows = bench_cpu(cells, lengths, args.batch or 4, args.dim or 64)
        baseline = "ours sequential"
    else:
        default = "256,1024" if args.quick else "512,2048,8192"
        lengths = [int(v) for v in (args.lengths or default).split(",")]
        rows = bench_gpu(cells, lengths, args.batch or 8, args.dim or 256, args.quick)
        baseline = "pararnn ParaGRU fused"
    env = environment(dev)
    print(f"# newton benchmark on {env['device']}, {env['date']}")
    if dev != "cpu":
        for cell in cells:
            print_table([r for r in rows if r.shape.startswith(cell)], baseline=f"pararnn Para{cell.upper()} fused")
    else:
        print_table(rows, baseline=baseline)
    print("written:", write_json("newton", rows, env, args.out))
    if args.sweep and dev != "cpu":
        sw = sweep(cells, [lengths[len(lengths) // 2], lengths[-1]], args.batch or 8, args.dim or 256)
        print("# tile sweep")
        print_table(sw)
        print("written:", write_json("newton-sweep", sw, env, args.out))
