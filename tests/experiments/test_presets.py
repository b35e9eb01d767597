"""Preset files: inheritance (``extends``), subsets (``only``) and their errors."""

import pytest

import experiments.sweeps.presets as presets
from experiments.sweeps.presets import build_specs, load_preset, resolve_sweep


@pytest.fixture
def preset_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path)
    (tmp_path / "base.yaml").write_text(
        "defaults: {mixers: [gru, lstm], seeds: [0, 1], lrs: [1.0e-3], train: {max_steps: 100, eval_every: 50}}\n"
        "tasks:\n  parity: {task_options: {seq_len: 8}}\n  mqar: {train: {max_steps: 300}}\n"
        "paper: {source: base, results: {gru: {parity: [1.0, 100], mqar: [0.5, 200]}}}\n"
    )
    return tmp_path


def test_extends_merges_key_by_key_and_only_keeps_sweeps(preset_dir):
    (preset_dir / "child.yaml").write_text(
        "extends: base\nonly: [mqar, parity]\ntasks: {parity: {train: {max_steps: 7}}}\n"
        "paper: {results: {gru: {parity: [0.9]}}}\n"
    )
    data = load_preset("child")
    assert list(data["tasks"]) == ["mqar", "parity"]  # the order of `only`
    parity = resolve_sweep("parity", "child")
    assert parity.train.max_steps == 7 and parity.task_options == {"seq_len": 8} and parity.mixers == ["gru", "lstm"]
    assert resolve_sweep("mqar", "child").train.max_steps == 300
    assert (
        data["paper"]["results"]["gru"] == {"parity": [0.9], "mqar": [0.5, 200]} and data["paper"]["source"] == "base"
    )
    # a sweep the child does not change has the same cells as the base's
    assert build_specs(resolve_sweep("mqar", "child")) == build_specs(resolve_sweep("mqar", "base"))


def test_a_loaded_preset_is_the_files_current_text_and_the_callers_own_copy(preset_dir):
    """Parsed files are cached by their text: a load is the file as it is now, and changing what a load
    returned changes no later load."""
    first = load_preset("base")
    first["defaults"]["mixers"].append("transformer")
    assert load_preset("base")["defaults"]["mixers"] == ["gru", "lstm"]
    text = (preset_dir / "base.yaml").read_text()
    (preset_dir / "base.yaml").write_text(text.replace("[gru, lstm]", "[gru]"))
    assert load_preset("base")["defaults"]["mixers"] == ["gru"]


def test_extends_errors_are_one_line(preset_dir):
    (preset_dir / "loop.yaml").write_text("extends: loop\n")
    with pytest.raises(ValueError, match="'extends' makes a cycle"):
        load_preset("loop")
    (preset_dir / "orphan.yaml").write_text("extends: nosuch\n")
    with pytest.raises(ValueError, match="unknown preset 'nosuch'"):
        load_preset("orphan")
    (preset_dir / "bad.yaml").write_text("extends: base\nonly: [parity, khop]\n")
    with pytest.raises(ValueError, match="'only' names sweep\\(s\\) it does not have: khop"):
        load_preset("bad")


def test_priority_is_scheduling_only(preset_dir):
    """``priority: high`` reaches the plan, is checked, and leaves the cells (their ids) unchanged."""
    (preset_dir / "urgent.yaml").write_text("extends: base\ntasks: {mqar: {priority: high}}\n")
    assert resolve_sweep("mqar", "urgent").priority == "high"
    assert resolve_sweep("parity", "urgent").priority == "normal"
    assert build_specs(resolve_sweep("mqar", "urgent")) == build_specs(resolve_sweep("mqar", "base"))
    (preset_dir / "typo.yaml").write_text("extends: base\ntasks: {mqar: {priority: urgent}}\n")
    with pytest.raises(ValueError, match="priority must be one of normal, high, got 'urgent'"):
        resolve_sweep("mqar", "typo")


def test_conv_kernel_reaches_the_specs_and_only_a_changed_one_changes_the_cell(preset_dir):
    """``conv_kernel: 0`` (no convolution in the full block) is part of the spec and its cell id; the
    default 4 is left out of the id, so cells written before the key existed keep theirs."""
    from experiments.sweeps.study import cell_id

    (preset_dir / "noconv.yaml").write_text("extends: base\ntasks: {mqar: {conv_kernel: 0}}\n")
    plain, base = build_specs(resolve_sweep("mqar", "noconv")), build_specs(resolve_sweep("mqar", "base"))
    assert {s.model.conv_kernel for s in plain} == {0} and {s.model.conv_kernel for s in base} == {4}
    assert "conv_kernel" not in base[0].identity() and plain[0].identity()["conv_kernel"] == 0
    assert cell_id(plain[0]) != cell_id(base[0])
    (preset_dir / "negative.yaml").write_text("extends: base\ntasks: {mqar: {conv_kernel: -1}}\n")
    with pytest.raises(ValueError, match="conv_kernel must be an integer >= 0"):
        build_specs(resolve_sweep("mqar", "negative"))


