"""Mixed stacks, ``--mixers "mlstm_exp+slstm"``: layer ``i`` takes part ``i % len(parts)``, the depth is a
multiple of the parts (one-line error otherwise), the parameter count is the layers' own, a preset gives a
stack its own depths (``mixer_layers``), and a sweep names the stack as given in its rows."""

import pandas as pd
import pytest
import torch

from experiments import sweep
from experiments.sweeps.presets import build_specs, resolve_sweep
from experiments.trial.model import ModelConfig, SequenceModel, count_parameters
from mixers import build_mixer
from mixers.build import split_stack
from mixers.mlstm import MLSTMMixer


def test_split_stack():
    assert split_stack("gru") == ["gru"]
    assert split_stack("mlstm_exp+slstm") == ["mlstm_exp", "slstm"]
    assert split_stack("deltaproduct[householders=2]+slstm[num_heads=1]+gru") == [
        "deltaproduct[householders=2]",
        "slstm[num_heads=1]",
        "gru",
    ]
    with pytest.raises(ValueError, match="expected MIXER\\+MIXER"):
        split_stack("gru+")
    with pytest.raises(ValueError, match="is a stack of 2 mixers, one per layer"):
        build_mixer("mlstm_exp+slstm", 8)


def test_layers_cycle_through_the_parts_and_count_their_own_parameters():
    d, config = 16, dict(vocab_size=7, num_classes=3, d_model=16, mixer_options={"num_heads": 2})
    model = SequenceModel(ModelConfig(**config, mixer="mlstm_exp+slstm", layers=4))
    kinds = [type(model.block), *(type(layer.block) for layer in model.deeper)]
    slstm_type = type(build_mixer("slstm", d, num_heads=2))
    assert kinds == [MLSTMMixer, slstm_type, MLSTMMixer, slstm_type]
    per_layer = [count_parameters(model.block), *(count_parameters(layer.block) for layer in model.deeper)]
    alone = {n: count_parameters(build_mixer(n, d, num_heads=2)) for n in ("mlstm_exp", "slstm")}
    assert per_layer == [alone["mlstm_exp"], alone["slstm"]] * 2
    outside = 7 * d + d + d + d * 3  # embedding, norm_in, norm_out, head
    assert count_parameters(model) == outside + sum(per_layer) + 3 * d  # + each deeper layer's RMSNorm
    tokens = torch.randint(0, 7, (2, 9))
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 7
    out, out2 = model(tokens), model(changed)
    torch.testing.assert_close(out[:, :5], out2[:, :5])
    with pytest.raises(
        ValueError, match="layers must be a multiple of the 2 mixers of stack 'mlstm_exp\\+slstm', got 3"
    ):
        ModelConfig(**config, mixer="mlstm_exp+slstm", layers=3)


def test_a_preset_gives_a_stack_its_own_depths():
    plan = resolve_sweep(
        "parity",
        "smoke",
        {"mixers": ["gru", "mlstm_exp+slstm"], "layers": [1], "mixer_layers": {"mlstm_exp+slstm": [2, 4]}},
    )
    assert [(s.model.mixer, s.model.layers) for s in build_specs(plan)] == [
        ("gru", 1),
        ("mlstm_exp+slstm", 2),
        ("mlstm_exp+slstm", 4),
    ]
    with pytest.raises(ValueError, match="mixer_layers maps a mixer to its depths"):
        resolve_sweep("parity", "smoke", {"mixer_layers": {"gru": 2}})
    st = resolve_sweep("s3", "state-tracking")
    assert {s.model.layers for s in build_specs(st) if s.model.mixer == "mlstm_exp+slstm"} == {2}
    assert {"pd_ssm", "complex_diag", "mamba3"} <= set(st.mixers)


def test_the_sweep_names_a_stack_as_given(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["parity", "--preset", "smoke", "--mixers", "mlstm_exp+slstm", "--layers", "2", "--max-steps", "2"]
    assert (
        sweep.main([*argv, "--train-option", "eval_every=2", *_small_data(), "--out", str(out), "--no-progress"]) == 0
    )
    row = pd.read_csv(out / "results.csv").iloc[0]
    assert (row["mixer"], row["layers"], row["status"]) == ("mlstm_exp+slstm", 2, "ok")
    plan = resolve_sweep("parity", "smoke", {"mixers": ["mlstm_exp+slstm"], "layers": [2]})
    model = SequenceModel(
        ModelConfig(3, 2, mixer="mlstm_exp+slstm", layers=2, block=plan.model.block, positional=plan.model.positional)
    )
    assert row["n_params"] == count_parameters(model)
    assert "| mlstm_exp+slstm " in (out / "table.md").read_text()
    bad = ["parity", "--preset", "smoke", "--mixers", "mlstm_exp+slstm", "--layers", "3", "--out", str(tmp_path / "b")]
    assert sweep.main(bad) != 0
    assert "layers must be a multiple of the 2 mixers" in capsys.readouterr().err


def _small_data() -> list[str]:
    return [arg for size in ("train_size=64", "val_size=32", "test_size=32") for arg in ("--train-option", size)]
