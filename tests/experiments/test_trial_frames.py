"""How deep a trial runs through the suite's own code: the stack frames of this repository from the sweep
CLI's ``main`` to the mixer's forward in a training step, the path a reader follows to find the training
algorithm. Run with ``-s`` to see the frames."""

import traceback
from pathlib import Path

import torch

from experiments.engines.autotune import CACHE_ENV
from experiments.sweep import main
from mixers.rnn import ClassicalRNN

ROOT = Path(__file__).resolve().parents[2]
#: the most frames of ours from ``main`` to the mixer; a layer added on the way fails here
MAX_OWN_FRAMES = 15


def own_frames_to_the_mixer(out: Path, monkeypatch) -> list[str]:
    """``path:line function`` of this repository's frames (``.venv`` excluded) from the sweep's ``main`` on, at the
    first training forward of the GRU mixer in a 2-step CPU sweep of one cell (not the up-front check)."""
    seen: list[list[traceback.FrameSummary]] = []
    forward = ClassicalRNN.forward

    def recording_forward(self, *args, **kwargs):
        stack = traceback.extract_stack()[:-1]
        if not seen and self.training and torch.is_grad_enabled() and any(f.name == "run_trial" for f in stack):
            seen.append(stack)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(ClassicalRNN, "forward", recording_forward)
    monkeypatch.setenv(CACHE_ENV, "1")  # main sets it for its process; restored after the test
    argv = ["parity", "--preset", "smoke", "--mixers", "gru", "--seeds", "0", "--lrs", "1e-3", "--max-steps", "2"]
    assert main([*argv, "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    assert seen, "the mixer never ran a training forward inside run_trial"
    stack = seen[0][next(i for i, f in enumerate(seen[0]) if f.name == "main" and f.filename.endswith("sweep.py")) :]
    ours = [f for f in stack if Path(f.filename).is_file() and Path(f.filename).resolve().is_relative_to(ROOT)]
    ours = [f for f in ours if ".venv" not in Path(f.filename).parts]
    return [f"{Path(f.filename).resolve().relative_to(ROOT)}:{f.lineno} {f.name}" for f in ours]


def test_a_trial_reaches_the_mixer_through_few_frames_of_its_own(tmp_path, monkeypatch):
    frames = own_frames_to_the_mixer(tmp_path / "sweep", monkeypatch)
    print("\n".join(frames))
    names = [frame.split()[-1] for frame in frames]
    assert names[0] == "main" and {"run_trial", "training_step"} <= set(names), frames
    assert len(frames) <= MAX_OWN_FRAMES, "\n".join(frames)
