"""The delta-rule mixers (``deltanet``, ``signed_deltanet``, ``deltaproduct``, ``gated_deltanet``) and
``rwkv7``: options, the reference forward against an independent float64 implementation of the
equations with explicit matrices, the identities between them (one Householder step is DeltaNet,
decay 1 is ungated), signed DeltaNet learning parity where DeltaNet cannot, and on a GPU with
flash-linear-attention the fla backends against the float64 reference (forward and all gradients).
"""

import math

import pytest
import torch
import torch.nn.functional as F

import mixers
from experiments.trial.shape import ModelShape
from mixers.delta import DeltaRuleMixer
from mixers.rwkv7 import RWKV7
from seqkernels.delta import fla_available

F64 = torch.float64


def build(name, d=12, **options):
    return mixers.build_mixer(name, d, **options)


# ------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("deltanet", {"num_heads": 5}, "d_model=12 must be divisible by num_heads=5"),
        ("deltanet", {"num_heads": 0}, "num_heads must be a positive int, got 0"),
        ("signed_deltanet", {"qk_norm": "none"}, "qk_norm must be one of l2, sum, got 'none'"),
        ("deltanet", {"short_conv": 1}, "short_conv must be True or False, got 1"),
        ("deltaproduct", {"householders": 0}, "householders must be a positive int, got 0"),
        ("deltaproduct", {"signed": "yes"}, "signed must be True or False"),
        (
            "gated_deltanet",
            {"backend": "tirton"},
            "unknown backend 'tirton'; valid: auto, reference, chunk, triton, triton_chunk, fla, fla_recurrent",
        ),
        ("gated_deltanet", {"backend": "fla_recurrent"}, "'fla_recurrent' has no forget gate"),
        ("deltaproduct", {"forget_gate": True, "backend": "fla_recurrent"}, "'fla_recurrent' has no forget gate"),
        ("rwkv7", {"num_heads": 5}, "d_model=12 must be divisible by num_heads=5"),
        (
            "rwkv7",
            {"backend": "fla_recurrent"},
            "unknown backend 'fla_recurrent'; valid: auto, reference, chunk, triton, triton_chunk, fla",
        ),
    ],
)
def test_bad_options_raise_value_error(name, options, match):
    with pytest.raises(ValueError, match=match):
        build(name, **options)


@pytest.mark.parametrize(
    "name,key",
    [
        ("deltanet", "householders"),
        ("signed_deltanet", "signed"),
        ("gated_deltanet", "forget_gate"),
        ("rwkv7", "short_conv"),
        ("deltaproduct", "d_state"),
    ],
)
def test_unknown_keys_raise_type_error(name, key):
    with pytest.raises(TypeError, match=key):
        build(name, **{key: 2})


def test_defaults_and_attributes():
    for name in ("deltanet", "signed_deltanet", "deltaproduct", "gated_deltanet", "rwkv7"):
        assert getattr(build(name), "graph_capturable", True) and not getattr(build(name), "stackable", False)
    for name in ("deltanet", "signed_deltanet", "deltaproduct", "gated_deltanet", "rwkv7"):
        m = build(name)
        assert m.num_heads == 4
    dn, sdn, dp, gdn = (build(n) for n in ("deltanet", "signed_deltanet", "deltaproduct", "gated_deltanet"))
    assert (dn.signed, sdn.signed, dp.signed, gdn.signed) == (False, True, True, False)
    assert (dp.householders, dp.forget_gate, gdn.forget_gate) == (2, False, True)
    assert (dn.output_gate, sdn.output_gate, dp.output_gate, gdn.output_gate) == (False, False, True, True)
    assert not any(m.short_conv for m in (dn, sdn, dp, gdn)) and all(m.qk_norm == "l2" for m in (dn, sdn, dp, gdn))


# ---------------------------------------------------------------- independent float64 implementation


def _conv(x, conv):
    """Causal depthwise conv written out: y_t = sum_j w_j x_{t - K + 1 + j}."""
    K, L = conv.weight.shape[-1], x.shape[1]
    padded = F.pad(x, (0, 0, K - 1, 0))
    return sum(padded[:, j : j + L] * conv.weight[:, 0, j] for j in range(K))


