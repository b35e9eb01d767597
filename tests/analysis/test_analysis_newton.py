"""analysis.newton: residual curves for any cell (one defined here), fresh and from trained checkpoints."""

import json
import math

import pandas as pd
import pytest
import torch
from torch import nn

from analysis.cli import run
from analysis.newton import find_checkpoints, fresh_cell, main, mixer_input, residual_curves
from experiments.trial.shape import ModelShape
from mixers.cells import RNNCell


class TanhCell(RNNCell):
    """h_t = tanh(a * h_{t-1} + x_t W): a diagonal cell written only by its recurrence step."""

    jacobian = "diag"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.a = nn.Parameter(torch.full((d_state,), 0.5))
        self.W = nn.Parameter(torch.randn(d_in, d_state) / d_in**0.5)

    def recurrence_step(self, h, x):
        return torch.tanh(self.a * h + x @ self.W)


class LinearCell(RNNCell):
    """h_t = a * h_{t-1} + x_t W: linear, so Newton is exact after one iteration."""

    jacobian = "diag"

    def __init__(self, d_in, d_state):
        super().__init__()
        self.a = nn.Parameter(torch.full((d_state,), 0.9))
        self.W = nn.Parameter(torch.randn(d_in, d_state) / d_in**0.5)

    def recurrence_step(self, h, x):
        return self.a * h + x @ self.W


def test_residual_zero_is_the_initial_guess_error_by_hand():
    """r_0 = max |f(h^0_{t-1}, x_t) - h^0_t| with h^0_t = f(0, x_t); for the linear cell
    f(h^0_{t-1}, x_t) - h^0_t = a * (x_{t-1} W) exactly, and one Newton step solves the system."""
    torch.manual_seed(0)
    mixer = fresh_cell(f"{__name__}:LinearCell", d_model=8, num_heads=2, seed=1).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    df = residual_curves(mixer, lambda L: x[:, :L], [5], iters=2)
    want = 0.0
    for head, cell in enumerate(mixer.cells):
        xh = x[..., 4 * head : 4 * head + 4]
        want = max(want, float((cell.a * (xh[:, :-1] @ cell.W)).abs().max().detach()))
    assert df["residual"].iloc[0] == pytest.approx(want, rel=1e-12)
    assert df["residual"].iloc[1] < 1e-14 and df["residual"].iloc[2] < 1e-14


