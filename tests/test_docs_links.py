"""Every relative link and image in the README, CONTRIBUTING and the docs points to a file that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "kernels").glob("**/README.md"),
        *(ROOT / "benchmarks").glob("**/*.md"),
    ]
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links to missing files: {broken}"


def test_the_readme_mixer_table_names_every_registered_mixer():
    from mixers import MIXERS

    table = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])}
    assert sorted(set(MIXERS) - named) == []


def test_no_text_calls_the_models_single_layer_only():
    """Depth is a sweep axis (--layers): the package description and the sweep's --help say so."""
    from experiments.sweep import parser

    assert "single-layer models" not in (ROOT / "pyproject.toml").read_text()
    assert "single-layer models" not in parser().format_help()