def manual_delta(m: DeltaRuleMixer, x):
    """The module docstring's equations, with the state updated by explicit transition matrices."""
    B, L, d = x.shape
    H, D, n = m.num_heads, m.head_dim, m.householders
    q, k, v = x @ m.q_proj.weight.T, x @ m.k_proj.weight.T, x @ m.v_proj.weight.T
    if m.short_conv:
        q, k, v = _conv(q, m.q_conv), _conv(k, m.k_conv), _conv(v, m.v_conv)
    q, k, v = F.silu(q).view(B, L, H, D), F.silu(k).view(B, L, n, H, D), F.silu(v).view(B, L, n, H, D)
    if m.qk_norm == "l2":
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    else:
        q, k = q / q.abs().sum(-1, keepdim=True).clamp_min(1e-6), k / k.abs().sum(-1, keepdim=True).clamp_min(1e-6)
    beta = (2 if m.signed else 1) / (1 + torch.exp(-(x @ m.b_proj.weight.T))).view(B, L, n, H)
    alpha = torch.ones(B, L, H, dtype=x.dtype)
    if m.forget_gate:
        alpha = torch.exp(-torch.exp(m.A_log) * F.softplus(x @ m.a_proj.weight.T + m.dt_bias))
    o = torch.zeros(B, L, H, D, dtype=x.dtype)
    eye = torch.eye(D, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(D, D, dtype=x.dtype)
            for t in range(L):
                S = alpha[b, t, h] * S
                for j in range(n):
                    kj = k[b, t, j, h]
                    S = S @ (eye - beta[b, t, j, h] * torch.outer(kj, kj)) + beta[b, t, j, h] * torch.outer(
                        v[b, t, j, h], kj
                    )
                o[b, t, h] = S @ q[b, t, h] / math.sqrt(D)
    o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + 1e-5) * m.o_norm.weight
    if m.output_gate:
        o = o * F.silu(x @ m.g_proj.weight.T).view(B, L, H, D)
    return o.reshape(B, L, d) @ m.o_proj.weight.T


DELTA_CASES = [
    ("deltanet", {"num_heads": 1}),
    ("signed_deltanet", {"num_heads": 3, "short_conv": True}),
    ("signed_deltanet", {"num_heads": 3, "qk_norm": "sum", "output_gate": True}),
    ("deltaproduct", {"num_heads": 3}),
    ("deltaproduct", {"num_heads": 1, "householders": 3, "forget_gate": True, "short_conv": True, "signed": False}),
    ("gated_deltanet", {"num_heads": 3}),
    ("gated_deltanet", {"num_heads": 3, "signed": True, "output_gate": False}),
]


@pytest.mark.parametrize("L", [1, 13])
@pytest.mark.parametrize("name,options", DELTA_CASES, ids=[f"{n}-{o}" for n, o in DELTA_CASES])
def test_reference_forward_matches_the_equations(name, options, L):
    torch.manual_seed(L)
    m = build(name, **options, backend="reference").double()
    x = torch.randn(2, L, 12, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), manual_delta(m, x))


@pytest.mark.parametrize("signed,name", [(False, "deltanet"), (True, "signed_deltanet")])
@pytest.mark.parametrize("output_gate", [False, True])
def test_deltaproduct_with_one_householder_is_deltanet(signed, name, output_gate):
    torch.manual_seed(1)
    dp = build("deltaproduct", householders=1, signed=signed, output_gate=output_gate, num_heads=3).double()
    dn = build(name, output_gate=output_gate, num_heads=3).double()
    dn.load_state_dict(dp.state_dict())
    x = torch.randn(2, 17, 12, dtype=F64, requires_grad=True)
    y_dp, y_dn = dp(x), dn(x)
    torch.testing.assert_close(y_dp, y_dn)
    torch.testing.assert_close(
        torch.autograd.grad(y_dp.square().sum(), x)[0], torch.autograd.grad(y_dn.square().sum(), x)[0]
    )


