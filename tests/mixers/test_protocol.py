"""The mixer protocol (``mixers/protocol.py``): defaults, declared values, and that nothing else reads a
protocol attribute with a default of its own."""

import inspect
import re
import sys
from pathlib import Path

import pytest
from torch import nn

import mixers  # noqa: F401  (registers and imports every built-in mixer)
import mixers.fla_layers  # noqa: F401
import mixers.stacking  # noqa: F401
from mixers.attention import TransformerBlock
from mixers.delta import DeltaRuleMixer
from mixers.protocol import ATTRIBUTES, declared

ROOT = Path(__file__).resolve().parents[2]


def test_undeclared_attributes_take_the_default():
    bare = nn.Linear(2, 2)
    assert {name: declared(bare, name) for name in ATTRIBUTES} == {a.name: a.default for a in ATTRIBUTES.values()}


def test_declared_values_win_over_the_default():
    assert declared(TransformerBlock, "is_block") is True and declared(TransformerBlock, "has_positions") is True
    assert callable(declared(DeltaRuleMixer, "transitions"))
    assert "triton" in declared(DeltaRuleMixer, "BACKENDS")


def test_unknown_attribute_is_one_line_error():
    with pytest.raises(ValueError, match="'is_blok' is not a mixer protocol attribute"):
        declared(nn.Linear(2, 2), "is_blok")


def _mixer_classes() -> list[type]:
    return sorted(
        {
            c
            for name, mod in list(sys.modules.items())
            if name.startswith("mixers.")
            for _, c in inspect.getmembers(mod, inspect.isclass)
            if issubclass(c, nn.Module) and c.__module__.startswith("mixers.")
        },
        key=lambda c: c.__qualname__,
    )


def test_built_in_declarations_have_the_attribute_type():
    """Flags are bools, ``trials`` an int, ``graph_note`` a str, ``BACKENDS`` a tuple of names, methods
    callable."""
    checked = 0
    for cls in _mixer_classes():
        for a in ATTRIBUTES.values():
            if not any(a.name in vars(base) for base in cls.__mro__ if base.__module__.startswith("mixers.")):
                continue
            value = getattr(cls, a.name)
            if isinstance(value, property):  # a per-instance value (StackedLinear.trials)
                continue
            checked += 1
            if a.default is None:
                assert callable(value), (cls, a.name)
            elif isinstance(a.default, tuple):
                assert isinstance(value, tuple) and value and all(isinstance(v, str) for v in value), (cls, a.name)
            else:
                assert type(value) is type(a.default), (cls, a.name, value)
    assert checked >= 10  # the built-ins declare is_block, BACKENDS, stackable, transitions, ...


def test_no_reader_keeps_its_own_default():
    """Outside ``mixers/protocol.py`` (and tests) a protocol attribute is read through ``declared``."""
    names = "|".join(ATTRIBUTES)
    pattern = re.compile(rf"""(getattr|hasattr)\([^()]*(\([^()]*\))?[^()]*,\s*["']({names})["']""")
    found = [
        f"{path.relative_to(ROOT)}:{i}"
        for top in ("analysis", "benchmarks", "experiments", "seqkernels", "mixers", "tasks")
        for path in (ROOT / top).rglob("*.py")
        if path.name != "protocol.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_conventions_table_lists_every_attribute():
    text = (ROOT / "mixers" / "CONVENTIONS.md").read_text()
    table = text[text.index("## The mixer protocol") :]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(ATTRIBUTES)
