"""Every preset resolves, sweep by sweep, to trial specs, and every distinct model in it builds as a
trial builds it (``build_datamodule`` + ``build_module``), once each.

A distinct model is the spec without the fields that leave the network unchanged (seed, learning rate,
training, extrapolation, precision, device) and with the task replaced by the vocabulary and classes
it gives the model; a new model field counts without editing this file. ~600 models over all presets,
one test per preset so that pytest-xdist spreads them.
"""

import dataclasses

import pytest

from experiments.sweeps.presets import available_presets, build_specs, load_preset, resolve_sweep
from experiments.trial.model import count_parameters
from experiments.trial.train import build_datamodule, build_module

NOT_THE_MODEL = ("task", "task_options", "seed", "lr", "train", "extrapolation", "precision", "device", "priority")


def distinct_models(preset):
    """``{key: (spec, datamodule)}``, the first cell of each distinct model in ``preset``'s sweeps."""
    models = {}
    for sweep in load_preset(preset)["tasks"]:
        specs = build_specs(resolve_sweep(sweep, preset))
        assert specs, f"{preset}/{sweep} resolves to no cells"
        for spec in specs:
            dm = build_datamodule(spec)
            shape = {k: v for k, v in dataclasses.asdict(spec).items() if k not in NOT_THE_MODEL}
            models.setdefault(repr((dm.vocab_size, dm.num_classes, sorted(shape.items()))), (spec, dm))
    return models


@pytest.mark.parametrize("preset", available_presets())
def test_every_model_of_the_preset_builds(preset):
    models = distinct_models(preset)
    assert models
    for spec, dm in models.values():
        module = build_module(spec, dm)
        assert count_parameters(module) > 0, (preset, spec.task, spec.mixer)
