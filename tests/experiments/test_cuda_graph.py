"""The CUDA-graph step engine (GPU only): the same training as eager steps, the Newton check's policy, resume."""

import dataclasses

import lightning as L
import pytest
import torch

from experiments.trial.shape import ModelShape
from experiments.trial.train import RunOptions, TrainConfig, TrialSpec, quiet_lightning, run_trial

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: (task, options, block, positional, mixer): the Table 6 mix at small shapes, and the scan-based Mamba
CASES = [
    ("mqar", {"seq_len": 32, "vocab_size": 32}, "full", "none", "flashgru"),
    ("mqar", {"seq_len": 32, "vocab_size": 32}, "full", "none", "flashlstm"),
    ("mqar", {"seq_len": 32, "vocab_size": 32}, "full", "none", "mamba2"),
    ("keep_nth", {"seq_len": 32, "vocab_size": 16, "n": 3}, "mixer", "sinusoidal", "transformer"),
    ("parity", {"seq_len": 40, "running": True}, "mixer", "none", "mamba"),
    ("parity", {"seq_len": 40, "running": True}, "mixer", "none", "complex_diag"),
    ("parity", {"seq_len": 40, "running": True}, "mixer", "none", "mamba3"),
]


def _spec(case, steps=50, eval_every=None, **mixer_options):
    task, options, block, positional, mixer = case
    return TrialSpec(
        task=task,
        model=ModelShape(mixer=mixer, mixer_options=mixer_options, block=block, positional=positional),
        lr=2e-3,
        seed=0,
        task_options=options,
        device="cuda",
        train=TrainConfig(
            max_steps=steps,
            eval_every=eval_every or steps,
            batch_size=16,
            train_size=512,
            val_size=64,
            test_size=64,
            early_stop_acc=2.0,
        ),
    )


def _weights(folder):
    return torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def _max_weight_difference(a, b) -> float:
    """The largest absolute difference between two state dicts' tensors (``a``'s keys)."""
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _under_two_engines(spec, tmp_path, first: str, second: str):
    """``(result, result, weights, weights)`` of ``spec`` trained under engine ``first``, then ``second``."""
    results = [run_trial(spec, tmp_path / e, options=RunOptions(logger="none", engine=e)) for e in (first, second)]
    return (*results, _weights(tmp_path / first), _weights(tmp_path / second))


def _bucketed_spec(mixer, steps=60):
    """Running parity on lengths 3..40 in length-bucketed batches (pools of 4): widths 16, 32 and 40."""
    spec = _spec(("parity", {"running": True}, "mixer", "none", mixer), steps=steps)
    return dataclasses.replace(
        spec,
        extrapolation={"min_len": 3, "max_len": 40, "eval_lengths": [40]},
        train=dataclasses.replace(spec.train, length_bucketing=4),
    )


@pytest.mark.parametrize("case", CASES, ids=[c[-1] for c in CASES])
def test_graph_steps_train_exactly_like_eager_steps(tmp_path, case):
    """50 steps replayed from one CUDA graph end in the weights 50 eager steps reach (same kernels, same order)."""
    quiet_lightning()
    spec = _spec(case)
    eager, graph, a, b = _under_two_engines(spec, tmp_path, "eager", "graph")
    worst = _max_weight_difference(a, b)
    assert worst <= 1e-6, f"max weight difference {worst:.3g} after 50 steps"
    assert graph["final/test/acc"] == pytest.approx(eager["final/test/acc"], abs=1 / 64)
    assert graph["steps"] == eager["steps"] == 50


def test_pd_ssm_trains_in_graph_steps_as_in_eager_steps(tmp_path):
    """PD-SSM's scan sums lanes sent to one row with ``scatter_add`` (atomics on CUDA: the order of the
    additions varies run to run), so graph and eager steps agree to float32 rounding, not bit for bit."""
    quiet_lightning()
    spec = _spec(("parity", {"seq_len": 40, "running": True}, "mixer", "none", "pd_ssm"))
    eager, graph, a, b = _under_two_engines(spec, tmp_path, "eager", "graph")
    worst = _max_weight_difference(a, b)
    assert worst <= 1e-4, f"max weight difference {worst:.3g} after 50 steps"
    assert graph["steps"] == eager["steps"] == 50 and graph["engine"] == "graph"


