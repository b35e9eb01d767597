"""The mlstm_exp / mlstm_sig mixers: backends agree, causal, paper-002 init, they learn, bad configs fail."""

import os

import pytest
import torch

from mixers import MIXERS, build_mixer

TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled kernels on a GPU, the interpreter on a CPU


def _run(mixer, backend, u):
    mixer.backend = backend
    u = u.clone().requires_grad_(True)
    y = mixer(u)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype).to(y.device)
    return y.detach(), torch.autograd.grad((y * w).sum(), [u, *mixer.parameters()])


@pytest.mark.parametrize("name", ["mlstm_exp", "mlstm_sig"])
def test_backends_agree_float64(name):
    torch.manual_seed(1)
    mixer = build_mixer(name, 16, num_heads=2, chunk_size=4, qk_dim=4, igate_bias=0.0).double()
    u = torch.randn(2, 11, 16, dtype=torch.float64)
    y_ref, g_ref = _run(mixer, "parallel", u)
    for backend in ("reference", "torch", "auto"):
        y, g = _run(mixer, backend, u)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(), reason="needs Triton")
@pytest.mark.parametrize("name", ["mlstm_exp", "mlstm_sig"])
def test_triton_backend_matches(name):
    torch.manual_seed(2)
    mixer = build_mixer(name, 16, num_heads=2, chunk_size=16, igate_bias=0.0).to(TRITON_DEVICE)
    u = torch.randn(1, 19, 16).to(TRITON_DEVICE)
    y_ref, g_ref = _run(mixer, "parallel", u)
    y, g = _run(mixer, "triton", u)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_init_and_parameter_count():
    mixer = build_mixer("mlstm_exp", 64)
    assert sum(p.numel() for p in mixer.parameters()) == 21128
    bias = mixer.gates.bias.detach()
    assert torch.all(bias[:4] == -10.0)
    torch.testing.assert_close(bias[4:], torch.tensor([3.0, 4.0, 5.0, 6.0]))
    assert set(MIXERS) >= {"mlstm_exp", "mlstm_sig"}


def _recall_batch(g, n=32, pairs=4, queries=8):
    """Keys 0..7 (distinct) paired with values 8..15, then queries of those keys; targets: the values."""
    keys = torch.argsort(torch.rand(n, 8, generator=g), dim=1)[:, :pairs]
    vals = 8 + torch.randint(0, 8, (n, pairs), generator=g)
    idx = torch.randint(0, pairs, (n, queries), generator=g)
    context = torch.stack([keys, vals], 2).reshape(n, 2 * pairs)
    return torch.cat([context, keys.gather(1, idx)], 1), vals.gather(1, idx)


@pytest.mark.parametrize("name", ["mlstm_exp", "mlstm_sig"])
def test_learns_a_recall_task(name):
    """Without mixing, the best loss at the queries is log(8) = 2.08 (the values are random)."""
    torch.manual_seed(4)
    V, d = 16, 32
    emb, head = torch.nn.Embedding(V, d), torch.nn.Linear(d, V)
    mixer = build_mixer(name, d, num_heads=2)
    opt = torch.optim.Adam([*emb.parameters(), *head.parameters(), *mixer.parameters()], lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(120):
        x, y = _recall_batch(g)
        h = emb(x)
        logits = head(h + mixer(torch.nn.functional.rms_norm(h, (d,))))
        loss = torch.nn.functional.cross_entropy(logits[:, 8:].reshape(-1, V), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 1.75, losses[-10:]


def test_bad_configs():
    with pytest.raises(ValueError, match="divisible"):
        build_mixer("mlstm_exp", 10, num_heads=4)
    with pytest.raises(ValueError, match="unknown backend"):
        build_mixer("mlstm_sig", 8, backend="fast")
    with pytest.raises(ValueError, match="norm"):
        build_mixer("mlstm_sig", 8, norm="batch")
    with pytest.raises(TypeError):
        build_mixer("mlstm_exp", 8, input_gate="sig")
    with pytest.raises(TypeError):
        build_mixer("mlstm_exp", 8, d_state=3)
    with pytest.raises(ValueError, match="expected input"):
        build_mixer("mlstm_exp", 8)(torch.randn(3, 8))
