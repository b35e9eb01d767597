"""``python -m benchmarks.ops.state_mixers [--quick]``: PD-SSM's scan and the new state-tracking mixers.

Section ``pd_scan`` (float32, ``(B, L, N)``, complex lanes): ``seqkernels.pd_scan``'s log-step scan (eager and
under ``torch.compile``) against the recurrence with dense ``(N, N)`` transitions stepped in a loop (the
form of the authors' PyTorch code, IBM/expressive-sparse-state-space-model ``pdssm.py``), forward and
forward + backward; each checked first against the float64 reference loop (output and the gradients of
``d`` and ``x``). Section ``mixers`` (float32, ``d_model`` 64, the state-tracking preset's shapes): the
``pd_ssm``, ``complex_diag`` and ``mamba3`` mixers per fast backend, forward + backward of the whole
mixer, each checked against the same module's float64 ``reference`` backend (output, input gradient and
every parameter gradient; pd_ssm against its float32 reference, as its selection is an argmax);
mamba_ssm's Mamba-3 SISO kernel (``mamba3_siso_combined``) on the same coefficients where it imports. Writes ``benchmarks/ops/results/state_mixers.json``.
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.ops import common
from mixers import build_mixer
from seqkernels._triton import poisoned
from seqkernels.pd_scan import pd_scan_reference, pd_scan_torch

FAMILY = "state_mixers"
SCAN_SHAPES = [(64, 256, 32), (16, 2048, 64), (256, 40, 32)]
QUICK_SCAN_SHAPES = [(8, 256, 32)]
MIXER_SHAPES = [(256, 40), (256, 256)]  # (batch, length): the preset's training and longest lengths
QUICK_MIXER_SHAPES = [(16, 64)]
MIXERS = {"pd_ssm": ("torch",), "complex_diag": ("triton", "torch"), "mamba3": ("triton", "torch", "ssd")}


def dense_loop(index: torch.Tensor, d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The authors' form: ``A_t`` as a dense ``(N, N)`` complex matrix, ``h_t = A_t h_{t-1} + x_t`` per step."""
    N = index.shape[-1]
    P = torch.nn.functional.one_hot(index, N).transpose(-1, -2).to(d.dtype)  # P[m, n] = [index[n] = m]
    Ar, Ai = P * d[..., None, :, 0], P * d[..., None, :, 1]
    h, out = torch.zeros_like(x[:, 0]), []
    for t in range(x.shape[1]):
        hr, hi = h[..., 0:1], h[..., 1:2]
        h = torch.cat([Ar[:, t] @ hr - Ai[:, t] @ hi, Ar[:, t] @ hi + Ai[:, t] @ hr], dim=-1) + x[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


def scan_problem(shape: tuple[int, int, int], dev: str) -> common.Problem:
    B, L, N = shape
    pb = common.Problem(FAMILY, {"kind": "pd_scan", "batch": B, "length": L, "state": N}, "float32", impls=None)

    def impls() -> list[common.Impl]:
        g = torch.Generator(device=dev).manual_seed(0)
        index = torch.randint(0, N, (B, L, N), device=dev, generator=g)
        angle = 2 * math.pi * torch.rand(B, L, N, device=dev, generator=g)
        r = 0.8 + 0.2 * torch.rand(B, L, N, device=dev, generator=g)
        d = torch.stack([r * torch.cos(angle), r * torch.sin(angle)], dim=-1)
        x = torch.randn(B, L, N, 2, device=dev, generator=g)
        dy = torch.randn_like(x)
        want = common.grads(lambda d_, x_: pd_scan_reference(index, d_, x_), [d.double(), x.double()], dy.double())

        def check(fn):
            with poisoned():
                return common.max_rel_error(common.grads(fn, [d, x], dy), want)

        compiled = torch.compile(lambda d_, x_: pd_scan_torch(index, d_, x_), dynamic=False)
        out = []
        for name, fn, note in (
            ("ours-torch", lambda d_, x_: pd_scan_torch(index, d_, x_), "log-step scan, O(N) per combine"),
            ("ours-torch-compiled", compiled, "torch.compile of the same"),
            ("dense loop (authors' form)", lambda d_, x_: dense_loop(index, d_, x_), "(N, N) matmul per step"),
        ):
            out.append(
                common.Impl(
                    name, common.no_grad(fn, d, x), common.fwd_bwd(fn, [d, x], dy), lambda fn=fn: check(fn), note=note
                )
            )
        return out

    pb.impls = impls
    return pb


def _mixer_grads(mixer, backend: str, u: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    """``[y, du, *dparams]`` of ``mixer`` with ``backend`` for the output gradient ``dy``."""
    mixer.backend = backend
    leaf = u.detach().clone().requires_grad_(True)
    y = mixer(leaf)
    inputs = [leaf, *mixer.parameters()]
    return [y.detach(), *torch.autograd.grad(y, inputs, dy, allow_unused=True)]


def mixer_problem(name: str, shape: tuple[int, int], dev: str) -> common.Problem:
    B, L = shape
    pb = common.Problem(
        FAMILY, {"kind": name, "batch": B, "length": L, "dim": 64}, "float32", impls=None, section="mixers"
    )

    def impls() -> list[common.Impl]:
        torch.manual_seed(0)
        mixer = build_mixer(name, 64).to(dev)
        g = torch.Generator(device=dev).manual_seed(1)
        u, dy = torch.randn(B, L, 64, device=dev, generator=g), torch.randn(B, L, 64, device=dev, generator=g)
        # pd_ssm: its float32 reference (the column argmax is discrete: float64 logits may pick other rows)
        ref_dtype = torch.float32 if name == "pd_ssm" else torch.float64
        want = _mixer_grads(mixer.to(ref_dtype), "reference", u.to(ref_dtype), dy.to(ref_dtype))
        mixer = mixer.float()
        out = []
        for backend in MIXERS[name]:

            def forward(u_, backend=backend):
                mixer.backend = backend
                return mixer(u_)

            def check(backend=backend):
                with poisoned():
                    return common.max_rel_error(_mixer_grads(mixer, backend, u, dy), want)

            out.append(
                common.Impl(f"ours-{backend}", common.no_grad(forward, u), common.fwd_bwd(forward, [u], dy), check)
            )
        if name == "mamba3":
            out.append(mamba_ssm_mamba3(mixer, u, dy, want))
        return out

    pb.impls = impls
    return pb


def mamba_ssm_mamba3(mixer, u: torch.Tensor, dy: torch.Tensor, want: list[torch.Tensor]) -> common.Impl:
    """mamba_ssm's Mamba-3 SISO kernel on our mixer's projections (its argument layout as fla's ``Mamba3``
    passes it); checked on the output against our float64 reference."""
    try:
        from mamba_ssm.ops.triton.mamba3.mamba3_siso_combined import mamba3_siso_combined
    except Exception as err:  # noqa: BLE001 - not installed, or its kernels do not import here
        return common.Impl("mamba_ssm mamba3_siso_combined", None, note=f"skipped: {type(err).__name__}: {err}"[:200])
    import torch.nn.functional as F

    def forward(u_):
        batch, L, d = u_.shape
        x, B, C, dt, a, trap, theta = torch.split(mixer.in_proj(u_), mixer.split, dim=-1)
        dt = F.softplus(dt + mixer.dt_bias)
        adt = torch.clamp(-F.softplus(a), max=-mixer.A_floor) * dt
        H = mixer.num_heads
        y = mamba3_siso_combined(
            Q=mixer.C_norm(C)[:, :, None],
            K=mixer.B_norm(B)[:, :, None],
            V=x.reshape(batch, L, H, -1),
            ADT=adt.transpose(1, 2),
            DT=dt.transpose(1, 2),
            Trap=trap.transpose(1, 2),
            Q_bias=mixer.C_bias,
            K_bias=mixer.B_bias,
            Angles=theta[:, :, None].expand(-1, -1, H, -1).float(),
            D=mixer.D,
            Z=None,
            chunk_size=64,
        )
        return y.reshape(batch, L, d)

    def check():
        with torch.no_grad():
            return common.max_rel_error([forward(u)], want[:1])

    return common.Impl(
        "mamba_ssm mamba3_siso_combined", common.no_grad(forward, u), common.fwd_bwd(forward, [u], dy), check
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops.state_mixers", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one small shape per section")
    common.cli_common(p)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: the state_mixers benchmark needs a CUDA GPU")
    problems = [scan_problem(s, "cuda") for s in (QUICK_SCAN_SHAPES if args.quick else SCAN_SHAPES)]
    problems += [
        mixer_problem(name, s, "cuda") for name in MIXERS for s in (QUICK_MIXER_SHAPES if args.quick else MIXER_SHAPES)
    ]
    env = common.environment("cuda")
    rows = common.run(
        problems, warm_only=args.warm_only, checkpoint=lambda rows: common.write_json(FAMILY, rows, env, args.out)
    )
    common.finish(FAMILY, rows, env, args, baseline="ours-torch")


if __name__ == "__main__":
    main()
