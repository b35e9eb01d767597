"""The suite's top-level packages shadow no installed distribution's module: from the repository folder
(first on ``sys.path``) a package of ours named like another one's would be imported in its place. A
package named ``kernels`` did exactly that to Hugging Face's ``kernels``, which transformers (and so fla)
imports."""

import importlib.metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _our_packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in include} | {"benchmarks"}


def test_our_packages_are_the_ones_setuptools_packs():
    assert _our_packages() == {p.parent.name for p in ROOT.glob("*/__init__.py")}


def test_no_installed_distribution_ships_a_module_of_our_names():
    ours = {"expressivity-suite", "expressivity_suite"}
    clashes = {
        name: dists
        for name, dists in importlib.metadata.packages_distributions().items()
        if name in _our_packages() and set(dists) - ours
    }
    assert not clashes, f"installed distributions ship modules named like ours: {clashes}"
