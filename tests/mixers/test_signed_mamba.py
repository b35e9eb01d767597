"""signed_mamba / unsigned_mamba: every scan backend equals the reference loop (forward and gradients),
unsigned_mamba is exactly the mamba mixer, and the [-1, 1] range solves parity where [0, 1] does not."""

import os

import pytest
import torch

from experiments.trial.shape import ModelShape
from mixers import MIXERS, build_mixer
from mixers.mamba import Mamba
from mixers.signed_mamba import SignedMamba

NEEDS_TRITON = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _run(mixer, backend, u, weights):
    mixer.backend = backend
    u = u.clone().requires_grad_(True)
    y = mixer(u)
    inputs = [u, *mixer.parameters()]
    grads = torch.autograd.grad((y * weights).sum(), inputs, allow_unused=True)  # L = 1: A_log is unused
    return y.detach(), [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def _assert_backend_matches_reference(mixer, backend, u, rtol, atol, reference_dtype=torch.float64):
    """``backend`` in ``u``'s dtype against the reference loop run in ``reference_dtype``. ``atol`` is relative
    to each tensor's largest entry (at least 1): a float32 gradient summed over B*L positions carries a
    rounding error that grows with its scale (in_proj.weight at (8, 256, 64): entries up to 3.5e3, error
    2e-3 in the float32 reference loop itself)."""
    g = torch.Generator(device=u.device).manual_seed(7)
    weights = torch.randn(u.shape[:2] + (u.shape[2],), generator=g, device=u.device, dtype=reference_dtype)
    ref = mixer.to(reference_dtype)
    y_ref, g_ref = _run(ref, "reference", u.to(reference_dtype), weights)
    fast = mixer.to(u.dtype)
    y, grads = _run(fast, backend, u, weights.to(u.dtype))

    def scaled(ref):
        return atol * max(1.0, ref.abs().max().item())

    torch.testing.assert_close(y.to(reference_dtype), y_ref, rtol=rtol, atol=scaled(y_ref))
    for (name, _), a, b in zip([("input", None), *fast.named_parameters()], grads, g_ref):
        torch.testing.assert_close(
            a.to(reference_dtype), b, rtol=rtol, atol=scaled(b), msg=lambda m, name=name: f"grad {name}: {m}"
        )


def _mixer(name, d_model, d_state, seed):
    torch.manual_seed(seed)
    mixer = build_mixer(name, d_model, d_state=d_state)
    with torch.no_grad():  # larger steps than the init, so transitions spread over the whole range
        mixer.dt_bias.add_(torch.linspace(0.0, 4.0, d_model))
    return mixer


@pytest.mark.parametrize("name", ["signed_mamba", "unsigned_mamba"])
@pytest.mark.parametrize("batch,length,d_model,d_state", [(2, 1, 8, 3), (3, 7, 6, 5), (1, 33, 16, 4)])
def test_torch_scan_equals_reference_loop_float64(name, batch, length, d_model, d_state):
    mixer = _mixer(name, d_model, d_state, seed=length)
    u = torch.randn(batch, length, d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    _assert_backend_matches_reference(mixer, "torch", u, rtol=1e-10, atol=1e-11)


@NEEDS_TRITON
@pytest.mark.parametrize("name", ["signed_mamba", "unsigned_mamba"])
def test_triton_scan_equals_reference_loop(name):
    """Float32 Triton scan (CPU interpreter or GPU) against the float64 loop; a small shape."""
    from seqkernels.scan._interpret import use_vectorized_interpreter_scan

    use_vectorized_interpreter_scan()
    mixer = _mixer(name, 8, 4, seed=3)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    u = torch.randn(2, 19, 8, generator=torch.Generator().manual_seed(3)).to(device)
    _assert_backend_matches_reference(mixer.to(device), "triton", u, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["auto", "triton", "torch"])
@pytest.mark.parametrize("name", ["signed_mamba", "unsigned_mamba"])
def test_gpu_backends_equal_reference_loop(name, backend):
    """The training shape of the state-tracking preset (d 64, state 16, length 256) on the GPU, float32,
    against the float64 loop on the same GPU (``atol`` 2e-6 of each tensor's scale: the float32 reference loop
    itself is off by up to 7e-7 of it on the CPU)."""
    mixer = _mixer(name, 64, 16, seed=11).cuda()
    u = torch.randn(8, 256, 64, generator=torch.Generator().manual_seed(11)).cuda()
    _assert_backend_matches_reference(mixer, backend, u, rtol=2e-4, atol=2e-6)


def test_unsigned_mamba_is_the_mamba_mixer():
    """With transitions in [0, 1] the module computes exactly Mamba's S6 (same parameters, same output)."""
    torch.manual_seed(0)
    mamba, unsigned = build_mixer("mamba", 12, d_state=5), build_mixer("unsigned_mamba", 12, d_state=5)
    unsigned.load_state_dict(mamba.state_dict())
    u = torch.randn(3, 17, 12)
    torch.testing.assert_close(unsigned(u), mamba(u), rtol=0, atol=0)
    signed = build_mixer("signed_mamba", 12, d_state=5)
    signed.load_state_dict(mamba.state_dict())
    assert not torch.allclose(signed(u), mamba(u))


@pytest.mark.parametrize("eig_min", [-1.0, -0.5, 0.0])
def test_transitions_span_the_range(monkeypatch, eig_min):
    """The scan's coefficients ``eig_min + (1 - eig_min) exp(dt A)`` lie in [eig_min, 1]: a large step
    gives ``eig_min`` (negative only when eig_min < 0), a zero step gives 1."""
    import mixers.signed_mamba as module

    seen = []
    monkeypatch.setattr(module, "linear_scan", lambda c, x, **kw: seen.append(c) or torch.zeros_like(x))
    mixer = SignedMamba(4, d_state=2, eig_min=eig_min, backend="torch").double()
    with torch.no_grad():
        mixer.in_proj.weight.zero_()  # dt = softplus(dt_bias): one step size per channel
        mixer.dt_bias.copy_(torch.tensor([40.0, 40.0, -40.0, -40.0], dtype=torch.float64))
    mixer(torch.randn(1, 5, 4, dtype=torch.float64))
    c = seen[0].reshape(1, 5, 4, 2)
    torch.testing.assert_close(c[:, :, :2], torch.full_like(c[:, :, :2], eig_min), rtol=0, atol=1e-12)
    torch.testing.assert_close(c[:, :, 2:], torch.ones_like(c[:, :, 2:]), rtol=0, atol=1e-12)


def test_registered_backends_and_bad_configs():
    assert {"signed_mamba", "unsigned_mamba"} <= set(MIXERS)
    assert SignedMamba.BACKENDS == Mamba.BACKENDS  # the same names as the mamba mixer
    assert build_mixer("signed_mamba", 8).eig_min == -1.0 and build_mixer("unsigned_mamba", 8).eig_min == 0.0
    assert build_mixer("signed_mamba", 8, num_heads=4, eig_min=-0.5).eig_min == -0.5
    with pytest.raises(ValueError, match=r"eig_min must be in \[-1, 0\], got 0.5"):
        build_mixer("signed_mamba", 8, eig_min=0.5)
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        build_mixer("signed_mamba", 8, backend="cuda")
    with pytest.raises(ValueError, match="d_state"):
        build_mixer("signed_mamba", 8, d_state=0)
    with pytest.raises(TypeError):
        build_mixer("unsigned_mamba", 8, bogus=1)


@pytest.mark.slow
def test_negative_eigenvalues_solve_parity_where_positive_do_not():
    """Running parity, trained on lengths 3..12 and tested at 24: [-1, 1] solves it within 400 steps
    (about 1 s on a CPU core; 4 of 4 seeds); [0, 1] stays below 70% on the same budget."""
    from experiments.trial.train import TrainConfig, TrialSpec, quiet_lightning, run_trial

    quiet_lightning()

    def accuracy_at_24(mixer: str, steps: int) -> float:
        spec = TrialSpec(
            task="parity",
            model=ModelShape(mixer=mixer, mixer_options={"d_state": 4}),
            lr=3e-3,
            seed=0,
            task_options={"running": True},
            extrapolation={"min_len": 3, "max_len": 12, "eval_lengths": [24]},
            train=TrainConfig(
                max_steps=steps, batch_size=32, train_size=2000, val_size=200, test_size=300, eval_every=50
            ),
        )
        return run_trial(spec)["len24/acc"]

    assert accuracy_at_24("signed_mamba", 400) >= 0.98
    assert accuracy_at_24("unsigned_mamba", 300) < 0.7
