"""The CUDA-graph step engine (GPU only): the same training as eager steps, the Newton check's policy, resume."""

import lightning as L
import pytest
import torch

from experiments.train import RunOptions, TrainConfig, TrialSpec, quiet_lightning, run_trial

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: (task, options, block, positional, mixer): the Table 6 mix at small shapes, and the scan-based Mamba
CASES = [
    ("mqar", {"seq_len": 32, "vocab_size": 32}, "full", "none", "flashgru"),
    ("mqar", {"seq_len": 32, "vocab_size": 32}, "full", "none", "flashlstm"),
    ("mqar", {"seq_len": 32, "vocab_size": 32}, "full", "none", "mamba2"),
    ("keep_nth", {"seq_len": 32, "vocab_size": 16, "n": 3}, "mixer", "sinusoidal", "transformer"),
    ("parity", {"seq_len": 40, "running": True}, "mixer", "none", "mamba"),
]


def _spec(case, steps=50, eval_every=None, **mixer_options):
    task, options, block, positional, mixer = case
    return TrialSpec(task=task, mixer=mixer, lr=2e-3, seed=0, task_options=options, mixer_options=mixer_options,
                     block=block, positional=positional, device="cuda",
                     train=TrainConfig(max_steps=steps, eval_every=eval_every or steps, batch_size=16, train_size=512,
                                       val_size=64, test_size=64, early_stop_acc=2.0))


def _weights(folder):
    return torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.parametrize("case", CASES, ids=[c[-1] for c in CASES])
def test_graph_steps_train_exactly_like_eager_steps(tmp_path, case):
    """50 steps replayed from one CUDA graph end in the weights 50 eager steps reach (same kernels, same order)."""
    quiet_lightning()
    spec = _spec(case)
    eager = run_trial(spec, tmp_path / "eager", options=RunOptions(logger="none", engine="eager"))
    graph = run_trial(spec, tmp_path / "graph", options=RunOptions(logger="none", engine="graph"))
    a, b = _weights(tmp_path / "eager"), _weights(tmp_path / "graph")
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst <= 1e-6, f"max weight difference {worst:.3g} after 50 steps"
    assert graph["final/test/acc"] == pytest.approx(eager["final/test/acc"], abs=1 / 64)
    assert graph["steps"] == eager["steps"] == 50


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[3]], ids=["flashgru", "mamba2", "transformer"])
def test_compiled_steps_train_like_graph_steps(tmp_path, case):
    """The ``compiled`` engine (graph replays of the torch.compile'd model: fused kernels, another order of
    float operations) ends 50 steps within float rounding of the ``graph`` engine, and its checkpoint has
    the same keys (the compiled forward is no submodule)."""
    quiet_lightning()
    spec = _spec(case)
    graph = run_trial(spec, tmp_path / "graph", options=RunOptions(logger="none", engine="graph"))
    compiled = run_trial(spec, tmp_path / "compiled", options=RunOptions(logger="none", engine="compiled"))
    a, b = _weights(tmp_path / "graph"), _weights(tmp_path / "compiled")
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst <= 1e-3, f"max weight difference {worst:.3g} after 50 steps"
    assert compiled["final/test/acc"] == pytest.approx(graph["final/test/acc"], abs=2 / 64)
    assert compiled["steps"] == 50 and compiled.get("newton/skipped_steps", 0) == graph.get("newton/skipped_steps", 0)


class Snapshot(L.Callback):
    """The model's weights after optimizer step ``at``."""

    def __init__(self, at: int) -> None:
        self.at, self.weights = at, None

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.at:
            self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


def test_an_unchecked_newton_step_is_never_trained_on(tmp_path):
    """Inside the graph a FlashGRU solve that fails its residual check (tolerance 1e-30, no re-solve) makes
    the fused AdamW skip the update: the first replayed step (step 4, after 3 eager warm-up steps) leaves
    the weights where they were. The validation after it finds 1 of 1 captured steps skipped (more than
    ``MAX_SKIPPED_SHARE``), so the trial goes on eagerly: there the failed solve falls back to the
    sequential loop and every step updates."""
    quiet_lightning()
    spec = _spec(CASES[0], steps=12, eval_every=1, divergence_tol=1e-30, retry_iters=0)
    warm, replayed = Snapshot(at=3), Snapshot(at=4)
    result = run_trial(spec, tmp_path, callbacks=[warm, replayed], options=RunOptions(logger="none", engine="graph"))
    moved = [k for k in warm.weights if not torch.equal(warm.weights[k], replayed.weights[k])]
    assert not moved, moved
    end = _weights(tmp_path)
    assert any(not torch.equal(end[k], replayed.weights[k].cpu()) for k in end)  # the eager steps train
    assert result["newton/eager_from_step"] == 4 and result["newton/skipped_steps"] == 1
    assert result["newton/fallback_count"] >= 3 + 8  # warm-up and eager steps fall back (and the validations)


def test_graph_replays_are_counted_in_the_newton_statistics(tmp_path):
    quiet_lightning()
    checked = run_trial(_spec(CASES[0], steps=12), tmp_path / "a", options=RunOptions(logger="none", engine="graph"))
    assert checked["newton/graph_forwards"] == 12 - 3 and checked["newton/skipped_steps"] == 0  # 3 eager warm-up steps
    unchecked = run_trial(_spec(CASES[0], steps=12, divergence_tol=1e-30, retry_iters=0), tmp_path / "b",
                          options=RunOptions(logger="none", engine="graph"))
    assert unchecked["newton/skipped_steps"] == 12 - 3 and unchecked["newton/fallback_count"] >= 3  # eager: fallback


def test_interrupted_graph_trial_resumes_exactly(tmp_path):
    quiet_lightning()

    class Interrupt(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 20:
                raise KeyboardInterrupt

    spec = _spec(CASES[0], steps=40, eval_every=10)
    run_trial(spec, tmp_path / "whole", options=RunOptions(logger="none", engine="graph"))
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec, tmp_path / "cut", callbacks=[Interrupt()], options=RunOptions(logger="none", engine="graph"))
    resumed = run_trial(spec, tmp_path / "cut", options=RunOptions(logger="none", engine="graph"))
    assert resumed["resumed_from_step"] == 20
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert max(float((a[k].float() - b[k].float()).abs().max()) for k in a) <= 1e-6
