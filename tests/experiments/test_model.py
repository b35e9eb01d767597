"""The model: shapes, causality of every registered mixer in both blocks, parameter counts."""

import pytest
import torch

import mixers
from experiments.paper import parameter_counts
from experiments.trial.model import FullBlock, ModelConfig, SequenceModel, count_parameters


@pytest.mark.parametrize("preset", ["pararnn-table6", "pararnn-table6-literal"])
def test_paper_presets_have_the_papers_parameter_counts(preset):
    """Every cell's model, built from the preset as its trials build it, within 1% of paper 000 Table 6
    or within its rounding (the paper gives 0.1k: 3,840 is "3.8k"). Table: python -m experiments.paper PRESET."""
    rows = [r for r in parameter_counts(preset).to_dict(orient="records") if "layers" not in r["mixer"]]  # departures
    assert len(rows) == 20 and all(r["paper"] for r in rows)
    far = [r for r in rows if abs(r["ours"] - r["paper"]) > max(0.01 * r["paper"], 50)]
    assert not far, far


def test_paper_parameter_counts_piece_by_piece():
    """FlashGRU on MQAR (paper 32.7k): embedding + block + the two RMSNorm weights + head, no bias."""
    v, d = 128, 64
    model = SequenceModel(ModelConfig(v, v, mixer="flashgru", block="full"))
    cell = 4 * (3 * 16 * 16 + 3 * 16 + 3 * 16)
    block = 2 * d * d + d * 4 + d + cell + d + d * d + d  # in_proj, conv (+bias), cell, norm, out_proj, skip
    assert count_parameters(model) == v * d + d + block + d + d * v == 32_704
    assert model.head.bias is None
    assert (
        count_parameters(SequenceModel(ModelConfig(v, v, mixer="flashgru", block="full", head_bias=True))) == 32_704 + v
    )


def test_transformer_positions():
    """Learned positions: max_len x d parameters, absolute, and a clear error past max_len or without
    it. On a sequence of one repeated vector RoPE (relative) gives the same output at every position
    (attention averages equal values), absolute positions (learned, sinusoidal) do not."""
    torch.manual_seed(0)
    base = {"num_heads": 4, "mlp_ratio": 1}
    learned = mixers.build_mixer("transformer", 16, positions="learned", max_len=12, **base)
    rope = mixers.build_mixer("transformer", 16, positions="rope", **base)
    sinusoidal = mixers.build_mixer("transformer", 16, positions="sinusoidal", **base)
    assert count_parameters(learned) - count_parameters(rope) == 12 * 16
    assert (
        count_parameters(mixers.build_mixer("transformer", 16, bias=True, **base)) - count_parameters(rope)
        == 3 * 16 + 16 + 16 + 16
    )
    x = torch.randn(1, 1, 16).expand(1, 10, 16)
    with torch.no_grad():
        y = rope(x)
        torch.testing.assert_close(y, y[:, :1].expand_as(y), rtol=1e-5, atol=1e-5)
        for absolute in (learned, sinusoidal):
            y = absolute(x)
            assert (y - y[:, :1]).abs().amax(dim=-1)[0, 1:].min() > 1e-3
    with pytest.raises(ValueError, match="max_len=12"):
        learned(torch.randn(1, 13, 16))
    with pytest.raises(ValueError, match="max_len"):
        mixers.build_mixer("transformer", 16, positions="learned")


@pytest.mark.parametrize("block", ["mixer", "full"])
@pytest.mark.parametrize("name", sorted(mixers.MIXERS))
def test_every_mixer_is_causal_in_both_blocks(name, block):
    torch.manual_seed(0)
    model = SequenceModel(ModelConfig(16, 5, mixer=name, block=block, d_model=32, mixer_options={"num_heads": 2}))
    tokens = torch.randint(0, 16, (2, 9))
    out = model(tokens)
    assert out.shape == (2, 9, 5) and torch.isfinite(out).all()
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 16
    out2 = model(changed)
    assert torch.allclose(out[:, :5], out2[:, :5], atol=1e-5), "future tokens changed past outputs"
    assert not torch.allclose(out[:, 5:], out2[:, 5:]), "the changed token had no effect"


