"""Run several sweep plans (e.g. a paper table's tasks) as one study, so workers span all of them.

Used by ``experiments.reproduce`` and ``experiments.probe``. Each plan's results go to
``<out>/<entry>/results.csv`` and ``table.md``; the journal (or ``storage_url``) holds all cells.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd


def run_plans(plans: list, out: Path, study_name: str, workers: int = 0, device: str = "auto",
              storage_url: str | None = None, run: bool = True, progress: bool = True,
              stale_timeout: float = 60, label: str | None = None,
              retry_failed: bool = False) -> tuple[dict[str, pd.DataFrame], dict]:
    """Run (resume) every plan's cells; returns ``({entry: results DataFrame}, info)``.

    ``retry_failed``: also re-run cells whose trial failed for a final reason (NaN loss, an error).

    ``info``: ``cells``, ``done``, ``wall_s`` (this call), ``versions``. ``run=False`` only collects.
    """
    from experiments.results import collect, versions, write_results
    from experiments.study import HEARTBEAT_DIR, cell_id, open_storage, open_study, progress as cell_progress, sync_grid
    from experiments.sweep import build_specs, validate_specs
    from experiments.workers import run_workers, worker_loop

    specs_by_entry = {p.entry or p.task: build_specs(p, device) for p in plans}
    specs = [s for v in specs_by_entry.values() for s in v]
    validate_specs(specs)
    out.mkdir(parents=True, exist_ok=True)
    study = open_study(open_storage(storage_url, out, stale_timeout), study_name)
    cells_by_entry = {e: list(dict.fromkeys(cell_id(s) for s in v)) for e, v in specs_by_entry.items()}
    all_cells = [c for v in cells_by_entry.values() for c in v]
    meta = versions()

    def write_all() -> dict[str, pd.DataFrame]:
        results = {}
        for entry, cells in cells_by_entry.items():
            results[entry] = collect(study, cells, meta)
            write_results(results[entry], out / entry)
        return results

    t0 = time.perf_counter()
    if run:
        sync_grid(study, specs, retry_failed=retry_failed, heartbeat_dir=out / HEARTBEAT_DIR, stale_timeout=stale_timeout)
        if workers:
            run_workers(study, specs, out, storage_url, workers, device, stale_timeout=stale_timeout,
                        progress=progress, label=label or study_name, on_progress=write_all)
        else:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          disable=not progress) as bar:
                tid = bar.add_task(label or study_name, total=len(all_cells),
                                   completed=cell_progress(study, all_cells)["done"])

                def claimed(p: dict) -> None:
                    bar.update(tid, description=f"{label or study_name}: {p['task']} {p['mixer']} seed={p['seed']} lr={p['lr']:g}")

                worker_loop(study, specs, out, device=None if device == "auto" else device, stale_timeout=stale_timeout,
                            on_claim=claimed,
                            on_trial=lambda s, o: (write_all(), bar.update(tid, completed=cell_progress(study, all_cells)["done"])))
    results = write_all()
    info = {"cells": len(all_cells), "done": cell_progress(study, all_cells)["done"],
            "wall_s": time.perf_counter() - t0, "versions": meta}
    return results, info
