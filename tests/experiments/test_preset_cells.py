"""Every preset's cells, as recorded in ``preset_cells.json``: a refactoring of the spec, the plan or the
presets' resolution must leave each sweep's cell ids (what a study resumes on) and the specs written to
``spec.json`` and the study as they were.

An intended change of a preset's cells regenerates the record:
``python -m tests.experiments.test_preset_cells > tests/experiments/preset_cells.json``.
"""

import hashlib
import json
from pathlib import Path

from experiments.sweeps.presets import available_presets, build_specs, load_preset, resolve_sweep
from experiments.sweeps.study import cell_id

RECORD = Path(__file__).with_name("preset_cells.json")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def preset_cells() -> dict[str, str]:
    """``{"preset/entry": "<cells> <digest of the cell ids> <digest of the specs' dicts>"}`` of every preset."""
    out = {}
    for preset in available_presets():
        for entry in load_preset(preset).get("tasks", {}):
            specs = build_specs(resolve_sweep(entry, preset))
            ids = _digest("\n".join(cell_id(s) for s in specs))
            dicts = _digest(json.dumps([s.to_dict() for s in specs], sort_keys=True, default=str))
            out[f"{preset}/{entry}"] = f"{len(specs)} {ids} {dicts}"
    return out


def test_every_preset_keeps_its_cell_ids_and_specs():
    recorded, now = json.loads(RECORD.read_text()), preset_cells()
    assert sorted(now) == sorted(recorded), "sweeps added or removed: regenerate the record (see the docstring)"
    changed = [f"{key}: {recorded[key]} -> {now[key]}" for key in recorded if now[key] != recorded[key]]
    assert not changed, "cells changed:\n" + "\n".join(changed)


if __name__ == "__main__":
    print("{\n" + ",\n".join(f' "{k}": "{v}"' for k, v in preset_cells().items()) + "\n}")
