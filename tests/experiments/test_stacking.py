"""Trial stacking (``mixers.stacking``): S models as one wide model compute what each computes alone."""

import pytest
import torch

from experiments.trial.model import ModelConfig, SequenceModel
from mixers.stacking import stack_trials, trial_state_dict, trials_of

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

# the Table 6 mix as the presets build it, plus the variants stacking treats differently
CONFIGS = {
    "transformer-learned": dict(
        mixer="transformer",
        block="mixer",
        mixer_options={"positions": "learned", "max_len": 40, "mlp_ratio": 1, "bias": True},
    ),
    "transformer-rope": dict(mixer="transformer", block="full", mixer_options={"positions": "rope"}),
    "transformer-sinusoidal": dict(mixer="transformer", mixer_options={"positions": "sinusoidal"}),
    "mamba2-parity": dict(
        mixer="mamba2", block="mixer", mixer_options={"conv_kernel": 4, "norm": True, "backend": "torch"}
    ),
    "mamba2-mqar": dict(
        mixer="mamba2", block="full", mixer_options={"x_proj": False, "conv_kernel": 4, "backend": "torch"}
    ),
    "mamba2-groups": dict(mixer="mamba2", block="full", mixer_options={"ngroups": 2, "d_state": 8, "backend": "torch"}),
    "flashgru": dict(mixer="flashgru", block="full", mixer_options={"divergence_tol": 1e-2}),
    "flashgru-mlp": dict(
        mixer="flashgru", block="full", layers=2, mlp_ratio=1.5, mixer_options={"divergence_tol": 1e-2}
    ),
    "flashgru-no-conv": dict(
        mixer="flashgru", block="full", conv_kernel=0, layers=2, mixer_options={"divergence_tol": 1e-2}
    ),
    "flashlstm-sinusoidal": dict(
        mixer="flashlstm",
        block="mixer",
        positional="sinusoidal",
        mixer_options={"clip_norm": None, "divergence_tol": 1e-2},
    ),
    "flashgru-out-proj": dict(mixer="flashgru", block="mixer", mixer_options={"d_state": 16, "divergence_tol": 1e-2}),
}
GPU_CONFIGS = {
    "mamba2-triton": dict(
        mixer="mamba2", block="full", mixer_options={"x_proj": False, "conv_kernel": 4, "backend": "triton"}
    ),
    "flashgru-fused": dict(mixer="flashgru", block="full", mixer_options={"mode": "fused", "divergence_tol": 1e-2}),
    "flashlstm-fused": dict(mixer="flashlstm", block="full", mixer_options={"mode": "fused", "divergence_tol": 1e-2}),
}
VOCAB, CLASSES, S = 13, 7, 3


def _models(config: dict, seeds=(0, 1, 2), device=DEVICE, dtype=torch.float64) -> list[SequenceModel]:
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(SequenceModel(ModelConfig(VOCAB, CLASSES, d_model=32, **config)).to(device, dtype))
    return models


def _check_stack_computes_each_trial(config: dict, device: str, dtype=torch.float64, tol=1e-9) -> None:
    """Logits of the stack equal each model's on its own tokens, and one SGD step (lr 1) on the sum of
    the trials' losses moves each trial's weights as that trial's own step does: the gradients match
    and do not leak between trials. Awkward sizes (B 3, L 37), tokens differ per trial."""
    models = _models(config, device=device, dtype=dtype)
    stacked = stack_trials(models)
    assert trials_of(stacked) == S
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (S, 3, 37), generator=gen).to(device)
    targets = torch.randint(0, CLASSES, (S, 3, 37), generator=gen).to(device)
    logits = stacked(tokens)
    assert logits.shape == (S, 3, 37, CLASSES)
    loss = sum(torch.nn.functional.cross_entropy(logits[s].flatten(0, 1), targets[s].flatten()) for s in range(S))
    loss.backward()
    with torch.no_grad():
        for p in stacked.parameters():
            p -= p.grad
    for s, model in enumerate(models):
        alone = model(tokens[s])
        torch.testing.assert_close(logits[s], alone, rtol=tol, atol=tol)
        torch.nn.functional.cross_entropy(alone.flatten(0, 1), targets[s].flatten()).backward()
        stepped = trial_state_dict(stacked, s)
        with torch.no_grad():
            for name, p in model.named_parameters():
                assert p.grad is not None and p.grad.abs().amax() > 0, name
                torch.testing.assert_close(stepped[name], p - p.grad, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stack_computes_each_trial(name):
    """Float64 on the CPU: the stack equals each trial to rounding."""
    _check_stack_computes_each_trial(CONFIGS[name], "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_CONFIGS))
def test_stack_computes_each_trial_with_triton_kernels(name):
    if not CUDA:
        pytest.skip("needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = False
    _check_stack_computes_each_trial(GPU_CONFIGS[name], "cuda", torch.float32, tol=2e-4)  # the kernels: float32


@pytest.mark.parametrize("name", ["transformer-learned", "mamba2-mqar", "flashlstm-sinusoidal", "flashgru-mlp"])
def test_trial_state_dict_round_trip(name):
    """Each trial's weights come back exactly, under the ordinary model's names, and load into it."""
    models = _models(CONFIGS[name], device="cpu")
    stacked = stack_trials(models)
    for s, model in enumerate(models):
        state = trial_state_dict(stacked, s)
        assert state.keys() == model.state_dict().keys()
        for k, v in model.state_dict().items():
            assert torch.equal(state[k], v), k
        fresh = SequenceModel(model.config).double()
        fresh.load_state_dict(state)
    assert trials_of(models[0]) == 1


def test_what_cannot_be_stacked():
    """A mixer that does not declare stacking, models of different architectures, a wrong token shape:
    one-line ValueErrors."""
    with pytest.raises(ValueError, match="GRUMixer|cannot be stacked"):
        stack_trials(_models(dict(mixer="gru"), seeds=(0, 1), device="cpu"))
    a = _models(CONFIGS["flashgru"], seeds=(0,), device="cpu")
    b = _models(CONFIGS["flashgru-out-proj"], seeds=(0,), device="cpu")
    with pytest.raises(ValueError, match="different"):
        stack_trials(a + b)
    stacked = stack_trials(_models(CONFIGS["flashgru"], device="cpu"))
    with pytest.raises(ValueError, match=r"takes tokens \(S=3, B, L\)"):
        stacked(torch.zeros(2, 5, dtype=torch.long))