@pytest.mark.parametrize("signed", [False, True])
def test_gated_deltanet_with_decay_one_is_deltanet(signed):
    torch.manual_seed(2)
    gdn = build("gated_deltanet", signed=signed, num_heads=3).double()
    with torch.no_grad():
        gdn.A_log.fill_(-math.inf)  # exp(A_log) = 0: g = 0, alpha = 1
    dn = build("signed_deltanet" if signed else "deltanet", output_gate=True, num_heads=3).double()
    missing = dn.load_state_dict(gdn.state_dict(), strict=False)
    assert set(missing.unexpected_keys) == {"A_log", "dt_bias", "a_proj.weight"} and not missing.missing_keys
    x = torch.randn(2, 11, 12, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(gdn(x), dn(x))
        gdn.A_log.fill_(0.0)
        assert not torch.allclose(gdn(x), dn(x))


def test_gated_deltaproduct_with_decay_one_is_deltaproduct():
    torch.manual_seed(3)
    gated = build("deltaproduct", householders=3, forget_gate=True, num_heads=3).double()
    with torch.no_grad():
        gated.A_log.fill_(-math.inf)
    plain = build("deltaproduct", householders=3, num_heads=3).double()
    plain.load_state_dict(gated.state_dict(), strict=False)
    x = torch.randn(1, 9, 12, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(gated(x), plain(x))


def test_gated_decay_is_in_zero_one():
    torch.manual_seed(4)
    m = build("gated_deltanet", d=16)
    x = torch.randn(4, 20, 16) * 5
    g = -torch.exp(m.A_log) * F.softplus(m.a_proj(x) + m.dt_bias)
    assert (g <= 0).all() and (torch.exp(g) > 0).all()


# ------------------------------------------------------------------------------------------- RWKV-7


def manual_rwkv7(m: RWKV7, x):
    """RWKV-7's time mixing from the paper's equations: per head a (D x D) state with the explicit
    transition diag(w_t) - kk_t^T (a_t * kk_t), S_t = S_{t-1} T_t + v_t^T k_t, o_t = S_t r_t."""
    B, L, d = x.shape
    H, D = m.num_heads, m.head_dim
    prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
    mix = {c: x + (prev - x) * m.mu[c] for c in "rwkvag"}
    lora = lambda low, z, act: (
        act(z @ low.down.weight.T) @ low.up.weight.T + (0 if low.up.bias is None else low.up.bias)
    )
    r, k, v = mix["r"] @ m.r_proj.weight.T, mix["k"] @ m.k_proj.weight.T, mix["v"] @ m.v_proj.weight.T
    w = torch.exp(-math.exp(-0.5) / (1 + torch.exp(-lora(m.w_lora, mix["w"], torch.tanh))))
    a = 1 / (1 + torch.exp(-lora(m.a_lora, mix["a"], lambda z: z)))
    g = lora(m.g_lora, mix["g"], torch.sigmoid)
    kk = (k * m.k_k).view(B, L, H, D)
    kk = kk / kk.norm(dim=-1, keepdim=True)
    k = k * (1 + (a - 1) * m.k_a)
    r, k, v, w, a = (t.view(B, L, H, D) for t in (r, k, v, w, a))
    o = torch.zeros(B, L, H, D, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(D, D, dtype=x.dtype)
            for t in range(L):
                T = torch.diag(w[b, t, h]) - torch.outer(kk[b, t, h], a[b, t, h] * kk[b, t, h])
                S = S @ T + torch.outer(v[b, t, h], k[b, t, h])
                o[b, t, h] = S @ r[b, t, h]
    mean, var = o.mean(-1, keepdim=True), o.var(-1, unbiased=False, keepdim=True)
    o = ((o - mean) / torch.sqrt(var + D * 1e-5)).reshape(B, L, d) * m.g_norm.weight + m.g_norm.bias
    bonus = ((r * k * m.r_k).sum(-1, keepdim=True) * v).reshape(B, L, d)
    return ((o + bonus) * g) @ m.o_proj.weight.T


@pytest.mark.parametrize("heads,L", [(1, 1), (3, 13)])
def test_rwkv7_reference_matches_the_equations(heads, L):
    torch.manual_seed(5)
    m = build("rwkv7", num_heads=heads, backend="reference").double()
    with torch.no_grad():  # move every parameter off its structured init so each term matters
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, L, 12, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), manual_rwkv7(m, x))


@pytest.mark.parametrize("L", [1, 67, 130])
def test_rwkv7_chunk_backend_matches_float64_reference(L):
    """The chunkwise DPLR form (``backend="chunk"``, what ``"auto"`` takes on a CPU: factored chunks of 64
    under RWKV-7's decay bound) in a float32 model against the same weights in float64 on the reference:
    output, input and every parameter gradient."""
    torch.manual_seed(L)
    errors = errors_against_float64("rwkv7", {}, "chunk", 3, 48, L, "cpu")
    assert all(e <= 1e-4 for e in errors.values()), {k: f"{v:.1e}" for k, v in errors.items()}  # NaN fails


def test_rwkv7_decay_is_in_its_range():
    """w = exp(-e^{-1/2} sigmoid(.)) lies in (exp(-e^{-1/2}), 1) = (0.545, 1) for any input."""
    torch.manual_seed(6)
    m = build("rwkv7", d=16, num_heads=2)
    x = torch.randn(3, 7, 16) * 10
    prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
    w = torch.exp(-math.exp(-0.5) * torch.sigmoid(m.w_lora(x + (prev - x) * m.mu["w"]))).view(3, 7, 2, 8)
    assert ((w > math.exp(-math.exp(-0.5)) - 1e-6) & (w < 1)).all()


# -------------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_signed_deltanet_learns_parity_and_deltanet_does_not():
    """Grazzi et al. 2025 in one layer: beta in [0, 2] tracks running parity at the training lengths,
    beta in [0, 1] stays near chance (the smoke preset's parity at a smaller budget)."""
    from experiments.trial.train import TrainConfig, TrialSpec, quiet_lightning, run_trial

    quiet_lightning()
    results = {}
    for name in ("signed_deltanet", "deltanet"):
        spec = TrialSpec(
            task="parity",
            model=ModelShape(mixer=name, mixer_options={"backend": "reference"}),
            lr=5e-3,
            seed=0,
            extrapolation={"min_len": 3, "max_len": 12, "eval_lengths": [12]},
            train=TrainConfig(
                max_steps=400, batch_size=32, train_size=2000, val_size=200, test_size=500, eval_every=100
            ),
        )
        results[name] = run_trial(spec)
    assert results["signed_deltanet"]["test/acc"] >= 0.99, results["signed_deltanet"]
    assert results["deltanet"]["test/acc"] <= 0.75, results["deltanet"]


# ------------------------------------------------------------------------------------------------ GPU


def needs_fla(test):
    test = pytest.mark.skipif(not fla_available(), reason="needs flash-linear-attention (fla)")(test)
    test = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test)
    return pytest.mark.gpu(test)


