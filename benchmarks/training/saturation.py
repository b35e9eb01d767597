"""What bounds N processes that share one GPU under MPS, each replaying a CUDA graph of tiny kernels.

    python -m benchmarks.training.saturation kernels --procs 1,16 --ctas 1,16,64,256 --kernels 80 --seconds 4
    python -m benchmarks.training.saturation steps --procs 16 --tasks khop2 --seconds 15
    python -m benchmarks.training.saturation slots --tasks khop2 --top 5
    python -m benchmarks.training.saturation streams --streams 1,4,8,16 --tasks khop2 --seconds 10
    python -m benchmarks.training.saturation shares --streams 16 --tasks khop2 --seconds 6
    python -m benchmarks.training.saturation counters --tasks khop2 --top 6

``kernels``: each process replays a graph of ``--kernels`` elementwise kernels of ``G`` CTAs each
(``x.add_(1)`` on ``512 G`` floats: 128 threads x 4 per CTA) back to back; the rows give the kernels and
CTAs per second that all processes complete together. It calibrates the GPU's front end: how many
launches and CTAs it can start when the kernels themselves do almost nothing.

``steps``: each process replays the compiled training step of one trial of the Table 6 mix
(``benchmarks.training.step_profile.captured_step``: forward, loss, backward, bookkeeping, fused AdamW; the
mixers round robin over the processes); the row gives the steps per second in total and per mixer,
without Lightning or data loading around the replays (``python -m benchmarks.training.throughput workers``
measures the whole training loop).

``slots``: one process, no MPS: profiles one replay of each mixer's compiled step and weights each
kernel's duration by the share of the GPU's resident-CTA slots it fills (``gpu_slot_share``: its CTAs
over the SMs times the CTAs per SM that its threads, registers and shared memory allow). The row gives
a step's kernel µs and slot-µs, and the kernels with the most slot-µs: a GPU bound by CTA slots would
run ``1e6 / slot-µs`` such steps per second.

``streams``: the ``steps`` replays in one process without MPS: ``max(--streams)`` trials' compiled steps,
each captured and replayed on its own CUDA stream (``CUDA_DEVICE_MAX_CONNECTIONS`` 32 unless set, so
that the streams do not share hardware queues); per count ``n``, the first ``n`` replay side by side,
each stream at its own pace (at most ``--depth`` replays queued on it). Against ``steps`` at the same
count it tells whether the processes and MPS, rather than the GPU, bound the replays.

``shares``: ``streams`` at one count, once per mixer of the mix alone (all streams replay that mixer's
step) and once for the mix: a mixer alone saturating the GPU at ``R`` steps/s takes ``1e6 / R`` µs of
the shared GPU per step (``shared_us``), and the mix's row checks that these shares add up
(``gpu_share``: the mix's per-stream rates times those µs, near 1 when they do).

``counters``: one replay of each mixer's compiled step under Nsight Compute (``ncu --graph-profiling
node``, clocks left alone), one row per mixer: per kernel its hardware counters, summed over the step
into the GPU time each shared resource would need if the kernels of many steps packed the GPU
perfectly (``resource_floors``): instruction issue, resident warps, registers, DRAM bytes. A GPU
that runs ``R`` such steps per second keeps a resource busy ``R x floor``; one near 100% at the
``streams`` rate would bound it (none is for the Table 6 steps: ``docs/performance.md``). Needs ``ncu``
on the PATH.

The processes build their graphs, then start replaying together and run for ``--seconds``. Needs a
CUDA GPU and ``nvidia-cuda-mps-control`` (``experiments.engines.mps``; only ``kernels`` and ``steps`` use it).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

#: resident CTAs per SM the hardware allows at most (sm_80 and sm_90)
MAX_CTAS_PER_SM = 32


def resident_ctas_per_sm(
    threads: int, regs: int, smem: int, *, max_threads: int = 2048, regs_per_sm: int = 65536, smem_per_sm: int = 233472
) -> int:
    """CTAs of ``threads`` threads, ``regs`` registers per thread and ``smem`` bytes of shared memory
    that fit on one SM at once (at least 1): the least of the thread, register (allocated per warp in
    units of 256), shared-memory and ``MAX_CTAS_PER_SM`` limits. Defaults: an H100 / H200 SM."""
    warps = -(-threads // 32)
    per_warp = -(-regs * 32 // 256) * 256
    limits = [MAX_CTAS_PER_SM, max_threads // (warps * 32)]
    if per_warp:
        limits.append(regs_per_sm // (per_warp * warps))
    if smem:
        limits.append(smem_per_sm // smem)
    return max(1, min(limits))


def gpu_slot_share(ctas: int, threads: int, regs: int, smem: int, sms: int, **sm_limits) -> float:
    """The share (0 to 1) of the GPU's resident-CTA slots that a kernel of ``ctas`` CTAs fills while it runs."""
    return min(1.0, ctas / (sms * resident_ctas_per_sm(threads, regs, smem, **sm_limits)))