@pytest.mark.parametrize("mixer", ["flashgru", "mamba2", "transformer"])
def test_length_bucketed_graph_steps_train_like_eager_steps(tmp_path, mixer):
    """Length bucketing under the graph engine (batches of lengths 3..40 cut to multiples of 16: widths 16,
    32, 40, a CUDA graph each, all updating one set of weights) ends 60 steps where eager steps on the exact
    cuts end (the same rows per batch; other widths, so float rounding only)."""
    quiet_lightning()
    spec = _bucketed_spec(mixer)
    eager, graph, a, b = _under_two_engines(spec, tmp_path, "eager", "graph")
    worst = _max_weight_difference(a, b)
    assert worst <= 1e-4, f"max weight difference {worst:.3g} after 60 steps"
    assert graph["steps"] == eager["steps"] == 60 and graph["engine"] == "graph"


@pytest.mark.parametrize("mixer", ["flashgru", "transformer"])
def test_length_bucketed_compiled_steps_train_like_graph_steps(tmp_path, mixer):
    """Length bucketing under the ``compiled`` engine (a compiled graph and a CUDA graph per width, 16, 32
    and 40) ends 60 steps within float rounding of the ``graph`` engine on the same batches."""
    quiet_lightning()
    spec = _bucketed_spec(mixer)
    graph, compiled, a, b = _under_two_engines(spec, tmp_path, "graph", "compiled")
    worst = _max_weight_difference(a, b)
    assert worst <= 1e-3, f"max weight difference {worst:.3g} after 60 steps"
    assert compiled["steps"] == graph["steps"] == 60 and compiled["engine"] == "compiled"


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[3]], ids=["flashgru", "mamba2", "transformer"])
def test_compiled_steps_train_like_graph_steps(tmp_path, case):
    """The ``compiled`` engine (graph replays of the torch.compile'd model: fused kernels, another order of
    float operations) ends 50 steps within float rounding of the ``graph`` engine, and its checkpoint has
    the same keys (the compiled forward is no submodule)."""
    quiet_lightning()
    spec = _spec(case)
    graph, compiled, a, b = _under_two_engines(spec, tmp_path, "graph", "compiled")
    assert a.keys() == b.keys()
    worst = _max_weight_difference(a, b)
    assert worst <= 1e-3, f"max weight difference {worst:.3g} after 50 steps"
    assert compiled["final/test/acc"] == pytest.approx(graph["final/test/acc"], abs=2 / 64)
    assert compiled["steps"] == 50 and compiled.get("newton/skipped_steps", 0) == graph.get("newton/skipped_steps", 0)


