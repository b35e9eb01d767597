"""Depth (``layers``), precision (``bf16-mixed``), GPU-only mixers and ``fla:<Layer>`` mixers."""

import dataclasses
import sys
import types

import lightning as L
import pandas as pd
import pytest
import torch
from torch import nn

from experiments import sweep
from experiments.sweeps.presets import build_specs, resolve_sweep
from experiments.sweeps.runner import validate_specs
from experiments.sweeps.study import cell_id
from experiments.trial.model import FullBlock, ModelConfig, ResidualLayer, SequenceModel, count_parameters
from experiments.trial.shape import ModelShape
from experiments.trial.train import TrainConfig, TrialSpec, capturable_engine, run_trial
from mixers import build_mixer


@pytest.mark.parametrize("mixer,block", [("gru", "mixer"), ("mamba2", "full"), ("transformer", "full")])
def test_one_layer_is_the_single_layer_model_and_deeper_adds_whole_layers(mixer, block):
    """At ``layers=1`` the parameter names are the paper model's (no ``deeper``); each further layer adds
    one block and one RMSNorm, with the block's own parameter count."""
    config = dict(vocab_size=16, num_classes=5, mixer=mixer, block=block, d_model=32, mixer_options={"num_heads": 2})
    one, three = SequenceModel(ModelConfig(**config)), SequenceModel(ModelConfig(**config, layers=3))
    names = {n.split(".")[0] for n, _ in one.named_parameters()}
    assert names == {"embedding", "norm_in", "block", "norm_out", "head"}
    assert [n for n, _ in one.named_parameters()] == [
        n for n, _ in three.named_parameters() if not n.startswith("deeper.")
    ]
    block_params = count_parameters(one.block)
    assert count_parameters(three) == count_parameters(one) + 2 * (block_params + 32)
    assert all(isinstance(layer, ResidualLayer) for layer in three.deeper)


def test_a_deep_model_composes_pre_norm_residual_layers():
    """The 2-layer bare-mixer model against its definition written out: ``x + mixer(norm(x))`` per layer;
    with a full block (its own residual) ``block(norm(x))``; causal."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 16, (3, 11))
    for block in ("mixer", "full"):
        m = SequenceModel(
            ModelConfig(16, 5, mixer="gru", block=block, d_model=16, layers=2, mixer_options={"num_heads": 2})
        )
        x = m.embedding(tokens)
        if block == "mixer":
            x = x + m.block(m.norm_in(x))
            x = x + m.deeper[0].block(m.deeper[0].norm(x))
        else:
            assert isinstance(m.block, FullBlock)
            x = m.deeper[0].block(m.deeper[0].norm(m.block(m.norm_in(x))))
        torch.testing.assert_close(m(tokens), m.head(m.norm_out(x)))
        changed = tokens.clone()
        changed[:, 6] = (changed[:, 6] + 1) % 16
        out, out2 = m(tokens), m(changed)
        torch.testing.assert_close(out[:, :6], out2[:, :6])
        assert not torch.allclose(out[:, 6:], out2[:, 6:])


def test_layers_and_precision_are_part_of_the_cell_and_old_cells_keep_their_ids():
    base = TrialSpec(task="parity", model=ModelShape(mixer="gru"), lr=1e-3, seed=0)
    deep = TrialSpec(task="parity", model=ModelShape(mixer="gru", layers=2), lr=1e-3, seed=0)
    bf16 = TrialSpec(task="parity", model=ModelShape(mixer="gru", precision="bf16-mixed"), lr=1e-3, seed=0)
    assert len({cell_id(base), cell_id(deep), cell_id(bf16)}) == 3
    assert "layers" not in base.identity() and "precision" not in base.identity()  # hash as before depth existed
    assert deep.cell_key() == "parity|gru|layers=2|seed=0|lr=0.001"
    with pytest.raises(ValueError, match="layers must be an integer >= 1"):
        TrialSpec(task="parity", model=ModelShape(mixer="gru", layers=0), lr=1e-3, seed=0)
    with pytest.raises(ValueError, match="precision must be one of"):
        TrialSpec(task="parity", model=ModelShape(mixer="gru", precision="16-mixed"), lr=1e-3, seed=0)


def test_the_sweep_command_overrides_the_width():
    """``--d-model 128`` reaches every spec of the plan; without it the preset's width stays."""
    args = sweep.parser().parse_args(["s4", "--preset", "deltaproduct-groups", "--d-model", "96"])
    assert args.d_model == 96
    wide = resolve_sweep("s4", "deltaproduct-groups", {"d_model": args.d_model})
    assert {s.model.d_model for s in build_specs(wide)} == {96}
    assert {s.model.d_model for s in build_specs(resolve_sweep("s4", "deltaproduct-groups"))} == {64}
    with pytest.raises(SystemExit):
        sweep.parser().parse_args(["s4", "--d-model", "0"])