def slot_rows(trace_events: list[dict], replays: int, sms: int, **sm_limits) -> list[dict]:
    """Per kernel name in a Kineto trace (``cat == "kernel"`` events with ``grid``, ``block``,
    ``registers per thread``, ``shared memory`` args) over ``replays`` replays: ``launches``, ``us``
    and ``slot_us`` per replay, heaviest ``slot_us`` first."""
    rows: dict[str, dict] = {}
    for e in trace_events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        g, b = a.get("grid", [1, 1, 1]), a.get("block", [1, 1, 1])
        share = gpu_slot_share(
            g[0] * g[1] * g[2],
            b[0] * b[1] * b[2],
            a.get("registers per thread", 0),
            a.get("shared memory", 0),
            sms,
            **sm_limits,
        )
        r = rows.setdefault(e["name"], {"kernel": e["name"][:80], "launches": 0, "us": 0.0, "slot_us": 0.0})
        r["launches"] += 1 / replays
        r["us"] += e["dur"] / replays
        r["slot_us"] += e["dur"] * share / replays
    return sorted(rows.values(), key=lambda r: -r["slot_us"])


def mix_specs(task: str, mixers: list[str] | None = None) -> list:
    """The ``TrialSpec`` of each mixer of task entry ``task`` of pararnn-table6 (or of ``mixers``), in
    the mix's order, at 100 steps on CUDA (``benchmarks.training.throughput.benchmark_specs``)."""
    from benchmarks.training.throughput import benchmark_specs

    return [spec for _, spec in benchmark_specs("pararnn-table6", [task], mixers, 100, "cuda")]