def rel(x, y, floor=0.0):
    """Relative norm error; the denominator at least ``floor`` (a tensor whose reference is zero or nearly
    so, e.g. a decay's gradient at length 1, is measured against the other tensors' scale)."""
    return float((x.double() - y.double()).norm() / max(float(y.double().norm()), floor, 1e-30))


def errors_against_float64(name, options, backend, heads, d, L, device):
    """Relative norm errors of a float32 mixer on ``backend`` against the same weights in float64 on the
    reference: output, input gradient and every parameter gradient (a gradient whose reference is zero or
    nearly so measured against a hundredth of the largest one's norm)."""
    fast = build(name, d, num_heads=heads, backend=backend, **options).to(device)
    slow = build(name, d, num_heads=heads, backend="reference", **options).to(device).double()
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, L, d, device=device)
    x_fast, x_slow = x.clone().requires_grad_(), x.double().requires_grad_()
    y_fast, y_slow = fast(x_fast), slow(x_slow)
    dy = torch.randn_like(y_slow)
    y_fast.backward(dy.float())
    y_slow.backward(dy)
    assert y_fast.dtype == torch.float32 and torch.isfinite(y_fast).all()
    errors = {"out": rel(y_fast, y_slow), "dx": rel(x_fast.grad, x_slow.grad)}
    slow_params = dict(slow.named_parameters())
    floor = 1e-2 * max(float(p.grad.norm()) for p in slow_params.values())
    for pname, p in fast.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None, pname
        errors[f"d{pname}"] = rel(p.grad, slow_params[pname].grad, floor)
    return errors


