"""The classical RNN mixers ``lstm``, ``gru``, ``elman``, ``slstm`` (mixers/rnn.py), and the
initialization of the Newton cells ``flashgru`` / ``flashlstm`` (mixers/cells/flash.py).

Backends agree (the Triton ones under ``TRITON_INTERPRET=1`` on the CPU), and each cell learns
parity on short sequences and extrapolates to 3x longer ones (paper 001 §6.3), with the reference
backend and a tiny hand-written training loop. FlashGRU/FlashLSTM initial parameters have the
statistics of paper 000 App. C.1 as apple/ml-pararnn draws them.
"""

import math

import pytest
import torch

from mixers import build_mixer
from mixers.cells.flash import FlashGRUCell

TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled kernels on a GPU, the interpreter on a CPU

CELLS = ("lstm", "gru", "elman", "slstm")


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("backend", ["triton", "alternating"])
def test_backends_compute_the_same_function(cell, backend):
    torch.manual_seed(0)
    ref = build_mixer(cell, 32, num_heads=2, backend="reference").to(TRITON_DEVICE)
    fast = build_mixer(cell, 32, num_heads=2, backend=backend).to(TRITON_DEVICE)
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(3, 7, 32).to(TRITON_DEVICE)
    y_ref, y = ref(x), fast(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    g_ref = torch.autograd.grad(y_ref, list(ref.parameters()), dy)
    g = torch.autograd.grad(y, list(fast.parameters()), dy)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bad_configuration():
    with pytest.raises(ValueError, match="unknown backend"):
        build_mixer("lstm", 16, backend="cuda")
    with pytest.raises(ValueError, match="divisible"):
        build_mixer("gru", 18, num_heads=4)


def _parity_batch(n, length, gen):
    bits = torch.randint(0, 2, (n, length), generator=gen)
    return bits, bits.cumsum(1) % 2


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.slow
def test_parity_with_length_extrapolation(cell):
    """Train on running parity of lengths 2..12 (400 Adam steps, one head of 16), then score the
    parity of the whole sequence at length 36: every cell reaches >= 0.95 (1.0 on 4 seeds tried)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead
    try:
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        d = 16
        emb, head = torch.nn.Embedding(2, d), torch.nn.Linear(d, 2)
        mixer = build_mixer(cell, d, num_heads=1, backend="reference")
        modules = torch.nn.ModuleList([emb, mixer, head])
        opt = torch.optim.Adam(modules.parameters(), lr=1e-2)
        for _ in range(400):
            bits, target = _parity_batch(64, int(torch.randint(2, 13, (1,), generator=gen)), gen)
            logits = head(mixer(emb(bits)))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), target.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            bits, target = _parity_batch(512, 36, gen)
            accuracy = (head(mixer(emb(bits)))[:, -1].argmax(-1) == target[:, -1]).float().mean().item()
    finally:
        torch.set_num_threads(threads)
    assert accuracy >= 0.95, f"{cell}: parity accuracy {accuracy:.3f} at length 36"


@pytest.mark.parametrize("name", ["flashgru", "flashlstm"])
def test_flash_init_statistics(name):
    """B ~ U(+-sqrt(3 / d_in)) (Kaiming-uniform, gain 1); a (and the LSTM's peepholes p) ~ N(0, 1/n)
    truncated to [-0.9, 0.9], n the whole mixer's state width; b = 0. d_model 384 in 3 heads of 128."""
    torch.manual_seed(0)
    d_model, heads = 384, 3
    mixer = build_mixer(name, d_model, num_heads=heads, verify=False)
    with torch.no_grad():
        p = mixer.stacked_parameters()
    bound = math.sqrt(3 / (d_model // heads))
    B = p["B"].flatten()  # 3 * 3 * 128 * 128 = 147,456 draws
    assert float(B.abs().max()) <= bound and float(B.abs().max()) > 0.999 * bound
    assert float(B.var()) == pytest.approx(bound**2 / 3, rel=0.02)  # var of U(-c, c) = c^2 / 3
    assert float(B.mean()) == pytest.approx(0.0, abs=0.01 * bound)
    diagonals = torch.cat([p[k].flatten() for k in ("a", "p") if k in p])  # 1,152 or 1,920 draws
    assert float(diagonals.std()) == pytest.approx(1 / math.sqrt(d_model), rel=0.07)
    assert (p["b"] == 0).all()


def test_flash_diagonals_are_truncated_not_clamped():
    """With std 1 (a one-channel state), the diagonals follow N(0, 1) truncated to [-0.9, 0.9]:
    std sqrt(1 - 2 t phi(t) / (2 Phi(t) - 1)) = 0.492 at t = 0.9, none at the bounds (a clamp would
    give std 0.67 with 37% of the mass at +-0.9)."""
    torch.manual_seed(1)
    cell = FlashGRUCell(1, 1, clip_norm=None)
    draws = []
    for _ in range(2000):
        cell.reset_parameters()
        draws.append(cell.a.detach().flatten().clone())
    a = torch.cat(draws)  # 6,000 draws
    t = 0.9
    pdf, mass = math.exp(-t * t / 2) / math.sqrt(2 * math.pi), math.erf(t / math.sqrt(2))
    assert float(a.abs().max()) < t
    assert float(a.std()) == pytest.approx(math.sqrt(1 - 2 * t * pdf / mass), rel=0.03)