@pytest.mark.slow
def test_cli_on_a_cell_defined_in_this_file(tmp_path):
    df = main(["--cells", f"{__name__}:TanhCell,flashgru", "--max-log2", "7", "--iters", "5", "--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newton.csv", "newton.pdf", "newton.png"]
    assert set(df["cell"]) == {"TanhCell", "FlashGRU"} and set(df["L"]) == {64, 128}
    csv = pd.read_csv(tmp_path / "newton.csv")
    assert len(csv) == 2 * 2 * 6  # cells x lengths x (iters + 1)
    for cell in ("TanhCell", "FlashGRU"):
        r = csv[(csv["cell"] == cell) & (csv["L"] == 128)].sort_values("iteration")["residual"].to_numpy()
        assert r[0] > 1e-2 and r[-1] < 1e-12  # converges to float64 round-off within 5 iterations


def test_task_inputs_are_what_the_mixer_sees(tmp_path):
    df = main(
        [
            "--cells",
            f"{__name__}:TanhCell",
            "--inputs",
            "task:parity",
            "--min-log2",
            "4",
            "--max-log2",
            "4",
            "--iters",
            "3",
            "--out",
            str(tmp_path),
            "--name",
            "n",
        ]
    )
    assert df["source"].iloc[0] == "fresh, parity inputs" and len(df) == 4


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A fake sweep folder: two trials of the test cell (the better one by validation accuracy) and a GRU."""
    import lightning as L

    from experiments.trial.train import TrialSpec, build_datamodule, build_module

    root = tmp_path_factory.mktemp("sweep")
    rows = []
    for number, (mixer, acc) in enumerate([(f"{__name__}:TanhCell", 0.6), (f"{__name__}:TanhCell", 0.9), ("gru", 1.0)]):
        spec = TrialSpec(
            task="parity", model=ModelShape(mixer=mixer), lr=1e-3, seed=number, task_options={"seq_len": 12}
        )
        torch.manual_seed(number)
        module = build_module(spec, build_datamodule(spec))
        if number == 1:
            with torch.no_grad():
                for cell in module.model.mixer.cells:
                    cell.a.fill_(-0.25)  # marks the chosen checkpoint
        d = root / "trials" / f"parity-{mixer.replace(':', '.')}-s{number}-lr0.001-{number:010d}"
        (d / "checkpoints").mkdir(parents=True)
        (d / "spec.json").write_text(json.dumps(spec.to_dict()))
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.strategy.connect(module)
        trainer.save_checkpoint(d / "checkpoints" / "best.ckpt", weights_only=True)
        rows.append({"trial_dir": f"trials/{d.name}", "mixer": mixer, "best_val_acc": acc})
    pd.DataFrame(rows).to_csv(root / "results.csv", index=False)
    return root


def test_checkpoints_best_trial_per_mixer(sweep_dir):
    found = find_checkpoints(sweep_dir)
    assert found[f"{__name__}:TanhCell"].name.endswith("-s1-lr0.001-0000000001") and found["gru"].name.endswith(
        "-s2-lr0.001-0000000002"
    )
    with pytest.raises(ValueError, match="no checkpoint of flashlstm"):
        find_checkpoints(sweep_dir, ["flashlstm"])


@pytest.mark.slow
def test_cli_trained_panel_from_checkpoints(sweep_dir, tmp_path):
    df = main(
        [
            "--checkpoints",
            str(sweep_dir),
            "--cells",
            f"{__name__}:TanhCell",
            "--inputs",
            "task",
            "--max-log2",
            "6",
            "--iters",
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert set(df["cell"]) == {"TanhCell"}
    assert set(df["panel"]) == {"freshly initialized", "trained on parity"}
    trained = df[df["panel"] == "trained on parity"]
    assert "-s1-" in trained["source"].iloc[0] and df["source"].iloc[0] == "fresh, parity inputs"
    only = main(
        [
            "--checkpoints",
            str(sweep_dir),
            "--no-fresh",
            "--max-log2",
            "6",
            "--iters",
            "2",
            "--out",
            str(tmp_path),
            "--name",
            "only",
        ]
    )
    assert set(only["cell"]) == {"TanhCell"} and set(only["panel"]) == {"trained on parity"}  # the GRU: skipped
    # without --cells the fresh panels are of the checkpoints' cells, not flashgru/flashlstm: no half-empty rows
    both = main(
        [
            "--checkpoints",
            str(sweep_dir),
            "--inputs",
            "task",
            "--max-log2",
            "6",
            "--iters",
            "2",
            "--out",
            str(tmp_path),
            "--name",
            "both",
        ]
    )
    assert set(both["cell"]) == {"TanhCell"}
    assert set(both["panel"]) == {"freshly initialized", "trained on parity"}


def test_mixer_input_matches_the_model(sweep_dir):
    from analysis.newton import load_trial

    _spec, model = load_trial(find_checkpoints(sweep_dir)[f"{__name__}:TanhCell"])
    assert float(model.mixer.cells[0].a[0]) == -0.25  # the weights were loaded
    tokens = torch.randint(0, 2, (2, 9))
    x = mixer_input(model, tokens)
    torch.testing.assert_close(x, model.norm_in(model.embedding(tokens)))


def test_bad_input_one_line(tmp_path, capsys):
    assert run(main, ["--cells", "gru", "--max-log2", "6", "--out", str(tmp_path)]) == 2
    assert "not a recurrent cell" in capsys.readouterr().err
    assert run(main, ["--inputs", "task", "--out", str(tmp_path)]) == 2
    assert "--inputs task needs --checkpoints" in capsys.readouterr().err
    assert run(main, ["--inputs", "task:nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'nope'" in err and err.count("\n") == 1
    assert run(main, ["--checkpoints", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "no trained checkpoints" in capsys.readouterr().err


@pytest.mark.slow
def test_replot_from_csv_with_diverged_residuals(tmp_path, caplog):
    """Diverged (huge or non-finite) residuals are drawn on the ceiling and reported, not a crash."""
    rows = [
        {"cell": "X", "panel": "trained", "source": "s, parity inputs", "L": L, "iteration": k, "residual": r}
        for L in (64, 128)
        for k, r in enumerate([1.0, 1e200, math.inf, math.nan, 0.0, 1e-16])
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "in.csv", index=False)
    with caplog.at_level("WARNING"):
        df = main(["--from-csv", str(tmp_path / "in.csv"), "--out", str(tmp_path), "--name", "re"])
    assert len(df) == 12 and (tmp_path / "re.png").stat().st_size > 10_000
    assert not any("not converged" in r.message for r in caplog.records)  # final residual 1e-16: converged
    rows[-1]["residual"] = 0.5
    pd.DataFrame(rows).to_csv(tmp_path / "in.csv", index=False)
    with caplog.at_level("WARNING"):
        main(["--from-csv", str(tmp_path / "in.csv"), "--out", str(tmp_path), "--name", "re"])
    assert any("not converged after 5 iterations at L = 128" in r.message for r in caplog.records)


def test_the_figure_says_what_a_panel_lacks_and_keeps_labels_off_the_curves(caplog):
    """A panel whose residuals are all exactly 0 says so on itself and in one warning; the diverged and
    machine-epsilon lines are explained in the title, not by text over the curves."""
    import matplotlib

    matplotlib.use("Agg")
    from analysis.newton import plot

    rows = [
        {"cell": "X", "panel": p, "L": 64, "iteration": k, "residual": r}
        for p, res in (("freshly initialized", [0.0, 0.0, 0.0]), ("trained", [1.0, math.inf, 1e-3]))
        for k, r in enumerate(res)
    ]
    with caplog.at_level("WARNING"):
        fig = plot(pd.DataFrame(rows), "title", 2.2e-16)
    panels = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes}
    assert panels["X — freshly initialized"] == ["nothing to draw:\nevery residual is exactly 0 or missing"]
    assert panels["X — trained"] == []
    assert "diverged" in fig._suptitle.get_text() and "machine ε" in fig._suptitle.get_text()
    assert [r.message for r in caplog.records if "nothing to draw" in r.message] == [
        "X (freshly initialized): nothing to draw (every residual is exactly 0 or missing)"
    ]