class Snapshot(L.Callback):
    """The model's weights after optimizer step ``at`` (``0``: before the first)."""

    def __init__(self, at: int) -> None:
        self.at, self.weights = at, None

    def _take(self, trainer, pl_module) -> None:
        if trainer.global_step == self.at:
            self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def on_train_start(self, trainer, pl_module) -> None:
        self._take(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self._take(trainer, pl_module)


@pytest.mark.parametrize("engine, first_flagged", [("graph", 4), ("compiled", 1)])
def test_an_unchecked_newton_step_is_never_trained_on(tmp_path, engine, first_flagged):
    """A FlashGRU solve that fails its residual check under the in-graph policy (one Newton iteration,
    tolerance 1e-30, no re-solve) makes the fused AdamW skip the update (``found_inf``). ``graph``: the 3
    eager warm-up steps fall back to the sequential loop and train; the first replayed step (step 4) is
    flagged. ``compiled``: the warm-up steps already run the in-graph policy (``graph_policy``), so step 1
    is flagged. The flagged step leaves the weights where they were; the validation after it finds 1 of 1
    forwards unchecked (more than ``MAX_SKIPPED_SHARE``), so the trial goes on eagerly with the plain model,
    where the failed solve falls back to the sequential loop and every later step updates."""
    quiet_lightning()
    spec = _spec(CASES[0], steps=12, eval_every=1, iters=1, divergence_tol=1e-30, retry_iters=0)
    before, flagged = Snapshot(at=first_flagged - 1), Snapshot(at=first_flagged)
    result = run_trial(spec, tmp_path, callbacks=[before, flagged], options=RunOptions(logger="none", engine=engine))
    moved = [k for k in before.weights if not torch.equal(before.weights[k], flagged.weights[k])]
    assert not moved, moved
    end = _weights(tmp_path)
    assert any(not torch.equal(end[k], flagged.weights[k].cpu()) for k in end)  # the eager steps train
    assert result["newton/eager_from_step"] == first_flagged and result["newton/skipped_steps"] == 1
    assert result["newton/fallback_count"] >= 12 - 1  # every other step fell back (and the validations)


def test_graph_replays_are_counted_in_the_newton_statistics(tmp_path):
    quiet_lightning()
    checked = run_trial(_spec(CASES[0], steps=12), tmp_path / "a", options=RunOptions(logger="none", engine="graph"))
    assert checked["newton/graph_forwards"] == 12 - 3 and checked["newton/skipped_steps"] == 0  # 3 eager warm-up steps
    unchecked = run_trial(
        _spec(CASES[0], steps=12, divergence_tol=1e-30, retry_iters=0),
        tmp_path / "b",
        options=RunOptions(logger="none", engine="graph"),
    )
    assert unchecked["newton/skipped_steps"] == 12 - 3 and unchecked["newton/fallback_count"] >= 3  # eager: fallback


@pytest.mark.parametrize("engine, tol", [("graph", 1e-6), ("compiled", 1e-4)])
def test_interrupted_graph_trial_resumes_exactly(tmp_path, engine, tol):
    """A trial cut at step 20 (Ctrl-C) and re-run ends where the uncut trial ends: the same weights (the
    ``compiled`` engine: within float rounding, its 3 warm-up steps after the resume run the plain model)
    and one results row that says where it resumed."""
    quiet_lightning()

    class Interrupt(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 20:
                raise KeyboardInterrupt

    spec = _spec(CASES[0], steps=40, eval_every=10)
    whole = run_trial(spec, tmp_path / "whole", options=RunOptions(logger="none", engine=engine))
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec, tmp_path / "cut", callbacks=[Interrupt()], options=RunOptions(logger="none", engine=engine))
    resumed = run_trial(spec, tmp_path / "cut", options=RunOptions(logger="none", engine=engine))
    assert resumed["resumed_from_step"] == 20 and resumed["steps"] == whole["steps"] == 40
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    worst = _max_weight_difference(a, b)
    assert worst <= tol, f"max weight difference {worst:.3g} between the resumed and the uncut trial"
    # the tolerance tells the trained weights from those one step into the same trial
    one_step = dataclasses.replace(spec, train=dataclasses.replace(spec.train, max_steps=1, eval_every=1))
    run_trial(one_step, tmp_path / "start", options=RunOptions(logger="none", engine="eager"))
    start = _weights(tmp_path / "start")
    assert max(float((a[k].float() - start[k].float()).abs().max()) for k in a) > 100 * tol


@pytest.mark.parametrize("engine, tol", [("graph", 1e-5), ("compiled", 1e-3)])
@pytest.mark.parametrize("case", CASES[:4], ids=[c[-1] for c in CASES[:4]])
def test_stacked_trials_train_like_their_separate_trials(tmp_path, case, engine, tol):
    """Three seeds stacked (``experiments.trial.stack``) on a GPU step engine: after 50 captured steps each
    trial's final weights are its separate trial's on the same engine, within float rounding (the
    stack's kernels run over 3 times the heads or batch, in another order of float operations)."""
    from experiments.trial.stack import run_stack

    quiet_lightning()
    specs = [dataclasses.replace(_spec(case), seed=s) for s in (0, 1, 2)]
    options = RunOptions(logger="none", engine=engine)
    stacked = run_stack(specs, [tmp_path / f"t{s.seed}" for s in specs], tmp_path / "stack", options)
    for spec, result in zip(specs, stacked):
        alone = run_trial(spec, tmp_path / f"alone{spec.seed}", options=options)
        a = torch.load(tmp_path / f"t{spec.seed}" / "checkpoints" / "final.ckpt", weights_only=False)["state_dict"]
        b = _weights(tmp_path / f"alone{spec.seed}")
        worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in b)
        assert worst <= tol, f"seed {spec.seed}: max weight difference {worst:.3g} after 50 steps"
        assert result["steps"] == alone["steps"] == 50
        assert result["final/test/acc"] == pytest.approx(alone["final/test/acc"], abs=2 / 64)
