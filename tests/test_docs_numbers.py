"""Measured numbers live in one place: a generated report (``benchmarks/**/results``,
``benchmarks/reproduction/<preset>.md``) or the hand-written evidence beside it
(``benchmarks/reproduction/<preset>.evidence.md``). The user docs state protocols and point there, so a
measured-looking number (a decimal percentage such as ``97.7%``, a time such as ``2.9 ms``) appears in at
most one of them, and never restates a number of a report or evidence file it links to."""

import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAND_WRITTEN = sorted(
    {ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"}
    | set(ROOT.glob("docs/*.md"))
    | set(ROOT.glob("kernels/*/README.md"))
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
