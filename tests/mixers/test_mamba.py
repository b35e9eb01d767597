"""The mamba2 and mamba mixers: every backend computes the same function, causally; bad configs fail."""

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
    grads = torch.autograd.grad((y * w).sum(), [u, *mixer.parameters()])
    return y.detach(), grads


MAMBA2_SMALL = {"num_heads": 2, "chunk_size": 4}


@pytest.mark.parametrize(
    "name,backends,opts",
    [
        ("mamba2", ["torch"], MAMBA2_SMALL),
        ("mamba2", ["torch"], {**MAMBA2_SMALL, "conv_kernel": 3, "norm": True}),
        ("mamba", ["torch"], {}),
    ],
)
def test_backends_agree_float64(name, backends, opts):
    torch.manual_seed(1)
    mixer = build_mixer(name, 16, d_state=8, **opts).double()
    u = torch.randn(2, 11, 16, dtype=torch.float64)
    y_ref, g_ref = _run(mixer, "reference", u)
    for backend in backends:
        y, g = _run(mixer, backend, u)
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(), reason="needs Triton")
def test_mamba2_triton_matches_reference():
    torch.manual_seed(3)
    mixer = build_mixer("mamba2", 16, num_heads=2, d_state=16, chunk_size=16).to(TRITON_DEVICE)
    u = torch.randn(1, 19, 16).to(TRITON_DEVICE)
    y_ref, g_ref = _run(mixer, "reference", u)
    y, g = _run(mixer, "triton", u)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_parameter_counts():
    """The Mamba2 layer's pieces at d = 64, 4 heads, N = 64: in_proj x/B/C/dt (no bias), A_log, dt_bias,
    D per head; the conv (weight + bias per channel) over x, B, C, or B, C alone without x_proj; the norm."""

    def count(**opts):
        return sum(p.numel() for p in build_mixer("mamba2", 64, **opts).parameters())

    heads = 3 * 4
    assert count() == 64 * (64 + 64 + 64 + 4) + heads
    assert count(x_proj=False) == 64 * (64 + 64 + 4) + heads
    assert count(conv_kernel=4) == count() + (64 + 64 + 64) * (4 + 1)
    assert count(x_proj=False, conv_kernel=4) == count(x_proj=False) + (64 + 64) * (4 + 1)
    assert count(conv_kernel=4, norm=True) == count(conv_kernel=4) + 64


def test_conv_is_mamba2s_depthwise_causal_conv_on_x_b_c():
    """With identity conv taps (last tap 1, bias 0) the conv is SiLU on x, B, C; shifting the tap
    one step back delays them by one position (checked against a mixer fed the delayed projection)."""
    torch.manual_seed(4)
    plain = build_mixer("mamba2", 8, num_heads=2, d_state=4, chunk_size=4, backend="reference").double()
    conv = build_mixer("mamba2", 8, num_heads=2, d_state=4, chunk_size=4, backend="reference", conv_kernel=3).double()
    conv.load_state_dict(plain.state_dict(), strict=False)
    u = torch.randn(2, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        conv.conv.weight.zero_()
        conv.conv.bias.zero_()
        conv.conv.weight[:, 0, -1] = 1.0  # the current position only
        proj = plain.in_proj(u)
        pre, proj_dt = proj[..., : sum(plain.split[:3])], proj[..., sum(plain.split[:3]) :]
        silu = torch.nn.functional.silu
        torch.testing.assert_close(conv(u), _ssd_of(plain, silu(pre), proj_dt))
        conv.conv.weight[:, 0, -1], conv.conv.weight[:, 0, -2] = 0.0, 1.0  # the previous position
        delayed = torch.cat([torch.zeros_like(pre[:, :1]), pre[:, :-1]], dim=1)  # zero padding before the start
        torch.testing.assert_close(conv(u), _ssd_of(plain, silu(delayed), proj_dt))


def _ssd_of(mixer, xbc, proj_dt):
    """Mamba2's output for given (post-conv) x, B, C and dt projection, through the reference SSD."""
    from seqkernels.ssd import ssd

    batch, length, _ = xbc.shape
    x, B, C = torch.split(xbc, mixer.split[:3], dim=-1)
    y = ssd(
        x.reshape(batch, length, mixer.num_heads, -1),
        torch.nn.functional.softplus(proj_dt + mixer.dt_bias),
        -torch.exp(mixer.A_log),
        B.reshape(batch, length, mixer.ngroups, -1),
        C.reshape(batch, length, mixer.ngroups, -1),
        D=mixer.D,
        chunk_size=mixer.chunk_size,
        backend="reference",
    )
    return y.reshape(batch, length, -1)


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
    with pytest.raises(ValueError, match="conv_kernel must be an int >= 0"):
        build_mixer("mamba2", 64, conv_kernel=-1)
    with pytest.raises(TypeError):
        build_mixer("mamba2", 64, bogus=1)
    with pytest.raises(ValueError, match="unknown backend"):
        build_mixer("mamba", 64, backend="fast")
    with pytest.raises(TypeError):
        build_mixer("mamba", 64, bogus=1)
