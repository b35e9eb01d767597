"""Typed options: every task, training, extrapolation and mixer option is parsed to its declared type or
refused in one line naming the option and its value (``experiments.sweeps.options``)."""

from __future__ import annotations

import dataclasses

import pytest

from experiments.sweep import main
from experiments.sweeps.options import dataclass_types, signature_types, typed_options
from experiments.sweeps.presets import resolve_sweep


@dataclasses.dataclass
class _Config:
    flag: bool = False
    count: int = 3
    rate: float = 0.5
    name: str = "a"
    clip: float | None = None
    lengths: tuple[int, ...] = (4, 8)
    pair: tuple[int, int] | None = None


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("flag", True, True),
        ("count", 7, 7),
        ("rate", 2, 2),  # an integer where a float is declared stays as written (the cell hash covers it)
        ("rate", "1e-3", 1e-3),  # YAML leaves 1e-3 a string
        ("name", "b", "b"),
        ("clip", "none", None),
        ("clip", None, None),
        ("clip", "2.5e-1", 0.25),
        ("lengths", [5, 9, 11], [5, 9, 11]),
        ("pair", [3, 17], [3, 17]),
        ("pair", (3, 17), (3, 17)),
    ],
)
def test_values_of_the_declared_type_are_parsed(key, value, expected):
    out = typed_options({key: value}, dataclass_types(_Config), "test")
    assert out == {key: expected} and type(out[key]) is type(expected)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("flag", "maybe", "test option flag=maybe: expected true or false"),
        ("flag", 1, "test option flag=1: expected true or false"),
        ("count", "abc", "test option count=abc: expected an integer"),
        ("count", 2.5, "test option count=2.5: expected an integer"),
        ("rate", "fast", "test option rate=fast: expected a number"),
        ("rate", True, "test option rate=true: expected a number"),
        ("name", 3, "test option name=3: expected a string"),
        ("clip", "x", "test option clip=x: expected a number or none"),
        ("lengths", 5, "test option lengths=5: expected a list of integers, e.g. [16, 64]"),
        ("lengths", ["abc"], 'test option lengths=["abc"]: expected a list of integers, e.g. [16, 64]'),
        ("pair", [1, 2, 3], "test option pair=[1, 2, 3]: expected a list of 2 integers, e.g. [16, 64] or none"),
    ],
)
def test_values_of_another_type_are_refused_naming_option_and_value(key, value, message):
    with pytest.raises(ValueError) as err:
        typed_options({key: value}, dataclass_types(_Config), "test")
    assert str(err.value) == message


def test_undeclared_options_pass_and_factories_declare_by_annotation_or_default():
    def factory(d_model: int, heads: int = 4, scale=1.0, gate=True, mode=None, **config):
        return None

    declared = signature_types(factory)
    assert declared == {"d_model": int, "heads": int, "scale": float, "gate": bool, "mode": declared["mode"]}
    assert typed_options({"mode": object, "other": "x"}, declared, "m")["other"] == "x"


def test_a_sweep_gets_typed_options():
    plan = resolve_sweep(
        "parity",
        "smoke",
        {
            "task_options": {"running": True},
            "train": {"weight_decay": "1e-3", "grad_clip": "none"},
            "extrapolation": {"min_len": 3, "max_len": 20, "eval_lengths": [20, 33]},
            "every_mixer": {"num_heads": 2},
        },
    )
    assert plan.task_options["running"] is True
    assert (plan.train.weight_decay, plan.train.grad_clip) == (1e-3, None)
    assert list(plan.extrapolation["eval_lengths"]) == [20, 33]
    assert all(plan.mixer_options[m]["num_heads"] == 2 for m in plan.mixers)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--task-option", "running=maybe"], "parity task option running=maybe: expected true or false"),
        (["--task-option", "seq_len=abc"], "parity task option seq_len=abc: expected an integer"),
        (
            ["--extrapolation-option", "eval_lengths=5"],
            "extrapolation option eval_lengths=5: expected a list of integers, e.g. [16, 64]",
        ),
        (
            ["--extrapolation-option", "eval_lengths=[abc]"],
            'extrapolation option eval_lengths=["abc"]: expected a list of integers, e.g. [16, 64]',
        ),
        (["--mixer-option", "num_heads=abc"], "mixer 'gru' option num_heads=abc: expected an integer"),
        (["--mixers", "deltaproduct[signed=maybe]"], "option signed=maybe: expected true or false"),
        (["--train-option", "early_stop_acc=high"], "train option early_stop_acc=high: expected a number"),
        (["--mixers", "fla:DeltaNet", "--mixer-option", "bf16=1"], "mixer 'fla:DeltaNet' option bf16=1: expected true"),
    ],
)
def test_a_mistyped_option_is_one_line_naming_it(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    code = main(["parity", "--preset", "smoke", "--mixers", "gru", *argv, "--out", str(out), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
