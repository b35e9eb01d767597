"""The committed kernel summary (``benchmarks/ops/results/summary.md``) is what ``python -m benchmarks.ops
summary`` prints from the committed results files: regenerate it when a ``<family>.json`` changes."""

from pathlib import Path

from benchmarks.ops.summary import main

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "ops" / "results"


def test_committed_summary_is_generated_from_the_results(capsys):
    main([str(RESULTS)])
    assert capsys.readouterr().out == (RESULTS / "summary.md").read_text(), (
        "regenerate: python -m benchmarks.ops summary > benchmarks/ops/results/summary.md"
    )
