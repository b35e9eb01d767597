"""What every family's benchmark shares: rows with structured dimensions, timing, physical limits,
the check-then-time runner, tables and the JSON results file.

Times are medians in milliseconds: on CUDA ``triton.testing.do_bench`` (CUDA events, after warm-up),
on the CPU wall-clock medians. A family module builds ``Problem``s (dimensions, dtype, limits) with
``Impl``s (the implementations: ours and the peers) and hands them to ``run``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
import torch

RESULTS = Path(__file__).parent / "results"
PEERS = ("pararnn-torch", "flashrnn", "mlstm-kernels", "accelerated-scan", "fla-core", "mamba-ssm")


@dataclasses.dataclass
class BenchRow:
    """One timed implementation at one problem.

    ``dims``: the problem's dimensions (``batch``, ``length``, ``dim``, ``heads``, ``head_dim``,
    ``state``, ``chunk``, ``cell`` ...), one column each in the JSON; ``ms``: median time (``nan`` when
    skipped or failed, ``note`` says why); ``limit_ms``: the physical floor of the same work (bytes /
    copy bandwidth or FLOPs / matmul rate); ``max_rel_err``: the check against the reference;
    ``section``: the part of the benchmark (``main``, ``sweep`` ...).
    """

    family: str
    impl: str
    direction: str  # "fwd", "bwd" or "fwd+bwd"
    dtype: str
    dims: dict
    ms: float
    limit_ms: float = math.nan
    max_rel_err: float = math.nan
    section: str = "main"
    note: str = ""
    extra: dict = dataclasses.field(default_factory=dict)

    def record(self) -> dict:
        """The flat JSON record: the fields with ``dims`` spread into columns."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "dims"}
        return {**{k: out.pop(k) for k in ("family", "section", "impl", "direction", "dtype")}, **self.dims, **out}


DIM_ORDER = (
    "cell",
    "kind",
    "gate",
    "batch",
    "length",
    "heads",
    "head_dim",
    "dim",
    "qk_dim",
    "v_dim",
    "state",
    "groups",
    "chunk",
    "chunks",
)


def dims_label(dims: dict) -> str:
    """``batch=8 length=4096 dim=1024`` (ordered by ``DIM_ORDER``), for tables and logs."""
    keys = [k for k in DIM_ORDER if k in dims] + sorted(k for k in dims if k not in DIM_ORDER)
    return " ".join(f"{k}={dims[k]}" for k in keys)


def time_ms(fn: Callable[[], object], *, warmup: int = 25, rep: int = 100, device: str | None = None) -> float:
    """Median wall time of ``fn()`` in ms. CUDA: ``do_bench`` (warmup/rep in ms); CPU: counts."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    for _ in range(max(1, min(warmup, 3))):
        fn()
    samples = []
    budget = time.perf_counter() + max(rep, 1) / 1000.0 * 20  # at most ~20x rep ms of samples
    while len(samples) < 5 or (time.perf_counter() < budget and len(samples) < 50):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return float(statistics.median(samples))


def warm_up_for_capture(fn: Callable[[], object], calls: int = 3) -> None:
    """``fn`` run ``calls`` times on a side stream, as CUDA-graph capture wants before it (compilation,
    autotuning, allocator pools)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(calls):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def graph_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured in one CUDA graph (after ``warm_up_for_capture``); returns the graph's ``replay``:
    timing it gives the GPU's time for ``fn`` without the host's launches."""
    warm_up_for_capture(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def issue_times(fn: Callable[[], object], n: int, *, warmup: int = 3) -> tuple[float, float]:
    """``(host µs per call, µs per call until the GPU is done)`` over ``n`` calls of ``fn`` issued back
    to back on CUDA, synchronized only before and after (the first is the host's issue cost while the
    GPU keeps up; both are the host's when the GPU work is tiny)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


def copy_bandwidth_gbs(device: str = "cuda", nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device=device)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def matmul_tflops(device: str = "cuda", dtype: torch.dtype = torch.bfloat16, n: int = 8192) -> float:
    """Measured dense matmul rate in TFLOP/s on random ``n x n`` operands."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = time_ms(lambda: a @ b, device=device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; ``inf`` when ``out`` has a NaN or Inf."""
    out64, ref64 = out.detach().double(), ref.detach().double().to(out.device)
    if not torch.isfinite(out64).all():
        return math.inf
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300))