def test_full_block_structure_and_positions():
    m = SequenceModel(ModelConfig(10, 11, mixer="gru", block="full"))
    assert isinstance(m.block, FullBlock) and m.mixer is m.block.mixer
    t = SequenceModel(ModelConfig(10, 11, mixer="transformer", block="full", positional="sinusoidal"))
    assert not isinstance(t.block, FullBlock) and not t.add_positions  # attention brings its own RoPE
    k = SequenceModel(ModelConfig(10, 11, mixer="gru", positional="sinusoidal"))
    assert k.add_positions


def test_full_block_without_convolution():
    """``conv_kernel=0``: the mixer takes ``in_proj``'s ``u`` directly (no convolution, no SiLU on it),
    the block computes ``out_proj(norm(mixer(u)) * silu(z)) + skip * x`` and has the conv's ``d * 4 + d``
    parameters fewer than the default block; a conv-free block is causal too."""
    torch.manual_seed(3)
    d = 24
    config = dict(vocab_size=11, num_classes=5, mixer="slstm", block="full", d_model=d, mixer_options={"num_heads": 2})
    plain = SequenceModel(ModelConfig(**config, conv_kernel=0)).double()
    assert plain.block.conv is None
    assert count_parameters(SequenceModel(ModelConfig(**config))) - count_parameters(plain) == d * 4 + d
    block = plain.block
    x = torch.randn(3, 13, d, dtype=torch.float64)
    u, z = block.in_proj(x).chunk(2, dim=-1)
    expected = block.out_proj(block.norm(block.mixer(u)) * torch.nn.functional.silu(z)) + block.skip_scale * x
    torch.testing.assert_close(block(x), expected)
    tokens = torch.randint(0, 11, (2, 9))
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 11
    out, out2 = plain(tokens), plain(changed)
    torch.testing.assert_close(out[:, :6], out2[:, :6])
    assert not torch.allclose(out[:, 6:], out2[:, 6:])


def test_bad_model_config():
    with pytest.raises(ValueError, match="block.*'fancy'"):
        ModelConfig(2, 2, block="fancy")
    with pytest.raises(ValueError, match="conv_kernel.*-1"):
        ModelConfig(2, 2, conv_kernel=-1)
    with pytest.raises(ValueError, match="'nope'"):
        SequenceModel(ModelConfig(2, 2, mixer="nope"))


@pytest.mark.parametrize("block", ["mixer", "full"])
def test_mlp_after_every_block(block):
    """``mlp_ratio``: after each layer's block, ``x + W2 gelu(W1 rmsnorm(x))`` (recomputed here from the
    weights, float64, awkward sizes), ``layers * (d + 2 d h)`` parameters more, still causal; 0 leaves the
    model and its initialization as they were."""
    d, ratio, layers = 12, 1.5, 2
    hidden = round(ratio * d)
    config = dict(vocab_size=7, num_classes=5, mixer="gru", block=block, d_model=d, layers=layers)
    torch.manual_seed(0)
    plain = SequenceModel(ModelConfig(**config))
    torch.manual_seed(0)
    model = SequenceModel(ModelConfig(**config, mlp_ratio=ratio)).double()
    assert count_parameters(model) - count_parameters(plain) == layers * (d + 2 * d * hidden)
    for name, p in plain.named_parameters():  # the rest of the model initialized as without the MLPs
        torch.testing.assert_close(p.double(), model.get_parameter(name))
    tokens = torch.randint(0, 7, (3, 11))

    def mlp(i, x):
        net = model.mlps[i].net
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * net[0].weight
        return x + torch.nn.functional.gelu(h @ net[1].weight.T) @ net[3].weight.T

    x = model.embedding(tokens)
    y = model.block(model.norm_in(x))
    x = mlp(0, x + y if model.residual_first else y)
    x = mlp(1, model.deeper[0](x))
    torch.testing.assert_close(model(tokens), model.head(model.norm_out(x)))
    later = tokens.clone()
    later[:, 6:] = (later[:, 6:] + 1) % 7
    torch.testing.assert_close(model(later)[:, :6], model(tokens)[:, :6])
    with pytest.raises(ValueError, match="mlp_ratio"):
        ModelConfig(**config, mlp_ratio=-1)
