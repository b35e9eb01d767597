"""The papers' numbers, read from the ``paper:`` section of a reproduction preset (SPEC §8.5, §10).

A reproduction preset (``experiments/presets/<name>.yaml``) holds::

    tasks:   {khop2: {task: khop, task_options: {k: 2, vocab_size: 5}}, ...}    # the sweeps
    paper:
      source: "paper 000, Table 6 (best of 3 seeds)"
      metric: test/acc                      # or extrap/mean_acc
      aggregate: best                       # or mean_at_best_lr
      columns: {khop2: "k-hop k=2 V=5", ...}
      results: {flashgru: {khop2: [1.00, 17000], ...}, ...}   # [accuracy, parameters (optional)]

``paper_entries(name)`` flattens that into ``PaperEntry`` rows; ``match_entry`` finds the entry a
results group (task + task options) belongs to.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass(frozen=True)
class PaperEntry:
    """One column of a paper table: a task in one configuration, with every mixer's number."""

    entry: str  #: the preset's name for the sweep (e.g. ``khop2``)
    task: str
    options: dict[str, Any]  #: the sweep's task options (resolved by the preset)
    title: str  #: the paper's column title
    metric: str  #: the results.csv column the paper reports (``test/acc``, ``extrap/mean_acc``)
    aggregate: str  #: ``best`` (best seed) or ``mean_at_best_lr``
    source: str
    values: dict[str, tuple[float, float]]  #: mixer -> (accuracy in [0, 1], parameters or nan)


def reproduction_presets() -> list[str]:
    """Names of the presets that carry a ``paper:`` section."""
    from experiments.presets import available_presets, load_preset

    return [name for name in available_presets() if "paper" in load_preset(name)]


def paper_entries(name: str) -> list[PaperEntry]:
    """The paper table of reproduction preset ``name``; ``ValueError`` listing the known ones."""
    from experiments.presets import load_preset, resolve_sweep

    known = reproduction_presets()
    if name not in known:
        raise ValueError(f"unknown paper table {name!r}; known: {', '.join(known) or 'none'} "
                         "(reproduction presets in experiments/presets/ with a 'paper:' section)")
    data = load_preset(name)
    paper = data["paper"]
    nan = float("nan")
    entries = []
    for entry in data.get("tasks", {}):
        plan = resolve_sweep(entry, name)
        values = {}
        for mixer, by_entry in (paper.get("results") or {}).items():
            ref = (by_entry or {}).get(entry)
            if ref is None:
                continue
            ref = list(ref) if isinstance(ref, (list, tuple)) else [ref]
            values[mixer] = (float(ref[0]), float(ref[1]) if len(ref) > 1 else nan)
        options = dict(plan.task_options)
        if plan.extrapolation:
            options["extrapolation"] = plan.extrapolation
        entries.append(PaperEntry(
            entry=entry, task=plan.task, options=options,
            title=str((paper.get("columns") or {}).get(entry, entry)),
            metric=str(paper.get("metric", "test/acc")), aggregate=str(paper.get("aggregate", "best")),
            source=str(paper.get("source", name)), values=values,
        ))
    return entries


def full_task_config(task: str, options: dict[str, Any]) -> dict[str, Any]:
    """The task's whole configuration (defaults filled in; ``None`` defaults replaced by the task's
    effective value, e.g. k-hop's vocabulary); the raw ``options`` if the task cannot be built."""
    from tasks import get_task

    opts = {k: v for k, v in options.items() if k != "extrapolation"}
    try:
        t = get_task(task, **opts)
        config = dataclasses.asdict(t.config)
        for key, value in config.items():
            if value is None and hasattr(t, key):
                config[key] = getattr(t, key)
    except (ValueError, TypeError):
        config = dict(opts)
    if options.get("extrapolation"):
        config["extrapolation"] = dict(sorted(options["extrapolation"].items()))
    return config


def match_entry(task: str, config: dict[str, Any], entries: list[PaperEntry]) -> PaperEntry | None:
    """The entry of ``entries`` for a results group of ``task`` with full ``config``, or ``None``.

    Only the options that tell the paper's columns of one task apart are compared (k-hop: ``k``
    and the vocabulary), so a shortened run (other ``seq_len``) still lines up with its column; but
    the protocol must agree: a length-extrapolation run only matches an extrapolation column.
    """
    extrap = bool(config.get("extrapolation"))
    same = [e for e in entries if e.task == task and bool(e.options.get("extrapolation")) == extrap]
    if len(same) <= 1:
        return same[0] if same else None
    configs = [full_task_config(e.task, e.options) for e in same]
    keys = sorted({k for c in configs for k in c if len({json.dumps(x.get(k), sort_keys=True) for x in configs}) > 1})
    for entry, entry_config in zip(same, configs):
        if all(json.dumps(config.get(k), sort_keys=True) == json.dumps(entry_config.get(k), sort_keys=True) for k in keys):
            return entry
    return None
