"""Every registered mixer is causal at the mixer level, in every backend it declares and in the option
variants that change its computation: changing the inputs from position 5 on leaves outputs 0..4
unchanged (to float32 rounding) and changes some later output.

The cases are generated from the registry (``mixers.MIXERS``, each mixer's ``BACKENDS``): a mixer
registered later is checked without editing this file. ``CUDA_ONLY`` lists the backends that cannot
run on a CPU; backends whose Triton kernels run in the interpreter on a CPU take seconds each and are
marked ``slow``. The model-level check over every registered mixer in both blocks is
``tests/experiments/test_model.py::test_every_mixer_is_causal_in_both_blocks``.
"""

import pytest
import torch

from mixers import MIXERS, build_mixer

CUDA_ONLY = {
    "fla": "fla's Triton kernels need CUDA tensors",
    "fla_recurrent": "fla's Triton kernels need CUDA tensors",
}
INTERPRETED = {"triton", "parallel-triton", "fused", "alternating"}  # Triton kernels: the interpreter on a CPU
SMALL = {"num_heads": 2}


def backend_cases():
    """``(name, options, marks)`` for every registered mixer at its defaults and in each backend it declares."""
    cases = []
    for name in sorted(MIXERS):
        backends = getattr(type(build_mixer(name, 8, **SMALL)), "BACKENDS", None)
        if backends is None:  # a mixer with one implementation
            cases.append((name, SMALL, []))
        for backend in backends or ():
            marks = []
            if backend in CUDA_ONLY:
                marks = [pytest.mark.skip(reason=CUDA_ONLY[backend])]
            elif backend in INTERPRETED and not torch.cuda.is_available():
                marks = [pytest.mark.slow]
            cases.append((name, {**SMALL, "backend": backend}, marks))
    return cases


MAMBA2_SMALL = {"num_heads": 2, "chunk_size": 4, "d_state": 4}
VARIANTS = [  # options other than the backend that change the computation
    ("mamba", {"d_state": 4}),
    ("mamba2", {**MAMBA2_SMALL, "conv_kernel": 4}),
    ("mamba2", {**MAMBA2_SMALL, "conv_kernel": 4, "x_proj": False}),
    ("mlstm_exp", {"num_heads": 2, "igate_bias": 0.0}),
    ("mlstm_sig", {"num_heads": 2, "igate_bias": 0.0}),
    ("signed_deltanet", {"num_heads": 2, "short_conv": True}),
    ("signed_deltanet", {"num_heads": 1, "qk_norm": "sum", "output_gate": True}),
    ("deltaproduct", {"num_heads": 2, "householders": 3, "forget_gate": True, "short_conv": True}),
    ("gated_deltanet", {"num_heads": 2, "signed": True, "short_conv": True}),
    ("mamba3", {"num_heads": 2, "d_state": 4, "rope_fraction": 1.0}),
]
CASES = [pytest.param(n, o, marks=m) for n, o, m in backend_cases()] + [pytest.param(n, o) for n, o in VARIANTS]


def case_id(case):
    name, options = case.values
    return f"{name}-{'-'.join(f'{k}={v}' for k, v in options.items())}"


def test_the_skip_list_names_backends_that_exist():
    declared = {b for name in MIXERS for b in getattr(type(build_mixer(name, 8, **SMALL)), "BACKENDS", ())}
    assert set(CUDA_ONLY) | INTERPRETED <= declared


@pytest.mark.parametrize("name,options", CASES, ids=[case_id(c) for c in CASES])
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