@pytest.mark.slow
def test_a_sweep_at_another_width_records_it_in_its_own_folder(tmp_path, monkeypatch):
    """``--d-model 16`` without ``--out`` writes ``runs/<task>-<preset>-d16``: the tables group cells by mixer
    and depth, so a width beside the preset's must not share its folder; every row records the width."""
    monkeypatch.chdir(tmp_path)
    argv = ["parity", "--preset", "smoke", "--mixers", "gru", "--seeds", "0", "--max-steps", "20", "--no-progress"]
    assert sweep.main([*argv, "--d-model", "16"]) == 0
    df = pd.read_csv(tmp_path / "runs" / "parity-smoke-d16" / "results.csv")
    assert df["d_model"].tolist() == [16] * len(df)
    assert not (tmp_path / "runs" / "parity-smoke").exists()


def test_the_sweep_command_overrides_the_lengths():
    """``--extrapolation-option`` replaces single length options and keeps the preset's others; a bad
    key or bad lengths are one clear error."""
    args = sweep.parser().parse_args(
        ["s4", "--extrapolation-option", "max_len=16", "--extrapolation-option", "eval_lengths=[16, 64]"]
    )
    plan = resolve_sweep("s4", "deltaproduct-groups", {"extrapolation": dict(args.extrapolation_option)})
    assert plan.extrapolation == {"min_len": 2, "max_len": 16, "eval_lengths": [16, 64]}
    assert {tuple(s.extrapolation["eval_lengths"]) for s in build_specs(plan)} == {(16, 64)}
    with pytest.raises(ValueError, match="unknown extrapolation option.*max_length.*valid: eval_lengths, max_len"):
        resolve_sweep("s4", "deltaproduct-groups", {"extrapolation": {"max_length": 16}})
    with pytest.raises(ValueError, match="min_len <= max_len"):
        resolve_sweep("s4", "deltaproduct-groups", {"extrapolation": {"min_len": 20, "max_len": 16}})


def test_a_preset_sweeps_layers_as_a_grid_axis():
    plan = resolve_sweep("parity", "smoke", {"mixers": ["gru", "lstm"], "layers": [1, 2], "precision": "bf16-mixed"})
    specs = build_specs(plan)
    assert [(s.model.mixer, s.model.layers) for s in specs] == [("gru", 1), ("gru", 2), ("lstm", 1), ("lstm", 2)]
    assert {s.model.precision for s in specs} == {"bf16-mixed"}
    with pytest.raises(ValueError, match="layers must be an integer >= 1"):
        resolve_sweep("parity", "smoke", {"layers": [0]})
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_sweep("parity", "smoke", {"precision": "fp8"})
    with pytest.raises(ValueError, match=r"mixer_options maps a mixer to its options.*'num_heads': 1"):
        resolve_sweep("parity", "smoke", {"mixer_options": {"num_heads": 1}})


@pytest.mark.slow
def test_sweep_over_layers_reports_each_depth(tmp_path, capsys):
    """``--layers 1,2``: two cells per mixer, both trained (GRU learns parity at either depth), a ``layers``
    column in results.csv and table.md, and ``--precision`` recorded in every row."""
    out = tmp_path / "run"
    code = sweep.main(
        [
            "parity",
            "--preset",
            "smoke",
            "--mixers",
            "gru",
            "--layers",
            "1,2",
            "--precision",
            "bf16-mixed",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    df = pd.read_csv(out / "results.csv")
    assert sorted(df["layers"]) == [1, 2] and set(df["status"]) == {"ok"} and set(df["precision"]) == {"bf16-mixed"}
    assert (df["test/acc"] > 0.95).all(), df[["layers", "test/acc"]]
    assert df.loc[df["layers"] == 2, "n_params"].iloc[0] > df.loc[df["layers"] == 1, "n_params"].iloc[0]
    pd.testing.assert_series_equal(df["extrap/scaled_acc"], (df["extrap/mean_acc"] - 0.5) / 0.5, check_names=False)
    header = [c.strip() for c in (out / "table.md").read_text().splitlines()[0].split("|")]
    assert header[1:4] == ["task", "mixer", "layers"]


def test_bf16_mixed_keeps_float32_weights(tmp_path):
    """A ``bf16-mixed`` trial trains under bfloat16 autocast (its matmuls run in bf16) and keeps float32
    weights: the best checkpoint's tensors are float32 and the results row records the precision."""
    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru", precision="bf16-mixed"),
        lr=3e-3,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(max_steps=20, batch_size=8, train_size=64, val_size=16, test_size=16, eval_every=10),
    )
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: seen.append(o.dtype) if isinstance(m, nn.Linear) and m.training else None
    )
    try:
        result = run_trial(spec, tmp_path / "trial")
    finally:
        handle.remove()
    assert torch.bfloat16 in seen
    state = torch.load(tmp_path / "trial" / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)[
        "state_dict"
    ]
    assert {v.dtype for k, v in state.items() if v.is_floating_point()} == {torch.float32}
    assert result["engine"] == "eager"
    assert result["test/scaled_acc"] == pytest.approx((result["test/acc"] - 0.5) / 0.5)  # parity: chance 1/2


