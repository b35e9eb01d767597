"""Measured numbers live in one place: a generated report (``benchmarks/**/results``,
``benchmarks/reproduction/<preset>.md``) or the hand-written evidence beside it
(``benchmarks/reproduction/<preset>.evidence.md``, ``benchmarks/ops/results/<family>.evidence.md``).
The user docs state protocols and point there, so a measured-looking number (a decimal percentage
such as ``97.7%``, a time such as ``2.9 ms``) appears in at most one of them, and never restates a
number of a report or evidence file it links to."""

import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAND_WRITTEN = sorted(
    {ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"}
    | set(ROOT.glob("docs/*.md"))
    | set(ROOT.glob("seqkernels/*/README.md"))
    | {ROOT / "seqkernels" / "README.md"}
    | set(ROOT.glob("mixers/*.md"))
)
IDS = [str(d.relative_to(ROOT)) for d in HAND_WRITTEN]
MEASURED = re.compile(r"(?<![\w.])(\d+\.\d+)\s?(%|ms\b)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
#: numbers that are constants of a protocol, not measurements, and that several files state
ALLOWED = {
    "0.1%",  # the plateau stop: no gain of +0.1% in validation accuracy within the patience
    "99.9%",  # the early stop at validation accuracy > 0.999
}


#: the kernel and benchmark guides describe what is measured and by which command, and link the results
#: (``benchmarks/ops/results/summary.md``, ``<family>.json``, ``<family>.evidence.md``): they state no number
#: measured on a device at all
KERNEL_DOCS = sorted(
    {ROOT / "seqkernels" / "README.md", ROOT / "benchmarks" / "README.md"} | set(ROOT.glob("seqkernels/*/README.md"))
)
KERNEL_IDS = [str(d.relative_to(ROOT)) for d in KERNEL_DOCS]
#: a time in ms or µs (integers too), a decimal percentage, a decimal ratio such as ``0.89x``; a bound before
#: the number (``<= 0.8x flashrnn``) makes it a target, not a measurement
TIMING_OR_RATIO = re.compile(
    r"(?P<bound>(?:<=|>=|≤|≥|<|>)\s*)?(?<![\w.])(?P<value>\d+(?:\.\d+)?)\s?(?P<unit>%|(?:ms|µs|us|x)(?!\w))"
)
EVIDENCE = sorted((ROOT / "benchmarks" / "ops" / "results").glob("*.evidence.md"))


def measured_timings(text: str) -> set[str]:
    """The times, percentages and ratios of ``text`` that read as measured, written one way (``2.9 ms`` ->
    ``2.9ms``): not bounds, and percentages and ratios only with a decimal point (``12x the FLOPs`` is a
    constant of the problem)."""
    found = set()
    for m in TIMING_OR_RATIO.finditer(text):
        value, unit = m["value"], m["unit"]
        if m["bound"] or (unit in ("%", "x") and "." not in value):
            continue
        found.add(value + unit)
    return found - ALLOWED


def measured(text: str) -> set[str]:
    """The measured-looking numbers of ``text``, written one way (``97.7 %`` -> ``97.7%``)."""
    return {value + unit for value, unit in MEASURED.findall(text)} - ALLOWED


def linked_records(doc: Path) -> list[Path]:
    """The generated reports and evidence files ``doc`` links to: Markdown under ``benchmarks/reproduction/``
    or a ``results`` folder of ``benchmarks/``, and any ``*.evidence.md``."""
    records = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or not target.endswith(".md"):
            continue
        path = (doc.parent / target).resolve()
        if not path.is_file() or path.parent == ROOT:
            continue
        parts = path.relative_to(ROOT).parts
        generated = parts[0] == "benchmarks" and ("reproduction" in parts or "results" in parts)
        if generated or path.name.endswith(".evidence.md"):
            records.append(path)
    return records


def test_the_pattern_reads_decimal_percentages_and_milliseconds():
    text = "97.7% and 50.1 % right, 2.9 ms a check, 3 ms, 12% of 40, v1.2.3%, 0.1% gain, 1.5 msec"
    assert measured(text) == {"97.7%", "50.1%", "2.9ms"}


def test_no_measured_number_is_stated_in_two_docs():
    where = defaultdict(list)
    for doc in HAND_WRITTEN:
        for number in measured(doc.read_text()):
            where[number].append(str(doc.relative_to(ROOT)))
    repeated = {number: docs for number, docs in where.items() if len(docs) > 1}
    assert not repeated, f"measured numbers in more than one doc (keep each in its report): {repeated}"


@pytest.mark.parametrize("doc", HAND_WRITTEN, ids=IDS)
def test_a_doc_does_not_restate_the_numbers_of_what_it_links(doc):
    numbers = measured(doc.read_text())
    restated = {
        str(record.relative_to(ROOT)): sorted(numbers & measured(record.read_text())) for record in linked_records(doc)
    }
    restated = {record: both for record, both in restated.items() if both}
    assert not restated, f"{doc.relative_to(ROOT)} restates numbers of the files it links: {restated}"


def test_the_docs_link_the_reports():
    """The check above has something to compare: the reproduction guide links reports and their evidence."""
    linked = {p.name for p in linked_records(ROOT / "docs" / "reproduction.md")}
    assert "pararnn-table6.md" in linked and "pararnn-table6.evidence.md" in linked


def test_the_kernel_pattern_reads_times_percentages_and_ratios_but_not_targets():
    text = (
        "1109 ms loop, 18.2 µs, 9-12 us, 20.5% of it, 0.89x and 1.4-1.6x the peer; targets <= 0.8x flashrnn,"
        " <1.3x, 12x the FLOPs, 10x faster, 128 KiB, 12 B per element, 0.1% gain, 2 msec, 3x4 grid"
    )
    assert measured_timings(text) == {"1109ms", "18.2µs", "12us", "20.5%", "0.89x", "1.6x"}


@pytest.mark.parametrize("doc", KERNEL_DOCS, ids=KERNEL_IDS)
def test_the_kernel_guides_state_no_measured_timings(doc):
    found = measured_timings(doc.read_text())
    assert not found, (
        f"{doc.relative_to(ROOT)} states measured numbers {sorted(found)}: move them, with device, date and"
        " command, to benchmarks/ops/results/<family>.evidence.md and describe the result in words"
    )


@pytest.mark.parametrize("evidence", EVIDENCE, ids=[e.name for e in EVIDENCE])
def test_every_kernel_evidence_file_is_linked_from_a_guide(evidence):
    """An evidence file nobody links is lost: the guide that measures it points there."""
    linked = {record for doc in KERNEL_DOCS for record in linked_records(doc)}
    assert evidence in linked, f"no kernel guide links {evidence.relative_to(ROOT)}"