def test_table6_full_gives_khop_priority():
    assert [resolve_sweep(e, "pararnn-table6-full").priority for e in ("khop", "khop2", "mqar")] == [
        "high",
        "normal",
        "normal",
    ]


@pytest.mark.parametrize("preset", ["smoke", "default"])
def test_every_task_has_a_sweep_in_the_smoke_and_default_presets(preset):
    """Every advertised task runs with ``--preset smoke`` (a CPU in minutes) and ``--preset default``;
    its specs build and its task options are ones the task accepts."""
    from tasks import TASKS, get_task

    for task in TASKS:
        plan = resolve_sweep(task, preset)
        specs = build_specs(plan)
        assert specs and all(s.task == task for s in specs), task
        get_task(task, **specs[0].task_options)


@pytest.mark.slow
def test_the_word_problem_smoke_sweep_learns(tmp_path):
    """The S3 smoke sweep's GRU composes permutations well above chance (1/6) on the CPU."""
    import pandas as pd

    from experiments.sweep import main

    assert main(["word_problem", "--preset", "smoke", "--mixers", "gru", "--out", str(tmp_path), "--no-progress"]) == 0
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["test/acc"].iloc[0] >= 0.9, df["test/acc"].iloc[0]


def test_reproduction_presets_state_their_data_departures():
    """A reproduction preset whose modular arithmetic has no ``=`` token, or whose word problems have no
    BOS token or are drawn i.i.d., says so in its description (the original authors' data have them)."""
    from experiments.paper import reproduction_presets
    from experiments.sweeps.presets import load_preset

    for name in reproduction_presets():
        data = load_preset(name)
        text = " ".join(str(data.get("description", "")).split())
        for entry in data.get("tasks", {}):
            plan = resolve_sweep(entry, name)
            if plan.task == "modular_arithmetic" and not plan.task_options.get("equals"):
                assert "no `=` token" in text and "equals: true" in text, name
            if plan.task == "word_problem":
                if not plan.task_options.get("bos"):
                    assert "no BOS token" in text, name
                if not plan.task_options.get("distinct"):
                    assert "i.i.d." in text and "distinct" in text, name


@pytest.mark.slow
def test_a_string_task_smoke_sweep_learns(tmp_path):
    """Reverse string (answers after the input): the smoke sweep's GRU gets the answer slots right at its
    training lengths on the CPU (measured 99.9% in 51 s on 2 shared cores); chance is 50%."""
    import pandas as pd

    from experiments.sweep import main

    out = str(tmp_path)
    assert main(["reverse_string", "--preset", "smoke", "--mixers", "gru", "--out", out, "--no-progress"]) == 0
    df = pd.read_csv(tmp_path / "results.csv")
    assert df["len10/acc"].iloc[0] >= 0.9, df["len10/acc"].iloc[0]


def test_a_model_option_reaches_specs_cells_and_columns(preset_dir):
    """A ``ModelShape`` field (``mlp_ratio``) is a preset key: it reaches every spec, changes the cell id
    only when set (the default stays out of the hash), is refused in one line naming it, and is a results
    column (the trials stored before it existed read its default)."""
    from experiments.sweeps.results import _spec_columns
    from experiments.sweeps.study import cell_id

    (preset_dir / "mlp.yaml").write_text("extends: base\ntasks: {mqar: {mlp_ratio: 2}}\n")
    wide, base = build_specs(resolve_sweep("mqar", "mlp")), build_specs(resolve_sweep("mqar", "base"))
    assert {s.model.mlp_ratio for s in wide} == {2} and {s.model.mlp_ratio for s in base} == {0}
    assert "mlp_ratio" not in base[0].identity() and wide[0].identity()["mlp_ratio"] == 2
    assert cell_id(wide[0]) != cell_id(base[0])
    assert _spec_columns("mqar", wide[0].to_dict())["mlp_ratio"] == 2
    old = {k: v for k, v in base[0].to_dict().items() if k != "mlp_ratio"}
    assert _spec_columns("mqar", old)["mlp_ratio"] == 0
    (preset_dir / "bad_mlp.yaml").write_text("extends: base\ntasks: {mqar: {mlp_ratio: wide}}\n")
    with pytest.raises(ValueError, match="mlp_ratio=wide"):
        resolve_sweep("mqar", "bad_mlp")