def test_graph_engines_fall_back_to_eager_for_a_mixer_that_cannot_be_captured():
    model = SequenceModel(ModelConfig(4, 2, mixer="gru"))
    assert capturable_engine("graph", model) == ("graph", "")
    model.block.graph_capturable, model.block.graph_note = False, "its kernels sync the host"
    assert capturable_engine("compiled", model) == ("eager", "engine compiled -> eager: its kernels sync the host")
    assert capturable_engine("eager", model) == ("eager", "")


class _FakeLayer(nn.Module):
    """A stand-in for an fla layer: takes ``hidden_size`` and ``num_heads``, returns a tuple, checks options
    with an assert (as fla's layers do), and fails on the CPU the way a Triton kernel does."""

    def __init__(
        self, hidden_size: int, num_heads: int = 1, head_dim: int = 256, mode: str = "chunk", gpu_only: bool = False
    ):
        super().__init__()
        assert mode in ("chunk", "fused_recurrent"), f"Not supported mode `{mode}`."
        self.proj, self.num_heads, self.head_dim = nn.Linear(hidden_size, hidden_size), num_heads, head_dim
        self.gpu_only = gpu_only

    def forward(self, x, attention_mask=None, **kwargs):
        if self.gpu_only:
            raise ValueError("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)")
        return self.proj(x), None, None


class _NoHeads(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        return self.proj(x)


@pytest.fixture
def fake_fla(monkeypatch):
    fla, layers = types.ModuleType("fla"), types.ModuleType("fla.layers")
    layers.FakeLayer, layers.NoHeads, layers.__all__ = _FakeLayer, _NoHeads, ["FakeLayer", "NoHeads"]
    fla.layers = layers
    monkeypatch.setitem(sys.modules, "fla", fla)
    monkeypatch.setitem(sys.modules, "fla.layers", layers)


def test_fla_layers_are_wrapped(fake_fla):
    """``fla:<Layer>``: ``hidden_size`` = d_model, ``num_heads`` (default 4) and ``head_dim`` = d_model / heads
    only where the layer takes them, other options to its constructor; the output tuple unwrapped; a bad option or layer name is one line."""
    m = build_mixer("fla:FakeLayer", 8, mode="fused_recurrent")
    assert (m.layer.num_heads, m.layer.head_dim) == (4, 2) and m.requires_cuda and m.graph_capturable is False
    assert build_mixer("fla:FakeLayer", 8, num_heads=2, head_dim=8).layer.head_dim == 8
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(m(x), m.layer.proj(x))
    assert build_mixer("fla:NoHeads", 8)(x).shape == (2, 5, 8)
    with pytest.raises(ValueError, match="mixer 'fla:FakeLayer' with options {'mode': 'x'}: Not supported mode"):
        build_mixer("fla:FakeLayer", 8, mode="x")
    with pytest.raises(ValueError, match="fla.layers has no layer 'Nope'; its layers: FakeLayer, NoHeads"):
        build_mixer("fla:Nope", 8)


def test_fla_missing_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "fla", None)  # import fla raises ImportError
    with pytest.raises(ValueError, match=r"mixer 'fla:DeltaNet' needs flash-linear-attention: pip install"):
        build_mixer("fla:DeltaNet", 8)