def mixer_list(text: str) -> list[str]:
    """``--mixers``: comma-separated registered mixer names (an unknown one is an argparse error)."""
    from experiments.cli import str_list
    from mixers import resolve_mixer

    names = str_list(text)
    for name in names:
        try:
            resolve_mixer(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return names


def profile_slots(task: str, top: int) -> list[dict]:
    """One row per mixer of ``task`` (pararnn-table6): its compiled step's kernel µs and slot-µs alone,
    and its ``top`` kernels by slot-µs."""
    from benchmarks.training.step_profile import captured_step, profile_replays

    props = torch.cuda.get_device_properties(0)
    limits = dict(
        max_threads=props.max_threads_per_multi_processor,
        regs_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
        smem_per_sm=props.shared_memory_per_multiprocessor,
    )
    out = []
    for spec in mix_specs(task):
        graph, _ = captured_step(spec, compile=True)
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        prof = profile_replays(graph, 5)
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
            with open(os.path.join(tmp, "trace.json")) as f:
                rows = slot_rows(json.load(f)["traceEvents"], 5, props.multi_processor_count, **limits)
        out.append(
            {
                "task": task,
                "mixer": spec.model.mixer,
                "kernels": round(sum(r["launches"] for r in rows)),
                "us": round(sum(r["us"] for r in rows), 1),
                "slot_us": round(sum(r["slot_us"] for r in rows), 1),
                "top": [{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()} for r in rows[:top]],
            }
        )
        del graph
    return out


#: the Nsight Compute metrics ``counters`` reads per kernel
NCU_METRICS = (
    "gpu__time_duration.sum",
    "smsp__inst_executed.sum",
    "sm__warps_active.sum",
    "sm__cycles_active.sum",
    "sm__cycles_elapsed.avg.per_second",
    "dram__bytes.sum",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
)


def resource_floors(
    k: dict,
    sms: int,
    *,
    schedulers: int = 4,
    warps_per_sm: int = 64,
    regs_per_sm: int = 65536,
    smem_per_sm: int = 233472,
    dram_bytes_per_s: float = 3.35e12,
) -> dict[str, float]:
    """What one kernel's counters ``k`` (``NCU_METRICS`` in ncu's base units: ns, warp instructions,
    cycles, warp-cycles, bytes, Hz) take of the whole GPU, in µs: ``us``, its duration alone;
    ``sm_active``, the time its SMs hold at least one of its warps, summed over the SMs and divided by
    their count; and what each shared resource would need at full use:

    - ``issue``: its warp instructions over ``sms x schedulers`` issue slots per cycle;
    - ``warps``: its resident warp-cycles over ``sms x warps_per_sm`` warp slots;
    - ``regs``: the same warp-cycles times its registers per warp (allocated in units of 256) over
      the register files;
    - ``smem``: its warp-cycles times its shared memory per warp over the shared memory;
    - ``dram``: its DRAM bytes at ``dram_bytes_per_s``.

    Defaults: an H100 / H200 SM; ``dram_bytes_per_s`` is the H100 SXM's 3.35 TB/s."""
    hz = k["sm__cycles_elapsed.avg.per_second"]
    warps_per_cta = -(-int(k["launch__block_size"]) // 32)
    regs_per_warp = -(-int(k["launch__registers_per_thread"]) * 32 // 256) * 256
    smem_per_warp = (
        k["launch__shared_mem_per_block_static"] + k["launch__shared_mem_per_block_dynamic"]
    ) / warps_per_cta
    warp_s = k["sm__warps_active.sum"] / hz
    return {
        "us": k["gpu__time_duration.sum"] / 1e3,
        "sm_active": k["sm__cycles_active.sum"] / (sms * hz) * 1e6,
        "issue": k["smsp__inst_executed.sum"] / (sms * schedulers * hz) * 1e6,
        "warps": warp_s / (sms * warps_per_sm) * 1e6,
        "regs": warp_s * regs_per_warp / (sms * regs_per_sm) * 1e6,
        "smem": warp_s * smem_per_warp / (sms * smem_per_sm) * 1e6,
        "dram": k["dram__bytes.sum"] / dram_bytes_per_s * 1e6,
    }


def read_ncu_csv(text: str) -> list[dict]:
    """The kernels of ``ncu --import R --csv --page raw --print-units base``: one dict per kernel with
    ``name`` and the numeric ``NCU_METRICS``."""
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(text)))
    out = []
    for r in rows[1:]:  # the first row under the header gives the units
        k = {"name": r["Kernel Name"]}
        for m in NCU_METRICS:
            k[m] = float(r[m].replace(",", "")) if r.get(m, "").strip() else 0.0
        out.append(k)
    return out


FLOORS = ("us", "sm_active", "issue", "warps", "regs", "smem", "dram")


def step_floors(kernels: list[dict], sms: int, top: int) -> dict:
    """A step's ``kernels`` (``read_ncu_csv``) as one row: their count, each of ``resource_floors``
    summed over them (µs), and the ``top`` kernels by ``warps`` (resident warp-cycles), the sum that
    tracks most closely what a Table 6 step takes of a shared GPU (``docs/performance.md``)."""
    rows = [{"kernel": k["name"][:80], **resource_floors(k, sms)} for k in kernels]
    heaviest = sorted(rows, key=lambda r: -r["warps"])[:top]
    return {
        "kernels": len(rows),
        **{f: round(sum(r[f] for r in rows), 1) for f in FLOORS},
        "top": [{f: round(v, 1) if isinstance(v, float) else v for f, v in r.items()} for r in heaviest],
    }


def profile_counters(task: str, top: int, csv_dir: str | None = None) -> list[dict]:
    """One row per mixer of ``task`` (pararnn-table6): the summed ``resource_floors`` of its compiled
    step's kernels (one replay under ``ncu``) and its ``top`` kernels by warp-cycles (``step_floors``).
    ``csv_dir``: also write each step's raw counters there (``TASK-MIXER.csv``). ncu flushes the caches
    before each kernel (its default), so memory-bound kernels count DRAM latency that a GPU keeping
    every trial's data in L2 does not pay."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    for index, spec in enumerate(mix_specs(task)):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "step")
            subprocess.run(
                [
                    "ncu",
                    "--profile-from-start",
                    "off",
                    "--graph-profiling",
                    "node",
                    "--clock-control",
                    "none",
                    "--metrics",
                    ",".join(NCU_METRICS),
                    "-o",
                    report,
                    sys.executable,
                    "-m",
                    "benchmarks.training.saturation",
                    "_counters",
                    task,
                    str(index),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            text = subprocess.run(
                ["ncu", "--import", report + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        if csv_dir:
            os.makedirs(csv_dir, exist_ok=True)
            with open(os.path.join(csv_dir, f"{task}-{spec.model.mixer}.csv"), "w") as f:
                f.write(text)
        out.append({"task": task, "mixer": spec.model.mixer, **step_floors(read_ncu_csv(text), sms, top)})
    return out


def _counters_worker(task: str, index: int) -> None:
    """Under ``ncu --profile-from-start off``: capture trial ``index``'s compiled step, warm it up, and
    replay it once inside the profiled range."""
    graph, _, _step = _step_graph(task, index)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    graph.replay()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def mean_by_label(rates) -> dict[str, int]:
    """``{label: mean rate, rounded}`` of ``(label, rate)`` pairs (one per process or stream)."""
    per: dict[str, list[float]] = {}
    for label, rate in rates:
        per.setdefault(label, []).append(rate)
    return {k: round(sum(v) / len(v)) for k, v in per.items()}


def _noop_graph(ctas: int, kernels: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    x = torch.zeros(ctas * 512, device="cuda")
    for _ in range(3):
        x.add_(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1)
    return graph, x


def _step_graph(
    task: str, index: int, stream: torch.cuda.Stream | None = None, stack: int = 1, mixers: list[str] | None = None
):
    """``(graph, mixer, step)``: the compiled step of trial ``index`` of ``task``'s mix (its mixers, or
    ``mixers``, round robin), captured on ``stream``, as a stack of ``stack`` trials
    (``experiments.trial.stack``); ``step`` keeps the compiled model the graph's kernels belong to."""
    from benchmarks.training.step_profile import captured_step

    specs = mix_specs(task, mixers)
    spec = specs[index % len(specs)]
    graph, step = captured_step(spec, compile=True, stream=stream, stack=stack)
    return graph, spec.model.mixer, step


