"""The package graph: imports run one way between packages, and no module imports itself in a circle.

Every ``import`` and ``from ... import`` in the suite's packages counts, also those inside functions
(a lazy import that closes a circle is still a circle).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "seqkernels", "mixers", "experiments", "analysis")
#: what each package may import of the suite
ALLOWED = {
    "tasks": set(),
    "seqkernels": set(),
    "mixers": {"seqkernels"},
    "experiments": {"tasks", "mixers", "seqkernels"},
    "analysis": {"experiments", "tasks", "mixers", "seqkernels"},
}
#: what each sub-package of ``experiments`` may import of ``experiments``: the trial path runs one way, and
#: the modules directly in ``experiments`` (the CLIs: sweep, reproduce, probe, paper, cli) sit above them all
EXPERIMENTS_ALLOWED = {
    "engines": set(),  # how steps run: the CUDA-graph plugin, the compiled loss, MPS
    "trial": {"engines"},  # one trial: spec, run_trial, the LightningModule, the model, stacked trials
    "sweeps": {"trial", "engines"},  # presets, the study, workers, the runner, results
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the suite's modules it imports (resolved to existing modules)."""
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets |= {f"{base}.{a.name}" for a in node.names} | {base}
        resolved = set()
        for t in targets:
            while t and t not in files:
                t = t.rpartition(".")[0]
            if t and t != name:
                resolved.add(t)
        graph[name] = resolved
    return graph


def test_packages_import_only_downwards():
    bad = [
        (m, t)
        for m, targets in _imports().items()
        for t in targets
        if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in ALLOWED[m.split(".")[0]]
    ]
    assert not bad, bad


def _experiments_part(module: str) -> str | None:
    """``experiments.trial.train`` (and ``experiments.trial``) -> ``trial``; a module directly in
    ``experiments`` -> ``""``; a module of another package -> None."""
    parts = module.split(".")
    if parts[0] != "experiments":
        return None
    return parts[1] if len(parts) > 1 and (ROOT / "experiments" / parts[1] / "__init__.py").is_file() else ""


def test_experiments_subpackages_import_only_downwards():
    """engines <- trial <- sweeps <- the CLIs: no sub-package imports the CLIs or one above it, so the
    sub-packages never import in a circle."""
    parts = {_experiments_part(m) for m in _imports()} - {None, ""}
    assert parts == set(EXPERIMENTS_ALLOWED), parts
    bad = [
        (m, t)
        for m, targets in _imports().items()
        if _experiments_part(m)
        for t in targets
        if _experiments_part(t) is not None
        and _experiments_part(t) != _experiments_part(m)
        and _experiments_part(t) not in EXPERIMENTS_ALLOWED[_experiments_part(m)]
    ]
    assert not bad, bad


def test_no_import_cycles():
    graph = _imports()
    # a module's own package __init__ re-exporting it is not a circle of behaviour: ignore edges to parents
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    seen, stack, cycles = set(), [], []

    def visit(node: str, on_path: set[str]) -> None:
        if node in on_path:
            cycles.append(stack[stack.index(node) :] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        on_path.add(node)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, on_path)
        stack.pop()
        on_path.discard(node)

    for module in sorted(edges):
        visit(module, set())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_lazy_imports():
    """The check is not vacuous: a function-level import is an edge."""
    assert "experiments.sweeps.workers" in _imports()["experiments.sweeps.runner"]