def test_a_gpu_only_mixer_is_refused_on_the_cpu_before_anything_is_stored(fake_fla, tmp_path):
    """The up-front check runs on the trials' device: on a CPU an fla layer (``requires_cuda``) or a mixer
    whose forward fails in a Triton kernel gets ``needs a CUDA GPU``; the sweep stores nothing."""
    spec = TrialSpec(task="parity", model=ModelShape(mixer="fla:FakeLayer"), lr=1e-3, seed=0, device="cpu")
    with pytest.raises(ValueError, match=r"^mixer 'fla:FakeLayer' needs a CUDA GPU: FLALayer runs Triton kernels"):
        validate_specs([("parity", spec)])
    sys.modules["gpu_only_mod"] = types.SimpleNamespace(
        factory=lambda d_model, **kw: _FakeLayer(d_model, gpu_only=True)
    )
    try:
        spec = TrialSpec(task="parity", model=ModelShape(mixer="gpu_only_mod:factory"), lr=1e-3, seed=0, device="cpu")
        with pytest.raises(ValueError, match=r"^mixer 'gpu_only_mod:factory' needs a CUDA GPU: Pointer argument"):
            validate_specs([("parity", spec)])
    finally:
        del sys.modules["gpu_only_mod"]
    out = tmp_path / "run"
    assert (
        sweep.main(["parity", "--preset", "smoke", "--mixers", "fla:FakeLayer", "--device", "cpu", "--out", str(out)])
        == 2
    )
    assert not (out / "journal.log").exists()


class _NoBackward(torch.autograd.Function):
    """The identity forward; a backward that refuses, as fla's gated chunk kernels on some GPUs."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("this kernel's backward is wrong with this compiler; upgrade it\nsecond line")


class _NoBackwardMixer(torch.nn.Module):
    def __init__(self, d_model, **_):
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        return _NoBackward.apply(self.proj(x))


def test_a_mixer_whose_backward_fails_is_refused_up_front():
    sys.modules["no_backward_mod"] = types.SimpleNamespace(NoBackward=_NoBackwardMixer)
    try:
        spec = TrialSpec(
            task="parity", model=ModelShape(mixer="no_backward_mod:NoBackward"), lr=1e-3, seed=0, device="cpu"
        )
        with pytest.raises(
            ValueError,
            match=r"^mixer 'no_backward_mod:NoBackward': this kernel's "
            r"backward is wrong with this compiler; upgrade it$",
        ):
            validate_specs([("parity", spec)])
    finally:
        del sys.modules["no_backward_mod"]


def test_mixer_option_reaches_every_mixer(tmp_path, capsys):
    """``--mixer-option KEY=VALUE`` goes to each mixer's constructor: an option a mixer rejects is one line."""
    code = sweep.main(
        ["parity", "--preset", "smoke", "--mixers", "gru", "--mixer-option", "no_such=1", "--out", str(tmp_path / "r")]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such" in err[0], err


@pytest.mark.parametrize("block", ["mixer", "full"])
def test_deep_models_stack_trial_by_trial(block):
    """``--stack``: two 2-layer models stacked compute what each computes alone."""
    from mixers.stacking import stack_trials

    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(
            SequenceModel(
                ModelConfig(16, 5, mixer="flashgru", block=block, d_model=16, layers=2, mixer_options={"num_heads": 2})
            )
        )
    stacked = stack_trials(models)
    tokens = torch.randint(0, 16, (2, 3, 7))
    out = stacked(tokens)
    for s, model in enumerate(models):
        torch.testing.assert_close(out[s], model(tokens[s]), rtol=1e-5, atol=1e-5)


def test_one_layer_initializes_as_the_single_layer_model_did():
    """Same seed, same weights as the paper model built in its original order (mixer, then embedding,
    norms and head), so results of earlier studies stay reproducible at ``layers = 1``."""
    torch.manual_seed(3)
    model = SequenceModel(ModelConfig(16, 5, mixer="gru", d_model=16, mixer_options={"num_heads": 2}))
    torch.manual_seed(3)
    mixer = build_mixer("gru", 16, num_heads=2)
    embedding, head = nn.Embedding(16, 16), nn.Linear(16, 5, bias=False)
    torch.testing.assert_close(model.embedding.weight, embedding.weight)
    torch.testing.assert_close(model.head.weight, head.weight)
    for (name, p), q in zip(model.block.named_parameters(), mixer.parameters()):
        torch.testing.assert_close(p, q, msg=name)


@pytest.mark.parametrize("engine", ["eager", "graph"])
def test_cosine_to_a_floor_and_gradient_clipping(engine):
    """``min_lr``: the schedule ends at ``min_lr`` (device and float forms agree step by step);
    ``grad_clip``: the update sees a gradient of global norm at most ``grad_clip`` (eager steps: Lightning's
    ``configure_gradient_clipping``; captured steps: inside the step's closure)."""
    from experiments.trial.captured import cosine_with_warmup_tensor
    from experiments.trial.lit import cosine_with_warmup
    from experiments.trial.train import build_datamodule, build_module

    floor = 1e-6 / 1e-2
    values = cosine_with_warmup_tensor(torch.arange(101), 10, 100, floor)
    assert [float(v) for v in values] == pytest.approx(
        [cosine_with_warmup(t, 10, 100, floor) for t in range(101)], rel=1e-4, abs=1e-7
    )
    assert float(values[-1]) == pytest.approx(floor)
    spec = TrialSpec(
        task="parity",
        model=ModelShape(mixer="gru"),
        lr=1e-2,
        seed=0,
        task_options={"seq_len": 8},
        train=TrainConfig(
            max_steps=5, batch_size=8, train_size=64, val_size=16, test_size=16, grad_clip=1e-3, min_lr=1e-6
        ),
    )
    dm = build_datamodule(spec)
    dm.setup("fit")
    module = build_module(spec, dm, engine)
    assert module.min_ratio == pytest.approx(1e-4)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
    tokens, targets = dm.data["train"].inputs[:8], dm.data["train"].targets[:8]
    if engine == "graph":
        module.training_closure(optimizer, tokens, targets)
    else:
        module.trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
        module.loss(module(tokens), targets).backward()
        module.configure_gradient_clipping(optimizer)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters() if p.grad is not None]))
    assert 0 < float(norm) <= 1e-3 * (1 + 1e-5)


