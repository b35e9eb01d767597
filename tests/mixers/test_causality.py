"""Every mixer, in its option variants, is causal at the mixer level: changing the inputs from position
5 on leaves outputs 0..4 unchanged (to float32 rounding) and changes some later output.

The model-level version over every registered mixer at its defaults is
``tests/experiments/test_model.py::test_every_mixer_is_causal_in_both_blocks``; this one covers the
options that change the computation (convolutions, projections, backends, signed transitions).
"""

import pytest
import torch

from mixers import build_mixer

MAMBA2_SMALL = {"num_heads": 2, "chunk_size": 4, "d_state": 4}
CASES = [
    ("mamba", {"d_state": 4}),
    ("mamba2", MAMBA2_SMALL),
    ("mamba2", {**MAMBA2_SMALL, "conv_kernel": 4}),
    ("mamba2", {**MAMBA2_SMALL, "conv_kernel": 4, "x_proj": False}),
    ("mlstm_exp", {"num_heads": 2, "igate_bias": 0.0}),
    ("mlstm_sig", {"num_heads": 2, "igate_bias": 0.0}),
    ("signed_mamba", {"d_state": 4}),
    ("unsigned_mamba", {"d_state": 4}),
    *[(cell, {"num_heads": 2, "backend": "reference"}) for cell in ("lstm", "gru", "elman", "slstm")],
    ("flashgru", {"num_heads": 2}),
    ("flashlstm", {"num_heads": 2}),
    ("transformer", {"num_heads": 2}),
    ("deltanet", {"num_heads": 2}),
    ("signed_deltanet", {"num_heads": 2, "short_conv": True}),
    ("signed_deltanet", {"num_heads": 1, "qk_norm": "sum", "output_gate": True}),
    ("deltaproduct", {"num_heads": 2}),
    ("deltaproduct", {"num_heads": 2, "householders": 3, "forget_gate": True, "short_conv": True}),
    ("gated_deltanet", {"num_heads": 2}),
    ("gated_deltanet", {"num_heads": 2, "signed": True, "short_conv": True}),
    ("rwkv7", {"num_heads": 2}),
    *[(name, {"d_state": 4, "backend": b}) for name in ("pd_ssm", "complex_diag") for b in ("reference", "torch")],
    *[("mamba3", {"num_heads": 2, "d_state": 4, "backend": b}) for b in ("reference", "torch", "ssd")],
    ("mamba3", {"num_heads": 2, "d_state": 4, "rope_fraction": 1.0}),
]


@pytest.mark.parametrize(
    "name,options", CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in CASES]
)
def test_causal(name, options):
    torch.manual_seed(2)
    mixer = build_mixer(name, 8, **options)
    u = torch.randn(2, 9, 8)
    u2 = u.clone()
    u2[:, 5:] = torch.randn(2, 4, 8)
    with torch.no_grad():
        y, y2 = mixer(u), mixer(u2)
    torch.testing.assert_close(y[:, :5], y2[:, :5])
    assert not torch.allclose(y[:, 5:], y2[:, 5:]), "the changed inputs had no effect"
