"""``python -m benchmarks.training.pack_run RUN_DIR ARCHIVE [NAME ...]``: a reproduction's run folder, packed so that
another machine resumes it.

``RUN_DIR`` is an ``experiments.reproduce --out`` folder (one Optuna study for every reproduction). The
archive (``.tgz``) holds the study's journal, the tables' folders and logs of ``NAME ...``, and every trial
folder without its checkpoints, except the trials that have not completed: those keep ``checkpoints/``
(``last.ckpt`` / ``interrupted.ckpt`` to resume from, ``best.ckpt`` whose weights the trial is tested with
at its end). A finished trial's results live in the journal, so its checkpoints stay behind: the archive
of a 72-trial table in progress is a few MB. Unpack it on the other machine at the same path (Lightning's
checkpoint callback keeps the absolute path of the best checkpoint): ``tar -xzf ARCHIVE -C RUN_DIR``, then
re-run the same ``experiments.reproduce`` command (``benchmarks/training/gpu.sh``: ``RESTORE_RUN``).
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

from experiments.sweeps.study import JOURNAL_FILE


def completed_trial_dirs(run_dir: Path) -> set[str]:
    """Trial folders (relative to ``run_dir``) of the study's completed trials."""
    import optuna

    from experiments.sweeps.study import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(None, run_dir)
    done = set()
    for summary in storage.get_all_studies():
        for t in storage.get_all_trials(summary._study_id, deepcopy=False):
            result = t.user_attrs.get("result") or {}
            if t.state == optuna.trial.TrialState.COMPLETE and "trial_dir" in result:
                done.add(str(result["trial_dir"]))
    return done


def pack(run_dir: Path, archive: Path, names: list[str]) -> dict[str, int]:
    """Write ``archive``; returns counts: ``trials``, ``resumable`` (trials packed with checkpoints), ``bytes``."""
    run_dir = Path(run_dir)
    if not (run_dir / JOURNAL_FILE).exists():
        raise SystemExit(f"error: {run_dir} has no {JOURNAL_FILE}: not an experiments.reproduce output folder")
    done = completed_trial_dirs(run_dir)
    trials = sorted(p for p in (run_dir / "trials").glob("*") if p.is_dir())
    resumable = 0
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(run_dir / JOURNAL_FILE, arcname=JOURNAL_FILE)
        for name in names:
            for extra in (run_dir / name, run_dir / f"{name}.log"):
                if extra.exists():
                    tar.add(extra, arcname=extra.name)
        for trial in trials:
            rel = str(trial.relative_to(run_dir))
            keep = rel not in done
            resumable += keep
            tar.add(
                trial,
                arcname=rel,
                filter=lambda info, keep=keep: info if keep or "/checkpoints" not in info.name else None,
            )
    return {"trials": len(trials), "resumable": resumable, "bytes": archive.stat().st_size}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training.pack_run", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("archive", type=Path)
    p.add_argument("names", nargs="*", help="reproductions whose tables and logs go along (e.g. pararnn-table6-full)")
    args = p.parse_args(argv)
    counts = pack(args.run_dir, args.archive, args.names)
    print(
        f"packed {args.archive}: {counts['trials']} trials, {counts['resumable']} with checkpoints to resume, "
        f"{counts['bytes'] / 1e6:.1f} MB"
    )


if __name__ == "__main__":
    main()
