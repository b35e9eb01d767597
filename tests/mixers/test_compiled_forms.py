"""The forms the mixers take under ``torch.compile`` (``mixers.conv.causal_depthwise_conv``,
``mixers.attention.causal_attention``) against independent references: a float64 loop over the
convolution's definition and a per-query softmax loop, values and gradients, at awkward sizes.
``aot_eager`` on the CPU (no C++ toolchain needed), Inductor on a GPU."""

import pytest
import torch
from torch import nn

from mixers.attention import causal_attention
from mixers.conv import causal_depthwise_conv

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = "inductor" if DEV == "cuda" else "aot_eager"


def conv_loop(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y[b, t, c] = bias[c] + sum_k w[c, k] x[b, t - (K - 1) + k, c], one output at a time."""
    B, L, C = x.shape
    K = weight.shape[-1]
    y = torch.zeros(B, L, C, dtype=torch.float64)
    for t in range(L):
        for k in range(K):
            s = t - (K - 1) + k
            if s >= 0:
                y[:, t] += weight[:, 0, k].double() * x[:, s].double()
    return y if bias is None else y + bias.double()


def attention_loop(q, k, v):
    """Each query's softmax over the keys at or before it, in float64."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    scale = q.shape[-1] ** -0.5
    for t in range(q.shape[-2]):
        w = (q[..., t : t + 1, :].double() @ k[..., : t + 1, :].double().transpose(-1, -2) * scale).softmax(-1)
        out[..., t, :] = (w @ v[..., : t + 1, :].double())[..., 0, :]
    return out


@pytest.mark.parametrize(
    "length,channels,kernel,bias", [(1, 3, 4, True), (13, 7, 4, True), (37, 5, 3, False), (2, 6, 5, True)]
)
def test_causal_conv_compiled_and_eager_match_the_definition(length, channels, kernel, bias):
    torch.manual_seed(length * 31 + kernel)
    conv = nn.Conv1d(channels, channels, kernel, groups=channels, padding=kernel - 1, bias=bias).to(DEV)
    x = torch.randn(3, length, channels, device=DEV)
    ref = conv_loop(x.cpu(), conv.weight.detach().cpu(), None if conv.bias is None else conv.bias.detach().cpu())
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: causal_depthwise_conv(conv, t), backend=BACKEND, fullgraph=True)
    for fn in (lambda t: causal_depthwise_conv(conv, t), compiled):
        xi = x.clone().requires_grad_()
        y = fn(xi)
        assert y.shape == (3, length, channels)
        torch.testing.assert_close(y.double().cpu(), ref, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(y)
        gx, gw = torch.autograd.grad(y, (xi, conv.weight), g)
        # gradients of the float64 loop at the same point
        xr = x.cpu().double().requires_grad_()
        wr = conv.weight.detach().cpu().double().requires_grad_()
        yr = conv_loop(xr, wr, None if conv.bias is None else conv.bias.detach().cpu())
        rx, rw = torch.autograd.grad(yr, (xr, wr), g.cpu().double())
        torch.testing.assert_close(gx.double().cpu(), rx, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gw.double().cpu(), rw, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("length,head_dim", [(1, 8), (29, 8), (100, 16), (300, 4)])  # 300: SDPA under compile
def test_causal_attention_compiled_and_eager_match_the_loop(length, head_dim):
    torch.manual_seed(length + head_dim)
    q, k, v = (torch.randn(2, 3, length, head_dim, device=DEV) for _ in range(3))
    ref = attention_loop(q.cpu(), k.cpu(), v.cpu())
    torch._dynamo.reset()
    compiled = torch.compile(causal_attention, backend=BACKEND, fullgraph=True)
    grads = []
    for fn in (causal_attention, compiled):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        y = fn(*leaves)
        torch.testing.assert_close(y.double().cpu(), ref, rtol=1e-4, atol=1e-5)
        grads.append(torch.autograd.grad((y * y).sum(), leaves))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
