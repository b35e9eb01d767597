"""The committed kernel summary (``benchmarks/ops/results/summary.md``) is what ``python -m benchmarks.ops
summary`` prints from the committed results files: regenerate it when a ``<family>.json`` changes."""

from pathlib import Path

import pytest

from benchmarks.ops.summary import against, headline, main

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "ops" / "results"


def test_committed_summary_is_generated_from_the_results(capsys):
    main([str(RESULTS)])
    assert capsys.readouterr().out == (RESULTS / "summary.md").read_text(), (
        "regenerate: python -m benchmarks.ops summary > benchmarks/ops/results/summary.md"
    )


def _row(impl, ms, graph_ms=None):
    extra = {} if graph_ms is None else {"graph_ms": graph_ms}
    return {"family": "delta", "section": "main", "kind": "gated", "batch": 2, "impl": impl, "direction": "fwd",
            "dtype": "fp32", "ms": ms, "extra": extra}  # fmt: skip


def test_headline_compares_replays_where_every_row_has_one():
    """Replays (``extra.graph_ms``) decide the fastest and the ratio where every row of a problem has one;
    one row without a replay leaves the whole problem on eager times."""
    rows = [_row("ours-triton", 1.0, 0.5), _row("ours-triton-chunk", 0.9, 0.7), _row("fla", 2.0, 0.25)]
    ((*_, timed, ours, ours_ms, peer, peer_ms, _note),) = headline(rows)
    assert (timed, ours, ours_ms, peer, peer_ms) == ("replay", "ours-triton", 0.5, "fla", 0.25)
    rows.append(_row("fla-recurrent", 1.5))
    ((*_, timed, ours, ours_ms, peer, peer_ms, _note),) = headline(rows)
    assert (timed, ours, ours_ms, peer, peer_ms) == ("eager", "ours-triton-chunk", 0.9, "fla-recurrent", 1.5)


def test_against_pairs_rows_of_the_same_implementation_and_problem():
    """``--baseline``: each row against the same implementation at the same problem in the other run,
    replays where both have one; rows of other problems or implementations stay unpaired."""
    here = [_row("ours-triton", 1.0, 0.5), _row("ours-triton-chunk", 0.9), _row("fla", 2.0, 0.3)]
    other_problem = dict(_row("ours-triton", 9.0, 9.0), batch=3)
    base = [_row("ours-triton", 1.2, 0.8), _row("ours-triton-chunk", 0.6, 0.4), other_problem]
    table = against(here, base).set_index("impl")
    assert sorted(table.index) == ["ours-triton", "ours-triton-chunk"]
    assert table.loc["ours-triton", ["timed", "ms", "baseline ms", "ms / baseline"]].tolist() == [
        "replay",
        0.5,
        0.8,
        "0.625",
    ]
    # one side without a replay: both on eager times
    assert table.loc["ours-triton-chunk", ["timed", "ms", "baseline ms", "ms / baseline"]].tolist() == [
        "eager",
        0.9,
        0.6,
        "1.500",
    ]


def test_baseline_without_common_results_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="no family has results in both"):
        main([str(RESULTS), "--baseline", str(tmp_path)])