GPU_CASES = [
    ("deltanet", {}, "fla", 2e-2),
    ("signed_deltanet", {"short_conv": True}, "fla", 2e-2),
    ("signed_deltanet", {}, "fla_recurrent", 1e-4),
    ("deltaproduct", {}, "fla", 2e-2),
    ("deltaproduct", {"householders": 3, "forget_gate": True}, "auto", 2e-2),
    ("deltaproduct", {"householders": 2, "signed": True}, "triton", 1e-4),
    ("signed_deltanet", {}, "triton", 1e-4),
    ("deltaproduct", {"signed": True}, "fla_recurrent", 1e-4),
    ("deltaproduct", {"householders": 3, "forget_gate": True}, "chunk", 1e-4),
    ("gated_deltanet", {}, "auto", 2e-2),
    ("gated_deltanet", {"signed": True}, "chunk", 1e-4),
    ("gated_deltanet", {"signed": True}, "triton_chunk", 1e-4),
    ("deltaproduct", {"householders": 3, "forget_gate": True}, "triton_chunk", 1e-4),
    ("rwkv7", {}, "fla", 2e-2),
    ("rwkv7", {}, "triton", 1e-4),
    ("rwkv7", {}, "chunk", 1e-4),
    ("rwkv7", {}, "triton_chunk", 1e-4),
]


@needs_fla
@pytest.mark.parametrize("L", [1, 67, 130])
@pytest.mark.parametrize("heads,d", [(1, 32), (3, 48)])
@pytest.mark.parametrize("name,options,backend,tol", GPU_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in GPU_CASES])
def test_gpu_fla_backend_matches_float64_reference(name, options, backend, tol, heads, d, L):
    """The fla backend in a float32 model against the same weights in float64 on the reference:
    output, input gradient and every parameter gradient, relative norm errors (bfloat16 chunk kernels:
    ~1e-2; the float32 fused recurrent kernel: 1e-4)."""
    torch.manual_seed(L + heads)
    errors = errors_against_float64(name, options, backend, heads, d, L, "cuda")
    if L == 1 and tol >= 1e-2:  # one token: a few bfloat16 roundings (u = 2^-8) dominate a norm of 2 x d numbers
        tol = 5e-2
    assert all(e <= tol for e in errors.values()), {k: f"{v:.1e}" for k, v in errors.items()}  # NaN fails


@needs_fla
@pytest.mark.parametrize("layer", ["fla:GatedDeltaNet", "fla:GatedDeltaProduct"])
def test_gpu_fla_gated_layers_train(layer):
    """fla's gated layers run forward and backward on this GPU (on Hopper with Triton 3.4-3.7.0 fla refuses
    its own gated backward; ``fla_gated_bwd`` stands in), with finite gradients for every parameter."""
    torch.manual_seed(0)
    m = mixers.build_mixer(layer, 64).cuda()
    x = torch.randn(4, 70, 64, device="cuda", requires_grad=True)
    m(x).square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    "name, options",
    [
        ("deltaproduct", {"householders": 3, "forget_gate": True}),
        ("gated_deltanet", {"signed": True}),
        ("deltanet", {"qk_norm": "sum", "short_conv": True}),
    ],
)
def test_transitions_are_the_recurrences_state_map(name, options):
    """``DeltaRuleMixer.transitions``: the state map of one token, as the reference kernel's delta step
    computes it from the identity state with zero values (decay first), at 3 heads of 4 channels."""
    from seqkernels.delta.reference import _delta_step, l2norm

    torch.manual_seed(5)
    m = mixers.build_mixer(name, 12, num_heads=3, **options).double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    A = m.transitions(x)
    _q, k, _v, beta, g = m.projections(x)
    if m.qk_norm == "l2":
        k = l2norm(k)
    B, L, n, H, D = k.shape
    S = torch.eye(D, dtype=torch.float64).repeat(B * L, H, 1, 1)
    if g is not None:
        S = S * torch.exp(g).reshape(B * L, H)[..., None, None]
    zero = torch.zeros(B * L, H, D, dtype=torch.float64)
    for j in range(n):
        S = _delta_step(S, k[:, :, j].reshape(B * L, H, D), zero, beta[:, :, j].reshape(B * L, H))
    torch.testing.assert_close(A.reshape(B * L, H, D, D), S, rtol=0, atol=1e-13)
    assert not torch.allclose(A, torch.eye(D, dtype=torch.float64).expand_as(A))


