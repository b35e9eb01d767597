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

``--part-mb N`` (default 15): an archive larger than N MiB is split into ``ARCHIVE.part00``, ``.part01``, ...
(the device tool returns files of at most 16 MiB); ``cat ARCHIVE.part* | tar -xz -C RUN_DIR`` unpacks them.
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


def split_archive(archive: Path, part_bytes: int) -> list[Path]:
    """Split ``archive`` into ``ARCHIVE.partNN`` files of at most ``part_bytes`` each (their concatenation is the
    archive) and delete it; an archive of at most ``part_bytes`` stays whole. Returns the files written."""
    archive = Path(archive)
    if archive.stat().st_size <= part_bytes:
        return [archive]
    parts = []
    with archive.open("rb") as src:
        while chunk := src.read(part_bytes):
            parts.append(archive.with_name(f"{archive.name}.part{len(parts):02d}"))
            parts[-1].write_bytes(chunk)
    archive.unlink()
    return parts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.training.pack_run", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("archive", type=Path)
    p.add_argument("names", nargs="*", help="reproductions whose tables and logs go along (e.g. pararnn-table6-full)")
    p.add_argument("--part-mb", type=float, default=15.0, help="split a larger archive into parts of this many MiB")
    args = p.parse_args(argv)
    counts = pack(args.run_dir, args.archive, args.names)
    parts = split_archive(args.archive, int(args.part_mb * 2**20))
    print(
        f"packed {args.archive}: {counts['trials']} trials, {counts['resumable']} with checkpoints to resume, "
        f"{counts['bytes'] / 1e6:.1f} MB"
        + (f" in {len(parts)} parts ({args.archive.name}.part*)" if len(parts) > 1 else "")
    )


if __name__ == "__main__":
    main()
