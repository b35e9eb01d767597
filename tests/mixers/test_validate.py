"""The option checks of ``mixers/validate.py`` and the kernels' copy (``seqkernels/_validate.py``)."""

import pytest

import seqkernels._validate as kv
from mixers import validate as mv


@pytest.mark.parametrize("module", [mv, kv], ids=["mixers", "seqkernels"])
@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "4", None])
def test_positive_int_rejects_with_the_name_and_value(module, bad):
    with pytest.raises(ValueError, match=rf"^chunk_size must be a positive int, got {bad!r}$"):
        module.positive_int("chunk_size", bad)


@pytest.mark.parametrize("module", [mv, kv], ids=["mixers", "seqkernels"])
def test_ints_pass_through(module):
    assert module.positive_int("n", 7) == 7 and module.non_negative_int("n", 0) == 0
    assert module.is_int(3) and not module.is_int(False) and not module.is_int(3.0)


@pytest.mark.parametrize("module", [mv, kv], ids=["mixers", "seqkernels"])
@pytest.mark.parametrize("bad", [-1, False, 0.5])
def test_non_negative_int(module, bad):
    with pytest.raises(ValueError, match=rf"^iters must be an int >= 0, got {bad!r}$"):
        module.non_negative_int("iters", bad)


def test_non_negative_int_note_and_boolean_and_backend():
    with pytest.raises(ValueError, match=r"^mamba2: conv_kernel must be an int >= 0 \(0: off\), got -1$"):
        mv.non_negative_int("mamba2: conv_kernel", -1, " (0: off)")
    assert mv.boolean("gate", False) is False
    with pytest.raises(ValueError, match=r"^deltanet: gate must be True or False, got 1$"):
        mv.boolean("deltanet: gate", 1)
    assert mv.check_backend("mamba", "torch", ("auto", "torch")) == "torch"
    with pytest.raises(ValueError, match=r"^mamba: unknown backend 'cuda'; valid: auto, torch$"):
        mv.check_backend("mamba", "cuda", ("auto", "torch"))