def replay_streams(
    task: str, counts: list[int], seconds: float, depth: int = 4, stack: int = 1, mixers: list[str] | None = None
) -> list[dict]:
    """One row per count ``n`` in ``counts``: the first ``n`` of ``max(counts)`` captured steps of
    ``task`` replayed side by side on their own streams for ``seconds``, each stream kept at most
    ``depth`` replays ahead of the GPU (a stream whose oldest queued replay has not finished is passed
    over that round, so a slow step does not hold the others back): replays per second in total and per
    mixer (mean over its streams), and ``full_stream_share``, the share of the loop's visits that found a
    stream full (near 0: the host loop, not the GPU, sets the pace). ``stack`` > 1: each stream's step
    trains that many trials stacked into one model, and ``trial_steps_per_s`` counts each of them.
    ``mixers``: only these of the mix (round robin), e.g. one, to see what its step takes of a shared GPU."""
    t0 = time.time()
    built = []
    for i in range(max(counts)):
        stream = torch.cuda.Stream()
        graph, mixer, step = _step_graph(task, i, stream, stack, mixers)
        built.append((graph, mixer, step, stream))
    for graph, _, _, stream in built:
        with torch.cuda.stream(stream):
            for _ in range(20):
                graph.replay()
    torch.cuda.synchronize()
    setup_s = time.time() - t0
    rows = []
    home = torch.cuda.current_stream()
    for n in counts:
        used = built[:n]
        queued = [collections.deque() for _ in used]
        done = [0] * n
        waits = 0  # passes over a full stream: near 0 means the host, not the GPU, sets the pace
        t0 = time.perf_counter()
        try:
            while time.perf_counter() - t0 < seconds:
                for i, (graph, _, _, stream) in enumerate(used):
                    q = queued[i]
                    if len(q) >= depth:
                        if not q[0].query():
                            waits += 1
                            continue
                        q.popleft()
                    torch.cuda.set_stream(stream)
                    graph.replay()
                    event = torch.cuda.Event()
                    event.record(stream)
                    q.append(event)
                    done[i] += 1
        finally:
            torch.cuda.set_stream(home)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        rows.append(
            {
                "task": task,
                "streams": n,
                "stack": stack,
                "setup_s": round(setup_s, 1),
                "max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                "replays_per_s": round(sum(done) / elapsed),
                "trial_steps_per_s": round(stack * sum(done) / elapsed),
                "full_stream_share": round(waits / max(1, waits + sum(done)), 3),
                "per_stream": mean_by_label((b[1], count / elapsed) for b, count in zip(used, done)),
            }
        )
    return rows