def test_rwkv7_transitions_are_the_kernels_state_map():
    """``RWKV7.transitions``: probed through the reference ``dplr_delta_rule`` itself. A first step writes
    ``S = e_0 e_j^T``; a second with the position's decay and removal terms and no write reads
    ``o = S A q``, so ``q = e_m`` gives ``A[j, m]`` (3 heads of 4 channels, every position)."""
    from seqkernels.delta.reference import dplr_delta_rule

    torch.manual_seed(6)
    m = mixers.build_mixer("rwkv7", 12, num_heads=3).double()
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    A = m.transitions(x)[0]  # (L, H, D, D)
    _r, _k, _v, kk, a, log_w, _g = m.projections(x)
    L, H, D = A.shape[0], A.shape[1], A.shape[-1]
    eye = torch.eye(D, dtype=torch.float64)
    got = torch.empty_like(A)
    for t in range(L):
        for j in range(D):
            # batch over m: (D, 2, H, D) sequences of two steps
            def two(first, second):
                return torch.stack([first.expand(D, H, D), second.expand(D, H, D)], dim=1)

            q = two(torch.zeros(D, 1, D, dtype=torch.float64), eye[:, None, :])
            k = two(eye[j], torch.zeros(D, dtype=torch.float64))
            v = two(eye[0], torch.zeros(D, dtype=torch.float64))
            w = two(torch.zeros(H, D, dtype=torch.float64), log_w[0, t])
            aa = two(torch.zeros(H, D, dtype=torch.float64), -kk[0, t])
            bb = two(torch.zeros(H, D, dtype=torch.float64), (kk * a)[0, t])
            o = dplr_delta_rule(q, k, v, aa, bb, w)  # (D, 2, H, D)
            got[t, :, j, :] = o[:, 1, :, 0].T  # [h, m] = A[h, j, m]
    torch.testing.assert_close(got, A.detach(), rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    "name,options,backend",
    [
        ("deltaproduct", {"householders": 2, "signed": True, "forget_gate": True}, "triton"),
        ("rwkv7", {}, "triton"),
        ("rwkv7", {}, "triton_chunk"),
        ("deltanet", {}, "triton"),
        ("deltaproduct", {"householders": 2, "signed": True, "forget_gate": True}, "triton_chunk"),
        ("gated_deltanet", {}, "triton_chunk"),
    ],
)
def test_triton_backend_matches_float64_reference(name, options, backend):
    """Our fused recurrent kernel (``backend="triton"``) and chunkwise kernels (``"triton_chunk"``; the
    interpreter on the CPU) in a float32 model against the same weights in float64 on the reference:
    output, input and every parameter gradient."""
    from seqkernels._triton import triton_available

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not triton_available(torch.empty(0, device=device)):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    torch.manual_seed(0)
    errors = errors_against_float64(name, options, backend, 2, 16, 11, device)
    assert all(e <= 1e-4 for e in errors.values()), {k: f"{v:.1e}" for k, v in errors.items()}  # NaN fails
