"""``analysis.transitions``: eigenvalues of known transitions, the drift, and the CLI on a trial folder."""

import json
import math

import pandas as pd
import pytest
import torch

from analysis.cli import run
from analysis.transitions import add_drift, eigen_table, layer_transitions
from analysis.transitions import main as transitions_main
from experiments.trial.shape import ModelShape


def rotation(D, angle_deg, modulus, Q):
    """``Q diag(R(angle) * modulus, 1, ..., 1) Q^T``: a rotation in one plane of a random basis."""
    R = torch.eye(D, dtype=torch.float64)
    a = math.radians(angle_deg)
    R[:2, :2] = modulus * torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
    return Q @ R @ Q.T


def test_eigen_table_reads_known_rotations():
    """Token 1 rotates by 142/143/144 degrees (modulus 0.97) in head 0 and reflects + contracts in head 1;
    token 0 is the identity (no row); eigenvalues below the modulus floor are left out."""
    gen = torch.Generator().manual_seed(3)
    D, B, L = 6, 3, 7
    Q, _ = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64, generator=gen))
    tokens = torch.randint(0, 2, (B, L), generator=gen)
    tokens[0, :3] = torch.tensor([1, 1, 1])
    A = torch.eye(D, dtype=torch.float64).repeat(B, L, 2, 1, 1)
    angles = [142.0, 143.0, 144.0]
    reflect = torch.eye(D, dtype=torch.float64)
    reflect[0, 0], reflect[1, 1], reflect[2, 2] = -0.9, 0.6, 0.2  # 0.2: below the floor
    for b in range(B):
        for t in range(L):
            if tokens[b, t] == 1:
                A[b, t, 0] = rotation(D, angles[(b + t) % 3], 0.97, Q)
                A[b, t, 1] = Q @ reflect @ Q.T
    df = eigen_table(A, tokens, min_modulus=0.5)
    ones = int((tokens == 1).sum())
    rot = df[(df["head"] == 0) & (df.token == 1)]
    assert len(rot) == 1 and rot.angle_deg.iloc[0] == pytest.approx(143.0, abs=1e-6)
    assert rot.modulus.iloc[0] == pytest.approx(0.97, abs=1e-9) and rot.angle_spread_deg.iloc[0] == pytest.approx(2.0)
    assert rot.positions.iloc[0] == rot.of_positions.iloc[0] == ones
    ref = df[(df["head"] == 1) & (df.token == 1)].sort_values("rank")
    assert ref.angle_deg.tolist() == pytest.approx([180.0, 0.0]) and ref.modulus.tolist() == pytest.approx([0.9, 0.6])
    assert df[df.token == 0].empty  # the identity has no eigenvalue away from 1


def test_drift_to_the_nearest_class():
    df = add_drift(pd.DataFrame({"angle_deg": [143.44, 72.0, 36.5, 180.0]}), 5)
    assert df.drift.tolist() == pytest.approx([-0.56, 0.0, -35.5, 36.0])
    assert df.tokens_to_half_class.iloc[0] == pytest.approx(36 / 0.56)
    assert pd.isna(df.tokens_to_half_class.iloc[1])


@pytest.fixture(scope="module")
def trial_dir(tmp_path_factory):
    """A fake finished trial: a 2-layer DeltaProduct model on count mod 5 (random weights)."""
    import lightning as L

    from experiments.trial.train import TrialSpec, build_datamodule, build_module

    spec = TrialSpec(
        task="modular_count",
        model=ModelShape(mixer="deltaproduct", layers=2),
        lr=1e-3,
        seed=0,
        task_options={"m": 5, "seq_len": 12},
    )
    torch.manual_seed(0)
    module = build_module(spec, build_datamodule(spec))
    d = tmp_path_factory.mktemp("trial")
    (d / "checkpoints").mkdir()
    (d / "spec.json").write_text(json.dumps(spec.to_dict()))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(d / "checkpoints" / "best.ckpt", weights_only=True)
    return d


def test_cli_on_a_trial_folder(trial_dir, tmp_path):
    """Both layers' rows; the first layer's equal the table of its mixer's transitions on what it sees."""
    from analysis.newton import load_trial, task_tokens
    from experiments.trial.model import mixer_input

    df = transitions_main([str(trial_dir), "--length", "9", "--batch", "5", "--modulus", "5", "--out", str(tmp_path)])
    assert set(df.layer) == {1, 2} and {"drift", "tokens_to_half_class"} <= set(df.columns)
    assert pd.read_csv(tmp_path / "transitions.csv").shape == df.shape
    spec, model = load_trial(trial_dir)
    tokens = task_tokens(spec.task, spec.task_options, 9, 5, 0)
    model = model.double()
    mixer = model.mixer
    want = eigen_table(mixer.transitions(mixer_input(model, tokens)), tokens)
    got = df[df.layer == 1].drop(columns=["layer", "drift", "tokens_to_half_class"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)
    assert len(layer_transitions(model, tokens)) == 2


def test_bad_input_one_line(tmp_path, capsys):
    assert run(transitions_main, [str(tmp_path)]) == 2
    assert "not a finished trial folder" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no mixer with state transitions"):
        layer_transitions(torch.nn.Linear(2, 2), torch.zeros(1, 2))
