"""Compile the SSD benchmark's Triton kernels in parallel processes before anything is timed.

A process compiles one Triton kernel at a time, and ``mamba-ssm``'s autotuner compiles every
configuration of each of its kernels at first use (about 110 per dtype and state size for one
forward + backward): cold, the benchmark spends minutes compiling. ``warm(jobs, procs)`` runs each
job (one implementation, forward + backward once on the benchmark's inputs, at each batch size
listed) in a pool of worker processes; what they compile lands in Triton's on-disk cache, which the
timing process then only loads. ``mamba-ssm`` jobs can be split in ``parts``: part ``i`` lets the
autotuner try only configurations ``i, i + parts, ...`` of each kernel, so the parts together
compile them all (the timing process still autotunes over every configuration, from the cache).
Nothing is timed in the workers, so their contention for the GPU does not matter.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import multiprocessing
import os
import time

log = logging.getLogger("kernels.ssd.warm")


@dataclasses.dataclass(frozen=True)
class Job:
    """One implementation of ``kernels.ssd.bench._implementations`` (``impl``) at dtype ``dname``
    (``"bf16"``/``"fp32"``), ``H`` heads, state ``N``, head dim ``P``, length ``L``, once per batch
    size in ``batches``; ``tiles``: ``EXPRESSIVITY_SSD_TILES``; ``part`` of ``parts``: the slice of
    each autotuned kernel's configurations to compile (``mamba-ssm``)."""

    impl: str
    dname: str
    H: int
    N: int
    P: int = 64
    L: int = 4096
    batches: tuple[int, ...] = (16,)
    tiles: str = ""
    part: int = 0
    parts: int = 1
    what: str = "fwd+bwd"  # or "state": only kernels.ssd.tune's chunk_state calls


def _slice_autotuning(part: int, parts: int) -> None:
    from triton.runtime import autotuner

    full = autotuner.Autotuner.prune_configs

    def sliced(self, *args, **kwargs):
        configs = full(self, *args, **kwargs)
        return configs[part::parts] or configs[:1]

    autotuner.Autotuner.prune_configs = sliced


def _run(job: Job) -> tuple[Job, float, str]:
    t0 = time.perf_counter()
    try:
        import torch

        from kernels.ssd.bench import DTYPES, _implementations, _inputs, _peer

        os.environ["EXPRESSIVITY_SSD_TILES"] = job.tiles
        device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: the interpreter (tests)
        dtype = DTYPES[job.dname]
        if job.impl == "mamba-ssm" and job.parts > 1:
            _slice_autotuning(job.part, job.parts)
        for batch in job.batches:
            xs = [t.to(dtype) if t.dim() not in (1, 3) else t for t in _inputs(batch, job.L, job.H, job.P, 1, job.N, device)]
            if job.what == "state":
                from kernels.ssd.tune import state_calls

                for call in state_calls(xs, 128, job.impl):
                    call()
            else:
                peer = _peer() if job.impl == "mamba-ssm" else None
                fn = _implementations([int(job.impl.split("-")[1][1:])] if job.impl.startswith("triton") else [], peer)[job.impl]
                leaves = [t.detach().requires_grad_(True) for t in xs]
                y = fn(*leaves)
                torch.autograd.grad(y, leaves, torch.randn_like(y))
            del xs
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        return job, time.perf_counter() - t0, ""
    except Exception as err:  # reported; the timing process meets (and reports) it again
        return job, time.perf_counter() - t0, f"{type(err).__name__}: {err}"[:200]


def warm(jobs: list[Job], procs: int) -> None:
    """Run ``jobs`` in ``procs`` spawned worker processes (logs each job's wall time or error)."""
    if not jobs or procs < 1:
        return
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=min(procs, len(jobs)), mp_context=ctx) as pool:
        for job, secs, err in pool.map(_run, jobs):
            log.info("warm %s %s H%d N%d %s %s%s: %.1f s %s", job.impl, job.dname, job.H, job.N, job.what,
                     job.tiles or "default", f" part {job.part}/{job.parts}" if job.parts > 1 else "", secs, err)
    log.info("warm: %d jobs in %.1f s on %d processes", len(jobs), time.perf_counter() - t0, procs)
