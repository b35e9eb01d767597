"""Mixer names with options, ``name[key=value,...]``: parsed, built with those options, listed on the CLI."""

import pytest

from experiments.cli import str_list
from experiments.sweeps.workers import path_name
from mixers import build_mixer
from mixers.build import split_options


def test_options_in_the_name():
    assert split_options("gru") == ("gru", {})
    assert split_options("deltaproduct[householders=4, signed=false,mode=x]") == (
        "deltaproduct",
        {"householders": 4, "signed": False, "mode": "x"},
    )
    assert split_options("m[a=1e-3,b=none,c=True]") == ("m", {"a": 1e-3, "b": None, "c": True})
    with pytest.raises(ValueError, match="expected name\\[key=value"):
        split_options("deltaproduct[householders]")


def test_a_named_variant_builds_with_its_options_and_explicit_options_win():
    m = build_mixer("deltaproduct[householders=3,signed=false]", 16, num_heads=2)
    assert (m.householders, m.signed) == (3, False)
    assert build_mixer("deltaproduct[householders=3]", 16, num_heads=2, householders=1).householders == 1
    with pytest.raises(ValueError, match="unknown mixer 'nope'"):
        build_mixer("nope[a=1]", 16)


def test_cli_lists_and_folder_names_keep_variants_whole():
    assert str_list("gru,deltaproduct[householders=4,signed=false]") == [
        "gru",
        "deltaproduct[householders=4,signed=false]",
    ]
    assert path_name("deltaproduct[householders=4,signed=false]") == "deltaproduct.householders=4.signed=false"
    assert path_name("my_cells:MinimalGRU") == "my_cells.MinimalGRU"