def gpu_share(per_stream: dict[str, float], mixers: list[str], streams: int, shared_us: dict[str, float]) -> float:
    """The share of the GPU that ``streams`` streams (mixers ``mixers`` round robin) running at
    ``per_stream`` replays/s each (by mixer) take, if a step of mixer ``m`` takes ``shared_us[m]`` µs of
    it: near 1 for a saturated GPU whose steps' shares add up."""
    on = collections.Counter(mixers[i % len(mixers)] for i in range(streams))
    return sum(per_stream[m] * on[m] * shared_us[m] for m in on) / 1e6


def mix_shares(task: str, streams: int, seconds: float) -> list[dict]:
    """``shares`` (module docstring): one row per mixer of ``task``'s mix replayed alone on ``streams``
    streams, with its ``shared_us`` per step, then the mix's row with ``gpu_share``."""
    mixers = [spec.model.mixer for spec in mix_specs(task)]
    shared_us, rows = {}, []
    for mixer in mixers:
        rate = replay_streams(task, [streams], seconds, mixers=[mixer])[0]["replays_per_s"]
        shared_us[mixer] = 1e6 / rate
        rows.append(
            {
                "task": task,
                "mixer": mixer,
                "streams": streams,
                "steps_per_s": rate,
                "shared_us": round(shared_us[mixer], 1),
            }
        )
    mix = replay_streams(task, [streams], seconds)[0]
    rows.append(
        {
            "task": task,
            "mixer": "mix",
            "streams": streams,
            "steps_per_s": mix["replays_per_s"],
            "per_stream": mix["per_stream"],
            "gpu_share": round(gpu_share(mix["per_stream"], mixers, streams, shared_us), 3),
        }
    )
    return rows


