"""What the Markdown files name exists: every relative link and image points to a file, every
``python -m X`` names a module, and every repository path in code (``tasks/...``, ``tests/...``, ...)
is a file or folder of the repository."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the repository's Markdown files: tracked or new, not those git ignores (virtual environments, run folders)
DOCS = sorted(
    ROOT / name
    for name in subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    if (ROOT / name).exists()  # not one deleted from the work tree but still in the index
)
IDS = [str(d.relative_to(ROOT)) for d in DOCS]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)  # fenced blocks and inline code
MODULE = re.compile(r"python3? -m ([\w.]+)")
PACKAGES = ("tasks", "mixers", "seqkernels", "experiments", "analysis", "benchmarks", "tests", "docs", ".ci")
REPO_PATH = re.compile(rf"(?<![\w/.$-])((?:{'|'.join(re.escape(p) for p in PACKAGES)})/[\w./<>*-]*)")
PLACEHOLDER = re.compile(r"[<>]|(^|/)[A-Z][A-Z_]+(\.|/|$)")  # tests/kernels/test_<family>.py, presets/NAME.yaml
#: outputs the tools write by default and that are not committed
WRITTEN = {"benchmarks/results/mfu.md"}


def module_exists(name: str) -> bool:
    """A module of this repository by its file (no import), any other through the import system."""
    parts = name.split(".")
    if parts[0] in PACKAGES:
        base = ROOT.joinpath(*parts)
        return base.with_suffix(".py").exists() or (base / "__init__.py").exists() or (base / "__main__.py").exists()
    return importlib.util.find_spec(parts[0]) is not None


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_relative_links_resolve(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links to missing files: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_named_modules_exist(doc):
    missing = sorted({m for m in MODULE.findall(doc.read_text()) if not module_exists(m.rstrip("."))})
    assert not missing, f"{doc.relative_to(ROOT)}: python -m names missing modules: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_named_repository_paths_exist(doc):
    code = " ".join(CODE.findall(doc.read_text()))
    named = {p.rstrip(".").split("::")[0] for p in REPO_PATH.findall(code)}
    missing = sorted(p for p in named - WRITTEN if not PLACEHOLDER.search(p) and not any(ROOT.glob(p)))
    assert not missing, f"{doc.relative_to(ROOT)}: names paths the repository does not have: {missing}"


GPU_RUN_MECHANICS = re.compile(r"RESTORE_RUN|PACK_MAX_MB|\.part0\d|bundle\.tgz|device (call|session)s?\b", re.I)


def test_gpu_run_mechanics_are_told_in_one_readme():
    """How runs travel between GPU machines is told in benchmarks/README.md, beside the scripts, only."""
    told = [str(d.relative_to(ROOT)) for d in DOCS if GPU_RUN_MECHANICS.search(d.read_text())]
    assert told == ["benchmarks/README.md"]


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
