"""Every task's labels recomputed by brute force (Python loops over the definition)."""

import pytest
import torch

from tasks import IGNORE_INDEX, get_task

N = 64  # samples per check: fresh seeds each run of the grid below


def brute_parity(x, running):
    out, acc = [], 0
    for t, bit in enumerate(x):
        acc ^= bit
        out.append(acc if running or t == len(x) - 1 else IGNORE_INDEX)
    return out


def brute_keep_nth(x, n, per_position):
    out = []
    for t in range(1, len(x) + 1):  # 1-based position
        scored = t >= n if per_position else t == len(x)
        out.append(x[n - 1] if scored else IGNORE_INDEX)
    return out


def brute_khop(x, v, k, mask_none):
    def tau(p):
        for q in range(p - 1, -1, -1):
            if x[q] == x[p]:
                return q + 1
        return None

    out = []
    for i in range(len(x)):
        pos = i
        for _ in range(k):
            pos = tau(pos) if pos is not None else None
        out.append(x[pos] if pos is not None else (IGNORE_INDEX if mask_none else v))
    return out


def check_mqar_sample(x, y, cfg):
    kappa, v = cfg.num_kv_pairs, cfg.vocab_size
    keys, values = x[0 : 2 * kappa : 2], x[1 : 2 * kappa : 2]
    assert len(set(keys)) == kappa and len(set(values)) == kappa
    assert all(1 <= k < v // 2 for k in keys) and all(v // 2 <= val < v for val in values)
    pair = dict(zip(keys, values))
    assert y[: 2 * kappa] == [IGNORE_INDEX] * (2 * kappa)
    queried = set()
    for tok, tgt in zip(x[2 * kappa :], y[2 * kappa :]):
        if tok in pair:  # any context key after the context is a query
            assert tgt == pair[tok]
            queried.add(tok)
        else:
            assert tgt == IGNORE_INDEX
    assert queried == set(keys), "every key is queried at least once"


@pytest.mark.parametrize("running", [False, True])
@pytest.mark.parametrize("seq_len", [1, 7, 100])
def test_parity(running, seq_len):
    task = get_task("parity", seq_len=seq_len, running=running)
    d = task.generate(N, seed=seq_len + running)
    assert d.inputs.max() <= 1 and d.inputs.min() >= 0
    for x, y in zip(d.inputs.tolist(), d.targets.tolist()):
        assert y == brute_parity(x, running)


@pytest.mark.parametrize("per_position", [False, True])
@pytest.mark.parametrize("seq_len,n,v", [(100, 5, 128), (9, 9, 3), (1, 1, 2), (13, 1, 7), (37, 23, 5)])
def test_keep_nth(seq_len, n, v, per_position):
    d = get_task("keep_nth", seq_len=seq_len, n=n, vocab_size=v, per_position=per_position).generate(
        N, seed=seq_len + n
    )
    assert d.inputs.max() < v
    for x, y in zip(d.inputs.tolist(), d.targets.tolist()):
        assert y == brute_keep_nth(x, n, per_position)


def test_keep_nth_readings_share_inputs_and_last_target():
    """Same seed, same tokens; the per-position reading scores L - n + 1 positions, the last as the literal one."""
    last = get_task("keep_nth", seq_len=11, n=4).generate(32, seed=9)
    dense = get_task("keep_nth", seq_len=11, n=4, per_position=True).generate(32, seed=9)
    assert torch.equal(last.inputs, dense.inputs) and torch.equal(last.targets[:, -1], dense.targets[:, -1])
    assert ((dense.targets != IGNORE_INDEX).sum(1) == 11 - 4 + 1).all()


@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"num_kv_pairs": 8, "seq_len": 64},
        {"num_kv_pairs": 1, "seq_len": 3, "vocab_size": 4},
        {"placement": "power"},
        {"query_rate": 0.0, "seq_len": 17},
        {"query_rate": 1.0},
    ],
)
def test_mqar(opts):
    task = get_task("mqar", **opts)
    d = task.generate(N, seed=5)
    assert d.inputs.max() < task.vocab_size
    for x, y in zip(d.inputs.tolist(), d.targets.tolist()):
        check_mqar_sample(x, y, task.config)


def test_mqar_noise_never_a_context_key_and_query_rate():
    task = get_task("mqar", seq_len=200, query_rate=0.25)
    d = task.generate(500, seed=11)
    rest = d.targets[:, 4:]
    rate = (rest != IGNORE_INDEX).float().mean().item()
    assert 0.22 < rate < 0.30  # 0.25 plus the forced queries


def test_mqar_power_placement_concentrates_queries_early():
    d = get_task("mqar", placement="power").generate(2000, seed=1)
    pos = (d.targets[:, 4:] != IGNORE_INDEX).nonzero()[:, 1].float()
    assert pos.median() < 20  # power law (a=0.01) puts most queries right after the context


@pytest.mark.parametrize(
    "opts",
    [
        {"k": 1},
        {"k": 2},
        {"k": 3, "vocab_size": 4},
        {"k": 1, "mask_none": True},
        {"k": 2, "mask_none": True, "seq_len": 31},
        {"k": 2, "seq_len": 2},
    ],
)
def test_khop(opts):
    task = get_task("khop", **opts)
    d = task.generate(N, seed=7)
    assert (d.inputs[:, 1:] != d.inputs[:, :-1]).all(), "no immediate repeats"
    for x, y in zip(d.inputs.tolist(), d.targets.tolist()):
        assert y == brute_khop(x, task.vocab_size, task.config.k, task.config.mask_none)


def test_khop_spec_example():
    from tasks.khop import hop_targets

    x = torch.tensor([[0, 1, 2, 0, 2, 1, 0, 1]])
    assert hop_targets(x, 3, 1).tolist() == [[-1, -1, -1, 1, 0, 2, 2, 0]]
    assert hop_targets(x, 3, 2).tolist() == [[-1, -1, -1, -1, 1, -1, 0, 2]]


def test_classes_and_vocab():
    assert (get_task("khop", k=1).vocab_size, get_task("khop", k=1).num_classes) == (10, 11)
    assert (get_task("khop", k=2).vocab_size, get_task("khop", k=2, mask_none=True).num_classes) == (5, 5)
    assert get_task("mqar").num_classes == 128 and get_task("parity").num_classes == 2
