"""analysis.transfer reproduces paper 002's facts about the mLSTM transfer gains (§4.2, App. D.2).

Small problem (T=64, d=32, 21 x 6 grid) so it runs in well under a second; the committed figure
uses the paper's T=512, d=128, 21 x 18 grid, where the same facts hold (see the README, "Analysis").
"""

import math

import numpy as np
import pytest
import torch

from analysis.cli import run
from analysis.transfer import gains, hidden_states, main, random_inputs, select, transfer_gains, transition

EPS = (1e-2, 1e-6, 1e-8)


@pytest.fixture(scope="module")
def table():
    return transfer_gains(["exp", "sig", "sig-max1", "exp-abs", "sig-abs"], EPS, n_i=21, n_f=6, T=64, d_qk=32, d_v=32)


def _grid(df, variant, eps):
    return select(df, variant, "after", eps).pivot(index="i_pre", columns="f_pre", values="gain").sort_index()


def test_gains_by_hand():
    h = torch.tensor([[3.0, -4.0], [0.5, 0.25]])  # (T=2, d=2)
    v = torch.tensor([[1.0, -2.0], [0.5, 0.1]])
    assert gains(h, v).item() == pytest.approx((4 / 2 + 0.5 / 0.5) / 2)
    eps = 0.5
    rms = [math.sqrt((9 + 16) / 2 + eps), math.sqrt((0.25 + 0.0625) / 2 + eps)]
    assert gains(h, v, eps).item() == pytest.approx((4 / rms[0] / 2 + 0.5 / rms[1] / 0.5) / 2)


def test_transition_interpolates():
    import pandas as pd

    df = pd.DataFrame(
        {
            "i_pre": [-2.0, -1.0, 0.0, -2.0, -1.0, 0.0],
            "f_pre": [0, 0, 0, 1, 1, 1],
            "gain": [0.2, 0.4, 0.8, 0.1, 0.2, 0.3],
        }
    )
    t = transition(df)
    assert t[0] == pytest.approx(-1.0 + 0.1 / 0.4) and math.isnan(t[1])


def test_sig_hidden_states_match_closed_form():
    """Constant gates: h_t = sum_{j<=t} sigmoid(i) sigmoid(f)^(t-j) (q_t.k_j / sqrt(d)) v_j (eq. 22-23)."""
    T, d = 7, 4
    q, k, v = random_inputs(T, d, d, seed=3, dtype=torch.float64)
    i_vals, f_vals = torch.tensor([-3.0, 1.0], dtype=torch.float64), torch.tensor([0.5, 4.0], dtype=torch.float64)
    h = hidden_states("sig", q, k, v, i_vals, f_vals)
    for a, i in enumerate(i_vals):
        for b, f in enumerate(f_vals):
            si, sf = torch.sigmoid(i), torch.sigmoid(f)
            for t in range(T):
                want = sum(si * sf ** (t - j) * (q[t] @ k[j]) / math.sqrt(d) * v[j] for j in range(t + 1))
                torch.testing.assert_close(h[a, b, t], want, rtol=1e-10, atol=1e-12)


def test_exp_and_sig_agree_after_the_norm(table):
    """Fig. 3: after the norm mLSTMexp (normalizer + max state) and mLSTMsig (none) give the same gains."""
    for eps in (1e-6, 1e-8):
        diff = (_grid(table, "exp", eps) - _grid(table, "sig", eps)).abs().to_numpy()
        assert diff.max() < 5e-3, (eps, diff.max())
    # before the norm they differ (the exp normalizer bounds the output, sig grows with the forget gate)
    before = select(table, "exp", "before").gain.to_numpy() - select(table, "sig", "before").gain.to_numpy()
    assert np.abs(before).max() > 0.5


def test_suppress_then_pass_with_transition_near_minus_8(table):
    for variant in ("exp", "sig"):
        g = _grid(table, variant, 1e-6)
        assert g.loc[-12.0].max() < 0.1  # suppressed: gain ~ 0 at input gate -12, for every forget gate
        above = g.loc[g.index >= -4.0].to_numpy()
        assert above.min() > 0.9 and above.max() < 1.15  # passed: gain ~ 1
        t = transition(select(table, variant, "after", 1e-6))
        assert t.between(-10.5, -6.5).all(), t.to_dict()  # the paper: transition "around -8"
        assert -9.0 <= t.median() <= -7.0


def test_larger_eps_shifts_the_transition_up(table):
    """Fig. 6a / 7a: a larger ε moves the transition to larger input gates. For i << 0, sigmoid(i) ~ exp(i)
    and the gain depends on exp(2i) / ε, so ε -> c ε shifts the transition by ln(c) / 2."""
    for variant in ("exp", "sig"):
        t2, t6, t8 = (transition(select(table, variant, "after", e)) for e in EPS)
        assert ((t2 - t6) - 0.5 * math.log(1e4)).abs().max() < 0.5, (t2 - t6).to_dict()
        assert (t8 < t6 - 1.5).all()
        finite = np.isfinite(t8)
        assert ((t6 - t8)[finite] - 0.5 * math.log(1e2)).abs().max() < 0.5


def test_normalizer_variants(table):
    """App. D.2: a normalizer bounded by 1 leaves mLSTMsig unchanged (Fig. 7b); |n.q| alone removes the
    input-gate dependence (nothing is suppressed)."""
    assert (_grid(table, "sig-max1", 1e-6) - _grid(table, "sig", 1e-6)).abs().to_numpy().max() < 1e-3
    for variant in ("exp-abs", "sig-abs"):
        assert _grid(table, variant, 1e-6).to_numpy().min() > 0.9


@pytest.mark.slow
def test_cli_small(tmp_path):
    main(["--grid", "5x4", "--T", "16", "--d", "8", "--variants", "exp,sig", "--eps", "1e-6", "--out", str(tmp_path)])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"transfer-{k}.{e}" for k in ("fig3", "variants") for e in ("csv", "pdf", "png")]


def test_cli_bad_variant(tmp_path, capsys):
    assert run(main, ["--variants", "exp,nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown variant(s) nope" in err and "sig-max1" in err


def test_the_colour_bar_says_when_it_clips_small_gains(table):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.transfer import LOG_FLOOR, heatmaps

    before = table[(table["stage"] == "before") & table["variant"].isin(["exp", "sig"])]
    smallest = before["gain"][before["gain"] > 0].min()
    fig = heatmaps(table, ["exp", "sig"], [("before", None), ("after", 1e-6)], "t")
    labels = [ax.get_xlabel() for ax in fig.axes if "gain before the norm" in ax.get_xlabel()]
    plt.close(fig)
    assert len(labels) == 1
    assert smallest < LOG_FLOOR  # this grid reaches below the floor: the label names the clipping
    assert f"values below {LOG_FLOOR:g} (down to {smallest:.1e}) drawn at {LOG_FLOOR:g}" in labels[0]
    lifted = table.assign(gain=table["gain"].where(table["stage"] != "before", table["gain"].clip(lower=LOG_FLOOR)))
    fig = heatmaps(lifted, ["exp", "sig"], [("before", None), ("after", 1e-6)], "t")
    labels = [ax.get_xlabel() for ax in fig.axes if "gain before the norm" in ax.get_xlabel()]
    plt.close(fig)
    assert labels == ["gain before the norm (log scale)"]  # nothing clipped: nothing said
