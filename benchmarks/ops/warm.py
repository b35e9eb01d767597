"""``python -m benchmarks.ops warm [--procs N] [--parts K] "FAMILY ARGS" ...``: compile every timed kernel
of the named benchmark runs in parallel processes before the timed runs.

A process compiles one Triton kernel at a time, and autotuned peers (``mamba-ssm``, ``fla-core``)
compile every configuration of each kernel at first use. Each job runs ``python -m benchmarks.ops
FAMILY ARGS --warm-only`` (every implementation forward and forward + backward once at the timed
shapes; no check, no timing); ``--parts K`` runs the jobs of families with autotuned peers (``ssd``,
``mlstm``) as ``K`` processes, each trying every ``K``-th configuration (``BENCH_AUTOTUNE_PART``), and the
``delta`` family's as one process per main shape item (``--shapes``, default ``delta.MAIN``; the
``--sweep`` section in one more: ``shape_jobs``). What
they compile lands in Triton's on-disk cache, which the timed run then only loads. Nothing is timed
here, so the processes' contention for the GPU does not matter.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

AUTOTUNED = ("ssd", "mlstm")


def _job(cmd: list[str], env: dict) -> tuple[str, float, int, str]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    return " ".join(cmd[3:]), time.perf_counter() - t0, res.returncode, (res.stderr or res.stdout)[-300:]


def shape_jobs(words: list[str]) -> list[list[str]]:
    """The ``delta`` run ``words`` (``["delta", ARGS...]``) as one run per main shape item, and one for the
    ``--sweep`` section where it is asked (its many implementations and shapes compile one kernel at a time
    in one process); other families' runs unchanged."""
    if words[0] != "delta":
        return [words]
    from benchmarks.ops.delta import MAIN

    rest, items, sweep = list(words), [":".join(item) for item in MAIN], "--sweep" in words
    if "--shapes" in rest:
        i = rest.index("--shapes")
        items = [item for item in rest[i + 1].split(";") if item]
        del rest[i : i + 2]
    no_main = "--no-main" in rest
    rest = [w for w in rest if w not in ("--sweep", "--no-main")]
    jobs = [] if no_main else [[*rest, "--shapes", item] for item in items]
    return jobs + ([[*rest, "--no-main", "--sweep"]] if sweep else [])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops warm", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help='benchmark runs, each one argument: "FAMILY [ARGS]"')
    p.add_argument("--procs", type=int, default=os.cpu_count() or 4, help="processes at once (default: CPU count)")
    p.add_argument("--parts", type=int, default=4, help="processes per autotuned family run (default 4)")
    args = p.parse_args(argv)
    jobs = []
    for run in args.runs:
        words = shlex.split(run)
        parts = args.parts if words[0] in AUTOTUNED else 1
        for i in range(parts):
            env = dict(os.environ, **({"BENCH_AUTOTUNE_PART": f"{i}/{parts}"} if parts > 1 else {}))
            for job in shape_jobs(words):
                jobs.append(([sys.executable, "-m", "benchmarks.ops", *job, "--warm-only"], env))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.procs)) as pool:
        for name, secs, rc, tail in pool.map(lambda j: _job(*j), jobs):
            print(
                f"warm {name}: {secs:.0f} s" + ("" if rc == 0 else f" (rc {rc}: {tail.strip().splitlines()[-1:]})"),
                flush=True,
            )
    print(f"warm: {len(jobs)} processes in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