def max_rel_error(got: Iterable[torch.Tensor | None], want: Iterable[torch.Tensor | None]) -> float:
    """The largest ``rel_error`` over pairs (pairs with a ``None`` are skipped)."""
    return max((rel_error(g, w) for g, w in zip(got, want) if g is not None and w is not None), default=math.nan)


def grads(fn: Callable, inputs: list[torch.Tensor], dy: torch.Tensor) -> list[torch.Tensor]:
    """``[y, *dy/dinputs]`` of ``y = fn(*inputs)`` for the output gradient ``dy`` (fresh leaves)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    y = fn(*leaves)
    return [y.detach(), *torch.autograd.grad(y, leaves, dy.to(y.dtype), allow_unused=True)]


def fwd_bwd(fn: Callable, inputs: list[torch.Tensor], dy: torch.Tensor) -> Callable[[], object]:
    """A thunk running ``fn`` forward and backward (``autograd.grad`` w.r.t. every input)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    return lambda: torch.autograd.grad(fn(*leaves), leaves, dy)


def no_grad(fn: Callable, *args) -> Callable[[], object]:
    """A thunk running ``fn(*args)`` without autograd."""

    def run():
        with torch.no_grad():
            return fn(*args)

    return run


def lift_fla_gated_guard() -> Callable[[], None]:
    """Let fla's own Triton gated ``chunk_bwd_dqkwg`` run where fla refuses it (Hopper GPUs with Triton >= 3.4,
    < 3.7.1: wrong results, fla issue #640) and where ``seqkernels.delta.fla_gated_bwd`` stands in for it, so a
    benchmark can time it; its check against the reference shows whether it is wrong there. Returns the
    function that puts both back."""
    import fla.ops.common.chunk_o as chunk_o

    from seqkernels.delta import fla_gated_bwd

    saved = chunk_o.TRITON_ABOVE_3_7_1, fla_gated_bwd.triton_refuses
    chunk_o.TRITON_ABOVE_3_7_1, fla_gated_bwd.triton_refuses = True, lambda: False

    def restore() -> None:
        chunk_o.TRITON_ABOVE_3_7_1, fla_gated_bwd.triton_refuses = saved

    return restore


def git_commit() -> str:
    """Short git commit of the suite's checkout, ``-dirty`` appended when its files differ from that commit
    (a copy whose ``.git`` is older than its files says so); ``"unknown"`` outside a checkout."""
    try:
        return (
            subprocess.run(
                ["git", "describe", "--always", "--dirty", "--abbrev=7"],
                cwd=Path(__file__).parent,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or "unknown"
        )
    except Exception:
        return "unknown"


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def environment(device: str) -> dict:
    """Device name, library versions, date and commit, for the JSON header."""
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "commit": os.environ.get("BENCH_COMMIT") or git_commit(),
    }
    for peer in PEERS:
        env[peer] = _version(peer)
    return env


# ---------------------------------------------------------------- problems and the runner


@dataclasses.dataclass
class Impl:
    """One implementation at one problem: thunks for the forward and the forward + backward (``None``:
    not timed) and ``check() -> max relative error`` against the reference (``None``: not checked)."""

    name: str
    fwd: Callable[[], object] | None
    fwd_bwd: Callable[[], object] | None = None
    check: Callable[[], float] | None = None
    note: str = ""
    time_kw: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Problem:
    """A problem of one family: dimensions, dtype, physical limits (ms) per direction, implementations
    (built lazily: ``impls()``, so inputs live only while the problem runs)."""

    family: str
    dims: dict
    dtype: str
    impls: Callable[[], list[Impl]]
    limits: dict = dataclasses.field(default_factory=dict)
    section: str = "main"
    #: implementation name -> {device kernel name: its physical limit, ms per fwd+bwd call}, for the profile
    kernel_limits: Callable[[str], dict[str, float]] | None = None


