"""``python -m benchmarks.training.pack_run RUN_DIR ARCHIVE [NAME ...]``: a reproduction's run folder, packed so that
another machine resumes it.

``RUN_DIR`` is an ``experiments.reproduce --out`` folder (one Optuna study for every reproduction). The
archive (``.tgz``) holds the study's journal, the tables' folders and logs of ``NAME ...``, and every trial
folder (``trials/``) and stack folder (``stacks/``) without its checkpoints, except those that have not
completed: they keep ``checkpoints/`` (the newer of ``interrupted.ckpt`` and ``last.ckpt`` to resume from,
``best.ckpt`` whose weights the trial is tested with at its end; the older resume checkpoint stays behind).
A finished trial's results live in the journal, so its checkpoints stay behind: the archive of a 72-trial
table in progress is a few MB. Unpack it on the other machine at the same path (Lightning's checkpoint
callback keeps the absolute path of the best checkpoint): ``tar -xzf ARCHIVE -C RUN_DIR``, then re-run the
same ``experiments.reproduce`` command (``benchmarks/training/gpu.sh``: ``RESTORE_RUN``).

``--max-mb M``: the unfinished trials' checkpoints are packed, furthest-trained first, while the archive stays
within about M MiB; a trial whose checkpoints do not fit is left out whole and restarts from step 0 on the
other machine (the device tool returns 64 MiB per call: the checkpoints of 16 three-layer trials of width 128
with their AdamW state are about 90 MB). ``--part-mb N`` (default 15): an archive larger than N MiB is split
into ``ARCHIVE.part00``, ``.part01``, ... (the device tool returns files of at most 16 MiB);
``cat ARCHIVE.part* | tar -xz -C RUN_DIR`` unpacks them.
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

from experiments.sweeps.study import JOURNAL_FILE


def completed_dirs(run_dir: Path) -> set[str]:
    """Folders (relative to ``run_dir``) of the study's completed trials, and of the stacks they were trained in."""
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
                done.update([str(result["stack"])] if result.get("stack") else [])
    return done


def resume_files(folder: Path) -> tuple[Path | None, list[Path]]:
    """An unfinished trial's (or stack's) checkpoint to resume from (``None``: none yet) and the checkpoints a
    resume needs: every one but the older of ``interrupted.ckpt`` and ``last.ckpt``."""
    from experiments.trial.train import CHECKPOINT_DIR, INTERRUPT_CHECKPOINT, LAST_CHECKPOINT, resume_checkpoint

    resume = resume_checkpoint(folder)
    superseded = {folder / CHECKPOINT_DIR / n for n in (INTERRUPT_CHECKPOINT, LAST_CHECKPOINT)} - {resume}
    return resume, [p for p in sorted((folder / CHECKPOINT_DIR).glob("*")) if p.is_file() and p not in superseded]


def pack(run_dir: Path, archive: Path, names: list[str], max_bytes: int | None = None) -> dict[str, int]:
    """Write ``archive``; returns counts: ``trials`` (trial folders), ``resumable`` (unfinished trial and stack
    folders packed with their checkpoints), ``restarted`` (unfinished ones left out: their checkpoints would
    pass ``max_bytes``), ``bytes``."""
    run_dir = Path(run_dir)
    if not (run_dir / JOURNAL_FILE).exists():
        raise SystemExit(f"error: {run_dir} has no {JOURNAL_FILE}: not an experiments.reproduce output folder")
    done = completed_dirs(run_dir)
    folders = sorted(p for sub in ("trials", "stacks") for p in (run_dir / sub).glob("*") if p.is_dir())
    unfinished = {p: resume_files(p) for p in folders if str(p.relative_to(run_dir)) not in done}

    def size(paths, checkpoints: bool = True) -> int:
        files = (f for p in paths for f in ([p] if p.is_file() else p.rglob("*")))
        return sum(f.stat().st_size for f in files if f.is_file() and (checkpoints or f.parent.name != "checkpoints"))

    extras = [run_dir / n for name in names for n in (name, f"{name}.log")]
    packed, left_out = set(unfinished), set()
    if max_bytes is not None:
        from experiments.trial.train import trainer_step_of

        # the bytes left for checkpoints: everything else counted uncompressed (it compresses; checkpoints hardly do)
        budget = max_bytes - size([run_dir / JOURNAL_FILE, *extras, *folders], False)
        packed = set()
        step = {p: trainer_step_of(resume) if resume else 0 for p, (resume, _) in unfinished.items()}
        for folder in sorted(unfinished, key=step.get, reverse=True):
            need = size(unfinished[folder][1])
            if need <= budget:
                packed.add(folder)
                budget -= need
            else:
                left_out.add(folder)

    def checkpoint_filter(folder: Path):
        rel = folder.relative_to(run_dir)
        keep = {f"{rel}/checkpoints/{p.name}" for p in unfinished[folder][1]} if folder in packed else set()
        return lambda info: None if "/checkpoints/" in info.name and info.name not in keep else info

    with tarfile.open(archive, "w:gz") as tar:
        tar.add(run_dir / JOURNAL_FILE, arcname=JOURNAL_FILE)
        for extra in extras:
            if extra.exists():
                tar.add(extra, arcname=extra.name)
        for folder in folders:
            if folder not in left_out:
                tar.add(folder, arcname=str(folder.relative_to(run_dir)), filter=checkpoint_filter(folder))
    trials = [p for p in folders if p.parent.name == "trials"]
    return {
        "trials": len(trials),
        "resumable": sum(1 for p in packed if any(unfinished[p][1])),
        "restarted": len(left_out),
        "bytes": archive.stat().st_size,
    }


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
    p.add_argument(
        "--max-mb",
        type=float,
        default=None,
        help="pack the unfinished trials' checkpoints, furthest-trained first, while the archive stays within about "
        "this many MiB; the rest restart from step 0 (default: no limit)",
    )
    p.add_argument("--part-mb", type=float, default=15.0, help="split a larger archive into parts of this many MiB")
    args = p.parse_args(argv)
    max_bytes = None if args.max_mb is None else int(args.max_mb * 2**20)
    counts = pack(args.run_dir, args.archive, args.names, max_bytes)
    parts = split_archive(args.archive, int(args.part_mb * 2**20))
    print(
        f"packed {args.archive}: {counts['trials']} trials, {counts['resumable']} with checkpoints to resume"
        + (f", {counts['restarted']} left out to restart (over --max-mb)" if counts["restarted"] else "")
        + f", {counts['bytes'] / 1e6:.1f} MB"
        + (f" in {len(parts)} parts ({args.archive.name}.part*)" if len(parts) > 1 else "")
    )


if __name__ == "__main__":
    main()
