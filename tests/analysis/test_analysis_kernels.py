"""analysis.kernels on a synthetic benchmark JSON written by kernels.bench.common.write_json."""

import json
import math

import pandas as pd
import pytest

from analysis.cli import run
from analysis.kernels import load_bench, main, parse_length
from kernels.bench.common import BenchRow, write_json


@pytest.mark.parametrize("shape, extra, want", [
    ("B8 NH8 S4096 DQK128 DV128", None, (4096, "B8 NH8 DQK128 DV128")),
    ("B4 L2048 H8 P64 N64", None, (2048, "B4 H8 P64 N64")),
    ("lstm B16 T1024 12x64", None, (1024, "lstm B16 12x64")),
    ("B2 NH4 G16 D128 L64", None, (1024, "B2 NH4 D128 chunk 64")),
    ("gru B=8 L=512 D=256", None, (512, "gru B=8 D=256")),
    ("2x2 (8, 4096, 512)", None, (4096, "2x2 B8 D512")),
    ("custom", {"seq_len": 77}, (77, "custom")),
    ("fig5", {}, (None, "fig5")),
])
def test_parse_length(shape, extra, want):
    assert parse_length(shape, extra) == want


@pytest.fixture
def bench_json(tmp_path):
    rows = []
    for S in (1024, 2048, 4096):
        shape = f"B8 NH8 S{S} DQK128 DV128"
        for impl, per_token in (("ours", 1e-3), ("peer", 2e-3)):
            for direction, factor in (("fwd", 1.0), ("fwd+bwd", 3.0)):
                rows.append(BenchRow("mlstm", impl, shape, direction, "bfloat16", per_token * factor * S,
                                     limit_ms=0.25e-3 * factor * S))
    rows.append(BenchRow("mlstm", "slow-peer", "B8 NH8 S4096 DQK128 DV128", "fwd", "bfloat16", math.nan, note="skipped"))
    env = {"device": "Test GPU", "date": "2025-01-01T00:00:00+00:00", "commit": "abc123"}
    return write_json("mlstm", rows, env, out_dir=tmp_path / "benchmarks")


def test_load_bench(bench_json):
    df, env = load_bench(bench_json)
    assert env["device"] == "Test GPU" and len(df) == 13
    assert set(df["config"]) == {"B8 NH8 DQK128 DV128"} and sorted(set(df["L"])) == [1024, 2048, 4096]


def test_cli_plots_every_timed_row(bench_json, tmp_path):
    paths = main([str(bench_json), "--out", str(tmp_path / "fig")])
    assert [p.suffix for p in paths] == [".png", ".pdf", ".csv"] and paths[0].stat().st_size > 10_000
    csv = pd.read_csv(paths[2])
    assert len(csv) == 12 and "slow-peer" not in set(csv["impl"])  # the row without a time is left out
    ours = csv[(csv["impl"] == "ours") & (csv["direction"] == "fwd+bwd")].sort_values("L")
    assert ours["ms"].tolist() == pytest.approx([3e-3 * S for S in (1024, 2048, 4096)])
    assert ours["limit_ms"].tolist() == pytest.approx([0.75e-3 * S for S in (1024, 2048, 4096)])
    only = main([str(bench_json), "--out", str(tmp_path / "f2"), "--direction", "fwd", "--impls", "^ours$"])
    assert len(pd.read_csv(only[2])) == 3


def test_constant_token_grid_is_one_line(tmp_path):
    from analysis.kernels import merge_batch_sweeps

    rows = [BenchRow("mlstm", "ours", f"B{B} NH8 S{S} DQK128 DV128", "fwd", "bfloat16", 1.0 + S / 1e4)
            for B, S in ((32, 2048), (8, 8192), (1, 65536))]
    rows.append(BenchRow("mlstm", "ours", "B4 NH8 S512 DQK64 DV64", "fwd", "bfloat16", 0.5))
    df, _ = load_bench(write_json("mlstm", rows, {"device": "x", "date": "2025"}, out_dir=tmp_path))
    assert merge_batch_sweeps(df).tolist() == ["NH8 DQK128 DV128 (B varies)"] * 3 + ["B4 NH8 DQK64 DV64"]


def test_bad_json_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert run(main, [str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "is not JSON" in err and err.count("\n") == 1
    bad.write_text(json.dumps({"family": "x", "rows": [{"impl": "a"}]}))
    assert run(main, [str(bad)]) == 2
    assert "a row lacks" in capsys.readouterr().err
    assert run(main, [str(tmp_path / "missing.json")]) == 2