def run(
    problems: Iterable[Problem],
    *,
    warm_only: bool = False,
    log: Callable[[str], None] = print,
    checkpoint: Callable[[list[BenchRow]], object] | None = None,
    graph: bool = False,
    profile: Callable[[str], bool] | None = None,
) -> list[BenchRow]:
    """Check, then time, every implementation of every problem; a failing implementation gives a row
    with ``ms = nan`` and the error in ``note``. ``warm_only``: run each thunk once (compiles and
    autotunes), neither check nor time. ``checkpoint(rows)`` after every implementation (a run cut
    short keeps what it timed). ``graph``: also time each thunk replayed from a CUDA graph
    (``extra["graph_ms"]``; ``extra["graph_error"]`` where it cannot be captured). ``profile(name)``
    true: also the implementation's heaviest kernels (``kernel_times``; ``extra["kernels"]``, logged)."""
    rows: list[BenchRow] = []
    for pb in problems:
        try:
            impls = pb.impls()
        except Exception as err:  # noqa: BLE001 - e.g. out of memory building inputs
            rows.append(
                BenchRow(
                    pb.family,
                    "-",
                    "fwd",
                    pb.dtype,
                    pb.dims,
                    math.nan,
                    section=pb.section,
                    note=f"failed: {type(err).__name__}: {err}"[:200],
                )
            )
            continue
        for impl in impls:
            rows += _run_impl(pb, impl, warm_only, log, graph, profile is not None and profile(impl.name))
            if checkpoint is not None and not warm_only:
                checkpoint(rows)
        del impls
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def kernel_times(thunk: Callable[[], object], calls: int = 5, top: int = 8) -> list[dict]:
    """The ``top`` device kernels of ``thunk`` by device time over ``calls`` calls (after one untimed call),
    each ``{"kernel": name, "ms": device ms per call of thunk, "launches": launches per call}``
    (``torch.profiler``; CPU ops where no CUDA device is present)."""
    from torch.profiler import ProfilerActivity, profile

    thunk()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            thunk()
        if cuda:
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if (e.self_device_time_total if cuda else e.self_cpu_time_total) > 0]
    events.sort(key=lambda e: e.self_device_time_total if cuda else e.self_cpu_time_total, reverse=True)
    return [
        {
            "kernel": e.key[:80],
            "ms": (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e3 / calls,
            "launches": e.count / calls,
        }
        for e in events[:top]
    ]


def kernel_lines(kernels: list[dict]) -> str:
    """``kernel_times``' kernels, a line each: ms per call, launches per call, name (and where a kernel has a
    ``limit_ms``, its physical limit and the time as a multiple of it)."""

    def limit(k: dict) -> str:
        return f"  (limit {k['limit_ms']:.4f} ms: {k['ms'] / k['limit_ms']:.1f}x)" if k.get("limit_ms") else ""

    return "\n".join(f"  {k['ms']:9.4f} ms  x{k['launches']:g}  {k['kernel']}{limit(k)}" for k in kernels)


def _graph_time(thunk: Callable[[], object], time_kw: dict) -> dict:
    """``{"graph_ms": ...}``, or ``{"graph_error": ...}`` where the thunk cannot be captured."""
    try:
        return {"graph_ms": time_ms(graph_replay(thunk), **time_kw)}
    except Exception as e:  # noqa: BLE001 - not capturable: the eager time stands alone
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"graph_error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}


def _run_impl(
    pb: Problem, impl: Impl, warm_only: bool, log, graph: bool = False, profile: bool = False
) -> list[BenchRow]:
    out = []
    if impl.fwd is None and impl.fwd_bwd is None:  # not available here: a row that says why
        return [BenchRow(pb.family, impl.name, "fwd", pb.dtype, pb.dims, math.nan, section=pb.section, note=impl.note)]
    try:
        if warm_only:
            for thunk in (impl.fwd, impl.fwd_bwd):
                if thunk is not None:
                    thunk()
            return []
        err = impl.check() if impl.check is not None else math.nan
        for direction, thunk in (("fwd", impl.fwd), ("fwd+bwd", impl.fwd_bwd)):
            if thunk is None:
                continue
            ms = time_ms(thunk, **impl.time_kw)
            extra = _graph_time(thunk, impl.time_kw) if graph else {}
            if profile:
                extra["kernels"] = kernel_times(thunk)
                limits = pb.kernel_limits(impl.name) if pb.kernel_limits and direction == "fwd+bwd" else {}
                for k in extra["kernels"]:
                    if k["kernel"] in limits:
                        k["limit_ms"] = limits[k["kernel"]]
                log(f"{impl.name} {direction}: device kernels per call\n{kernel_lines(extra['kernels'])}")
            out.append(
                BenchRow(
                    pb.family,
                    impl.name,
                    direction,
                    pb.dtype,
                    pb.dims,
                    ms,
                    pb.limits.get(direction, math.nan),
                    err,
                    pb.section,
                    impl.note,
                    extra,
                )
            )
            replay = f", graph replay {extra['graph_ms']:.4g} ms" if "graph_ms" in extra else ""
            log(
                f"{pb.family} {dims_label(pb.dims)} {pb.dtype} {impl.name} {direction}: {ms:.4g} ms{replay} (err {err:.2g})"
            )
    except Exception as e:  # noqa: BLE001 - a failing implementation is reported, the others still run
        msg = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
        log(f"{pb.family} {dims_label(pb.dims)} {pb.dtype} {impl.name}: {msg}")
        out.append(BenchRow(pb.family, impl.name, "fwd+bwd", pb.dtype, pb.dims, math.nan, section=pb.section, note=msg))
    return out


# ---------------------------------------------------------------- output


def _num(x: object, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) and x == x else "-"


def table(rows: Iterable[BenchRow], *, baseline: str | None = None) -> str:
    """Rows as a Markdown table (returned), with each row's time ratio to ``baseline`` (an impl name)
    at the same problem and direction, and the share of the physical limit."""
    rows = list(rows)
    replayed = any("graph_ms" in r.extra for r in rows)
    key = lambda r: (r.section, dims_label(r.dims), r.direction, r.dtype)  # noqa: E731
    base = {key(r): r.ms for r in rows if r.impl == baseline}
    out = []
    for r in rows:
        b = base.get(key(r), math.nan)
        ratio = r.ms / b if b == b and r.ms == r.ms else math.nan
        eff = r.limit_ms / r.ms if r.limit_ms == r.limit_ms and r.ms == r.ms else math.nan
        out.append(
            {
                "problem": dims_label(r.dims),
                "dtype": r.dtype,
                "dir": r.direction,
                "impl": r.impl,
                "ms": _num(r.ms, ".4g"),
                **({"graph ms": _num(r.extra.get("graph_ms", math.nan), ".4g")} if replayed else {}),
                f"vs {baseline or '-'}": _num(ratio, ".3g") + "x",
                "limit ms": _num(r.limit_ms, ".4g"),
                "limit/ms": _num(eff, ".0%"),
                "rel err": _num(r.max_rel_err, ".2g"),
                "note": r.note,
            }
        )
    return pd.DataFrame(out).to_markdown(index=False, disable_numparse=True)


def write_json(family: str, rows: Iterable[BenchRow], env: dict, out_dir: str | os.PathLike = RESULTS) -> Path:
    """Write ``{family, env, rows}`` to ``<out_dir>/<family>.json`` (replacing the previous results)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{family}.json"
    payload = {"family": family, "env": env, "rows": [r.record() for r in rows]}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(path)
    return path


def cli_common(parser) -> None:
    """The options every family's benchmark takes."""
    parser.add_argument("--out", default=str(RESULTS), help=f"folder for <family>.json (default {RESULTS})")
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="run every timed implementation once (compile, autotune); no check, no timing, no JSON",
    )


def finish(family: str, rows: list[BenchRow], env: dict, args, *, baseline: str | None = None) -> None:
    """Print the table and write the JSON (not after ``--warm-only``)."""
    if args.warm_only:
        print(f"{family}: warm-up done")
        return
    print(f"# {family} benchmark on {env['device']}, {env['date']}")
    print(table(rows, baseline=baseline))
    print("written:", write_json(family, rows, env, args.out))
