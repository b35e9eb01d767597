"""The mamba2 and mamba mixers: every backend computes the same function, causally; bad configs fail."""

import os


import pytest
import torch

from mixers import MIXERS, build_mixer


def _run(mixer, backend, u):
    mixer.backend = backend
    u = u.clone().requires_grad_(True)
    y = mixer(u)
    grads = torch.autograd.grad((y * torch.randn_like(y, generator=torch.Generator().manual_seed(7))).sum(), [u, *mixer.parameters()])
    return y.detach(), grads


@pytest.mark.parametrize("name,backends", [("mamba2", ["chunked"]), ("mamba", ["torch"])])
def test_backends_agree_float64(name, backends):
    torch.manual_seed(1)
    mixer = build_mixer(name, 16, d_state=8, **({"num_heads": 2, "chunk_size": 4} if name == "mamba2" else {})).double()
    u = torch.randn(2, 11, 16, dtype=torch.float64)
    y_ref, g_ref = _run(mixer, "reference", u)
    for backend in backends:
        y, g = _run(mixer, backend, u)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["mamba2", "mamba"])
def test_causal(name):
    torch.manual_seed(2)
    mixer = build_mixer(name, 8, d_state=4, **({"num_heads": 2, "chunk_size": 4} if name == "mamba2" else {}))
    u = torch.randn(1, 9, 8)
    u2 = u.clone()
    u2[:, 5:] = torch.randn(1, 4, 8)
    y, y2 = mixer(u), mixer(u2)
    torch.testing.assert_close(y[:, :5], y2[:, :5])
    assert not torch.allclose(y[:, 5:], y2[:, 5:])


@pytest.mark.skipif(not os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available(), reason="needs Triton")
def test_mamba2_triton_matches_reference():
    torch.manual_seed(3)
    mixer = build_mixer("mamba2", 16, num_heads=2, d_state=16, chunk_size=16)
    u = torch.randn(1, 19, 16)
    y_ref, g_ref = _run(mixer, "reference", u)
    y, g = _run(mixer, "triton", u)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_parameter_counts():
    """Paper 000 Table 6: Mamba2 14.1k on Parity (mixer-only, V=2) and 38.4k on MQAR (full block)."""
    mixer_only = sum(p.numel() for p in build_mixer("mamba2", 64).parameters())
    in_block = sum(p.numel() for p in build_mixer("mamba2", 64, x_proj=False).parameters())
    assert mixer_only == 64 * (64 + 64 + 64 + 4) + 3 * 4
    assert in_block == 64 * (64 + 64 + 4) + 3 * 4
    parity_wrapper, mqar_wrapper, full_block = 386, 16_640, 12_736
    assert abs(mixer_only + parity_wrapper - 14_100) / 14_100 < 0.1
    assert abs(in_block + mqar_wrapper + full_block - 38_400) / 38_400 < 0.02


def test_registered_and_bad_configs():
    assert {"mamba2", "mamba"} <= set(MIXERS)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        build_mixer("mamba2", 64, num_heads=5)
    with pytest.raises(ValueError, match="divisible by ngroups"):
        build_mixer("mamba2", 64, num_heads=4, ngroups=3)
    with pytest.raises(ValueError, match="unknown backend"):
        build_mixer("mamba2", 64, backend="cuda")
    with pytest.raises(ValueError, match="chunk_size"):
        build_mixer("mamba2", 64, chunk_size=0)
    with pytest.raises(TypeError):
        build_mixer("mamba2", 64, bogus=1)
    with pytest.raises(ValueError, match="unknown backend"):
        build_mixer("mamba", 64, backend="chunked")
    with pytest.raises(TypeError):
        build_mixer("mamba", 64, bogus=1)
