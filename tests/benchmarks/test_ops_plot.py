"""benchmarks.ops.plot on synthetic results written by benchmarks.ops.common.write_json."""

import json
import math
import sys

import pandas as pd
import pytest

from analysis.cli import run
from benchmarks.ops.common import BenchRow, write_json
from benchmarks.ops.plot import load_bench, main, merge_batch_sweeps


@pytest.fixture
def bench_json(tmp_path):
    rows = []
    for S in (1024, 2048, 4096):
        dims = {"batch": 8, "heads": 8, "length": S, "qk_dim": 128, "v_dim": 128}
        for impl, per_token in (("ours", 1e-3), ("peer", 2e-3)):
            for direction, factor in (("fwd", 1.0), ("fwd+bwd", 3.0)):
                rows.append(
                    BenchRow(
                        "mlstm",
                        impl,
                        direction,
                        "bfloat16",
                        dims,
                        per_token * factor * S,
                        limit_ms=0.25e-3 * factor * S,
                    )
                )
    rows.append(
        BenchRow(
            "mlstm",
            "slow-peer",
            "fwd",
            "bfloat16",
            {"batch": 8, "heads": 8, "length": 4096, "qk_dim": 128, "v_dim": 128},
            math.nan,
            note="skipped",
        )
    )
    rows.append(BenchRow("mlstm", "ours", "fwd", "bfloat16", {"batch": 8}, 1.0, note="no length"))
    env = {"device": "Test GPU", "date": "2025-01-01T00:00:00+00:00", "commit": "abc123"}
    return write_json("mlstm", rows, env, out_dir=tmp_path / "results")


def test_write_json_flattens_dimensions(bench_json):
    data = json.loads(bench_json.read_text())
    assert bench_json.name == "mlstm.json"
    first = data["rows"][0]
    assert first["length"] == 1024 and first["qk_dim"] == 128 and "dims" not in first and "shape" not in first


def test_load_bench(bench_json):
    df, env = load_bench(bench_json)
    assert env["device"] == "Test GPU" and len(df) == 14
    timed = df[df["L"].notna()]
    assert set(timed["config"]) == {"batch=8 heads=8 qk_dim=128 v_dim=128"}
    assert sorted(set(timed["L"])) == [1024, 2048, 4096]


@pytest.mark.slow
def test_cli_plots_every_timed_row(bench_json, tmp_path):
    paths = main([str(bench_json), "--out", str(tmp_path / "fig")])
    assert [p.suffix for p in paths] == [".png", ".pdf", ".csv"] and paths[0].stat().st_size > 10_000
    csv = pd.read_csv(paths[2])
    assert len(csv) == 12 and "slow-peer" not in set(csv["impl"])  # rows without a time or a length are left out
    ours = csv[(csv["impl"] == "ours") & (csv["direction"] == "fwd+bwd")].sort_values("L")
    assert ours["ms"].tolist() == pytest.approx([3e-3 * S for S in (1024, 2048, 4096)])
    assert ours["limit_ms"].tolist() == pytest.approx([0.75e-3 * S for S in (1024, 2048, 4096)])
    only = main([str(bench_json), "--out", str(tmp_path / "f2"), "--direction", "fwd", "--impls", "^ours$"])
    assert len(pd.read_csv(only[2])) == 3


def test_constant_token_grid_is_one_line(tmp_path):
    rows = [
        BenchRow("mlstm", "ours", "fwd", "bfloat16", {"batch": B, "heads": 8, "length": S}, 1.0 + S / 1e4)
        for B, S in ((32, 2048), (8, 8192), (1, 65536))
    ]
    rows.append(BenchRow("mlstm", "ours", "fwd", "bfloat16", {"batch": 4, "heads": 4, "length": 512}, 0.5))
    rows.append(
        BenchRow("mlstm", "ours", "fwd", "bfloat16", {"batch": 2, "heads": 2, "length": 64}, 0.1, section="chunk")
    )
    df, _ = load_bench(write_json("mlstm", rows, {"device": "x", "date": "2025"}, out_dir=tmp_path))
    assert merge_batch_sweeps(df).tolist() == ["heads=8 (batch varies)"] * 3 + [
        "batch=4 heads=4",
        "batch=2 heads=2 [chunk]",
    ]


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


@pytest.mark.slow
def test_benchmark_commit_says_when_the_files_differ(tmp_path):
    """``git_commit`` names the checkout's commit, with ``-dirty`` once a tracked file differs from it
    (a device copy whose ``.git`` is older than its files must not pass for that commit)."""
    import shutil
    import subprocess

    from benchmarks.ops import common

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    shutil.copy(common.__file__, repo / "pkg" / "common.py")

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = git("rev-parse", "--short=7", "HEAD")
    run = [sys.executable, "-c", "import common; print(common.git_commit())"]
    assert subprocess.run(run, cwd=repo / "pkg", capture_output=True, text=True).stdout.strip() == head
    (repo / "pkg" / "common.py").write_text((repo / "pkg" / "common.py").read_text() + "\n# changed\n")
    assert subprocess.run(run, cwd=repo / "pkg", capture_output=True, text=True).stdout.strip() == f"{head}-dirty"