def _worker(args: list[str]) -> None:
    """One process: build the graph, signal ready, wait for the go file, replay for the given seconds."""
    kind, index, seconds, go = args[0], int(args[1]), float(args[2]), args[3]
    torch.set_num_threads(1)
    if kind == "kernels":
        (graph, _buffer), label = _noop_graph(int(args[4]), int(args[5])), f"ctas={args[4]}"
    else:
        graph, label, _step = _step_graph(args[4], index)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    open(f"{go}.ready{index}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            graph.replay()
        n += 20
    torch.cuda.synchronize()
    print(json.dumps({"label": label, "replays_per_s": n / (time.perf_counter() - t0)}), flush=True)


def run_together(kind: str, procs: int, seconds: float, extra: list[str]) -> dict:
    """``procs`` worker processes under one MPS daemon; their replay rates, in total and per label."""
    from experiments.engines.mps import cuda_mps

    go = tempfile.mktemp(prefix="saturation-go-")
    with cuda_mps(True):
        t0 = time.time()
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.training.saturation",
                    "_worker",
                    kind,
                    str(i),
                    str(seconds),
                    go,
                    *extra,
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(procs)
        ]
        while len(glob.glob(go + ".ready*")) < procs:
            if any(w.poll() is not None for w in workers):
                raise RuntimeError(
                    f"a {kind} worker exited before it was ready (exit codes {[w.poll() for w in workers]})"
                )
            time.sleep(0.1)
        setup_s = time.time() - t0
        open(go, "w").close()
        rows = [json.loads(w.communicate()[0].strip().splitlines()[-1]) for w in workers]
    for path in glob.glob(go + "*"):
        os.remove(path)
    return {
        "procs": procs,
        "setup_s": round(setup_s, 1),
        "replays_per_s": round(sum(r["replays_per_s"] for r in rows)),
        "per_process": mean_by_label((r["label"], r["replays_per_s"]) for r in rows),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        _worker(argv[1:])
        return
    if argv[:1] == ["_counters"]:
        _counters_worker(argv[1], int(argv[2]))
        return
    p = argparse.ArgumentParser(prog="python -m benchmarks.training.saturation", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    k = sub.add_parser("kernels", help="graphs of no-op kernels of G CTAs (the GPU front end's capacity)")
    k.add_argument("--ctas", default="1,16,64,256", help="CTAs per kernel, comma-separated")
    k.add_argument("--kernels", type=int, default=80, help="kernels per graph (default 80, about one compiled step)")
    s = sub.add_parser("steps", help="compiled training steps of the Table 6 mix")
    s.add_argument("--tasks", default="khop2", help="task entries of pararnn-table6, comma-separated")
    for q in (k, s):
        q.add_argument("--procs", default="16", help="process counts, comma-separated")
        q.add_argument("--seconds", type=float, default=10.0, help="replay time per run")
    sl = sub.add_parser("slots", help="each mixer's compiled step alone: kernel µs weighted by the GPU's CTA slots")
    sl.add_argument("--tasks", default="khop2", help="task entries of pararnn-table6, comma-separated")
    sl.add_argument("--top", type=int, default=5, help="kernels listed per step (default 5)")
    sh = sub.add_parser("shares", help="each mixer's step alone on a saturated GPU: the µs of it one step takes")
    sh.add_argument("--tasks", default="khop2", help="task entries of pararnn-table6, comma-separated")
    sh.add_argument("--streams", type=int, default=16, help="streams replaying at once (default 16)")
    sh.add_argument("--seconds", type=float, default=6.0, help="replay time per run")
    c = sub.add_parser("counters", help="each mixer's compiled step under ncu: the GPU time of each shared resource")
    c.add_argument("--tasks", default="khop2", help="task entries of pararnn-table6, comma-separated")
    c.add_argument("--top", type=int, default=6, help="kernels listed per step, by warp-cycles (default 6)")
    c.add_argument("--csv-dir", help="also write each step's raw counters (CSV) to this folder")
    st = sub.add_parser("streams", help="the compiled steps on several streams of one process, no MPS")
    st.add_argument("--tasks", default="khop2", help="task entries of pararnn-table6, comma-separated")
    st.add_argument("--streams", default="1,4,8,16", help="stream counts, comma-separated")
    st.add_argument("--seconds", type=float, default=10.0, help="replay time per count")
    st.add_argument("--depth", type=int, default=4, help="replays queued per stream at most (default 4)")
    st.add_argument("--stack", type=int, default=1, help="trials stacked into each stream's step (default 1)")
    st.add_argument(
        "--mixers", type=mixer_list, help="only these mixers of the mix, comma-separated (default: all, round robin)"
    )
    args = p.parse_args(argv)
    if args.mode in ("streams", "shares"):  # read when the CUDA context is created: before anything touches CUDA
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (none is visible)")
    if args.mode == "streams":
        counts = sorted(int(v) for v in args.streams.split(","))
        for task in args.tasks.split(","):
            for row in replay_streams(task, counts, args.seconds, args.depth, args.stack, args.mixers):
                print(json.dumps(row), flush=True)
        return
    if args.mode == "shares":
        for task in args.tasks.split(","):
            for row in mix_shares(task, args.streams, args.seconds):
                print(json.dumps(row), flush=True)
        return
    if args.mode == "counters":
        for task in args.tasks.split(","):
            for row in profile_counters(task, args.top, args.csv_dir):
                print(json.dumps(row), flush=True)
        return
    if args.mode == "slots":
        for task in args.tasks.split(","):
            for row in profile_slots(task, args.top):
                print(json.dumps(row), flush=True)
        return
    for n in (int(v) for v in args.procs.split(",")):
        if args.mode == "kernels":
            for g in (int(v) for v in args.ctas.split(",")):
                row = run_together("kernels", n, args.seconds, [str(g), str(args.kernels)])
                row.update(
                    ctas=g,
                    kernels_per_s=row["replays_per_s"] * args.kernels,
                    ctas_per_s=row["replays_per_s"] * args.kernels * g,
                )
                print(json.dumps(row), flush=True)
        else:
            for task in args.tasks.split(","):
                row = run_together("steps", n, args.seconds, [task])
                print(json.dumps({"task": task, **row}), flush=True)


if __name__ == "__main__":
    main()