def test_the_up_front_check_builds_each_distinct_model_once_and_logs_slow_checks(monkeypatch, caplog):
    """Cells that differ only in seed or lr share one check; a check slower than ``SLOW_CHECK_S`` (here
    every one) is logged with its model and time, and so is the whole check."""
    import experiments.sweeps.runner as runner

    built = []
    monkeypatch.setattr(runner, "_check_model", lambda spec: built.append(spec))
    monkeypatch.setattr(runner, "SLOW_CHECK_S", -1.0)
    cells = [
        (
            "parity",
            TrialSpec(task="parity", model=ModelShape(mixer=mixer, layers=layers), lr=lr, seed=seed, device="cpu"),
        )
        for mixer in ("gru", "elman")
        for layers in (1, 2)
        for lr in (1e-3, 3e-3)
        for seed in (0, 1, 2)
    ]
    with caplog.at_level("INFO", logger="experiments.sweeps.runner"):
        validate_specs(cells)
    assert sorted((s.model.mixer, s.model.layers) for s in built) == [
        ("elman", 1),
        ("elman", 2),
        ("gru", 1),
        ("gru", 2),
    ]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("checked model 1/4 (gru, 1 layer, parity) on cpu in ")
    assert lines[1].startswith("checked model 2/4 (gru, 2 layers, parity) on cpu in ")
    assert lines[-1].startswith("checked 4 distinct models in ")
    assert len(lines) == 5


def test_the_up_front_check_tells_models_apart_by_every_shape_field(monkeypatch):
    """Two cells whose models differ in any one ``ModelShape`` field (the width too) are two checks: each
    field changed from the base gives one model more; the same model at another seed and lr none."""
    import experiments.sweeps.runner as runner

    built = []
    monkeypatch.setattr(runner, "_check_model", lambda spec: built.append(spec.model))
    base = ModelShape(mixer="gru", block="mixer")
    other = {
        "mixer": "elman",
        "mixer_options": {"num_heads": 2},
        "block": "full",
        "positional": "sinusoidal",
        "layers": 3,
        "d_model": 48,
        "conv_kernel": 2,
        "precision": "bf16-mixed",
        "mlp_ratio": 2,
    }
    assert set(other) == set(ModelShape.field_names())  # a new field belongs here too
    shapes = [base, *(dataclasses.replace(base, **{k: v}) for k, v in other.items())]
    cells = [
        ("parity", TrialSpec(task="parity", model=m, lr=lr, seed=s, device="cpu"))
        for m in shapes
        for s, lr in ((0, 1e-3), (1, 3e-3))
    ]
    validate_specs(cells)
    assert built == shapes
