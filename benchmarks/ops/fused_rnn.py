"""``python -m benchmarks.ops fused_rnn``: check, then time, the fused_rnn family on one GPU.

One run does both:

1. **Check** every Triton path (fused, alternating; every cell, head size and dtype at the benchmark
   shapes, plus the batch sweep and each tuning variant) against the float64 reference loop on
   fresh random inputs with NaN-poisoned outputs: forward (h, last states) and all gradients (wx, R,
   b, initial states). Pass: relative error <= 1e-4 (float32), <= 2e-2 (bfloat16). The checks run
   in parallel worker processes, which also compiles every kernel that is timed later.
2. **Time** (``triton.testing.do_bench`` medians) our fused / alternating kernels, ``flashrnn``'s
   ``triton_fused`` (and ``cuda_fused`` with ``--cuda-peer``), cuDNN ``nn.LSTM`` / ``nn.GRU`` with one
   head of 768 (which also does the input projection), and the reference loop, at B=16, T=1024,
   NH x DH in {48x16, 24x32, 12x64, 6x128} (768 in total), forward and forward+backward, float32
   and bfloat16; and a batch sweep B in {16, 64, 256} at 12x64.

Writes ``<out>/fused_rnn.json`` and prints the table. Options: ``--quick`` (T=256, fewer shapes),
``--heads 12x64,48x16`` / ``--batches 16,64`` (fewer shapes), ``--no-check``, ``--tune`` (time launch
variants), ``--workers N``, ``--out DIR``, ``--cuda-peer`` (try building flashrnn's CUDA kernel, slow),
``--warm-only`` (the checks only: they compile every kernel that is timed).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import math
import multiprocessing
import time
import traceback

import torch

from benchmarks.ops.common import (
    BenchRow,
    cli_common,
    copy_bandwidth_gbs,
    environment,
    matmul_tflops,
    rel_error,
    table,
    time_ms,
    write_json,
)
from seqkernels.fused_rnn.reference import cell_spec

DEVICE = "cuda"  # the CPU tests set "cpu" (with TRITON_INTERPRET=1) to exercise this module
HEAD_SHAPES = ((48, 16), (24, 32), (12, 64), (6, 128))
BATCHES = (16, 64, 256)
TOL = {"float32": 1e-4, "bfloat16": 2e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: launch variants checked and timed with --tune: (cell, batch, NH, DH, dtype) -> variant names;
#: a name lists "/"-separated fields of ``fused.LaunchConfig`` replacing the default: bbN (batch block), wN (warps),
#: ieee | tf32x3 | tf32 (float32 dot precision), accdr | dRafter (dR in registers | after the kernel),
#: dbreg | dbafter (backward: db summed in registers | ``dg.sum`` after the kernel), fma (bfloat16
#: dots in float32 on the FMA units)
TUNE = {
    ("lstm", 16, 12, 64, "float32"): ("bb2/w4", "bb4/w8", "bb8/w8", "bb4/w4/dbafter", "bb4/w4/tf32"),
    ("lstm", 16, 12, 64, "bfloat16"): (
        "bb16/w4/accdr",
        "bb16/w8/dRafter",
        "bb16/w8/dbreg",
        "bb4/w4/fma/dbreg/dRafter",
        "bb2/w4/fma/dbreg/dRafter",
    ),
    ("slstm", 16, 12, 64, "float32"): ("bb2/w4", "bb4/w8"),
    ("slstm", 16, 12, 64, "bfloat16"): ("bb16/w8/dRafter", "bb4/w4/fma/dbreg/dRafter"),
    ("gru", 16, 12, 64, "float32"): ("bb2/w4", "bb4/w8"),
    ("gru", 16, 12, 64, "bfloat16"): ("bb4/w4/fma/dbreg/dRafter",),
    ("lstm", 64, 12, 64, "float32"): ("bb8/w8", "bb16/w8"),
    ("lstm", 256, 12, 64, "float32"): ("bb16/w8", "bb32/w8"),
    ("lstm", 16, 48, 16, "float32"): ("bb4/w4", "bb16/w4"),
}


def parse_variant(name: str) -> dict:
    """``"bb4/w8/ieee/dRafter"`` -> ``{"block_b": 4, "num_warps": 8, "precision": "ieee", "acc_dr": False}``."""
    out: dict = {}
    for tok in name.split("/"):
        if tok.startswith("bb"):
            out["block_b"] = int(tok[2:])
        elif tok.startswith("w"):
            out["num_warps"] = int(tok[1:])
        elif tok in ("ieee", "tf32x3", "tf32"):
            out["precision"] = tok
        elif tok in ("accdr", "dRafter"):
            out["acc_dr"] = tok == "accdr"
        elif tok in ("dbreg", "dbafter"):
            out["acc_db"] = tok == "dbreg"
        elif tok == "fma":
            out["fma"] = True
        else:
            raise ValueError(f"unknown launch variant token {tok!r} in {name!r}")
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    """One (cell, shape, dtype) problem; ``backend`` is ours ("fused" | "alternating")."""

    cell: str
    batch: int
    length: int
    num_heads: int
    head_dim: int
    dtype: str
    backend: str = "fused"
    variant: str = ""

    @property
    def dims(self) -> dict:
        return {
            "cell": self.cell,
            "batch": self.batch,
            "length": self.length,
            "heads": self.num_heads,
            "head_dim": self.head_dim,
        }

    @property
    def shape(self) -> str:
        return f"{self.cell} B{self.batch} T{self.length} {self.num_heads}x{self.head_dim}"

    @property
    def impl(self) -> str:
        return f"ours-{self.backend}" + (f"[{self.variant}]" if self.variant else "")


def make_inputs(case: Case, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    """Random wx ~ N(0, 1), R ~ U(+-1/sqrt(DH)), b ~ N(0, 0.01), initial states (sLSTM: n > 0)."""
    spec = cell_spec(case.cell)
    g = torch.Generator(device=device).manual_seed(seed)
    B, T, NH, DH = case.batch, case.length, case.num_heads, case.head_dim
    dt = DTYPES[case.dtype]
    wx = torch.randn(B, T, NH, spec.input_gates, DH, device=device, generator=g)
    R = (torch.rand(NH, DH, spec.recurrent_gates, DH, device=device, generator=g) * 2 - 1) / math.sqrt(DH)
    b = 0.1 * torch.randn(NH, spec.bias_gates, DH, device=device, generator=g)
    s0 = torch.randn(spec.num_states, B, NH, DH, device=device, generator=g)
    if case.cell == "slstm":
        s0[2] = s0[2].abs() + 0.5
        s0[3] = 0.1 * s0[3]
    return tuple(x.to(dt) for x in (wx, R, b, s0))


def backend_fn(case: Case, overrides: dict | None):
    """Our backend ``case.backend`` as ``fn(cell, wx, R, b, s0)``; ``overrides``: ``LaunchConfig`` fields
    replacing the fused kernel's defaults."""
    from seqkernels.fused_rnn import BACKENDS, fused

    if not overrides:
        return BACKENDS[case.backend]

    def run(cell, wx, R, b, s0):
        cfg = fused.launch_config(cell, wx.shape[0], wx.shape[2], wx.shape[4], wx.dtype)
        return fused.fused_rnn_fused(cell, wx, R, b, s0, config=dataclasses.replace(cfg, **overrides))

    return run


def _run(fn, case: Case, inputs, dy, dlast):
    wx, R, b, s0 = (x.detach().requires_grad_() for x in inputs)
    h, last = fn(case.cell, wx, R, b, s0)
    grads = torch.autograd.grad((h, last), (wx, R, b, s0), (dy, dlast))
    return (h, last, *grads)


def check_case(case: Case, overrides: dict | None = None, seed: int = 0) -> dict:
    """Compare one backend with the float64 reference: forward and all gradients, poisoned outputs."""
    from seqkernels._triton import poisoned
    from seqkernels.fused_rnn import fused_rnn_reference

    out = {"case": dataclasses.asdict(case), "overrides": overrides or {}}
    try:
        t0 = time.perf_counter()
        inputs = make_inputs(case, DEVICE, seed)
        g = torch.Generator(device=DEVICE).manual_seed(seed + 1)
        spec = cell_spec(case.cell)
        B, T, NH, DH = case.batch, case.length, case.num_heads, case.head_dim
        dy = torch.randn(B, T, NH, DH, device=DEVICE, generator=g).to(inputs[0].dtype)
        dlast = torch.randn(spec.num_states, B, NH, DH, device=DEVICE, generator=g).to(inputs[0].dtype)
        with poisoned():
            got = _run(backend_fn(case, overrides), case, inputs, dy, dlast)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        ref = _run(fused_rnn_reference, case, [x.double() for x in inputs], dy.double(), dlast.double())
        names = ("h", "last", "dwx", "dR", "db", "ds0")
        errs = {n: rel_error(a, r) for n, a, r in zip(names, got, ref)}
        out.update(errors=errs, max_rel_err=max(errs.values()), ok=max(errs.values()) <= TOL[case.dtype])
        out["seconds"] = time.perf_counter() - t0
    except Exception as err:  # noqa: BLE001 - report, keep going
        out.update(errors={}, max_rel_err=math.inf, ok=False, error=f"{type(err).__name__}: {err}"[:300])
        out["trace"] = traceback.format_exc()[-1500:]
    return out


# ------------------------------------------------------------------ timing


def _time(fn) -> float:
    return time_ms(fn, warmup=25, rep=100, device=DEVICE)


def _time_slow(fn, reps: int = 3) -> float:
    """Median of a few timed calls after one warm-up, for implementations of ~1 s per call."""
    fn()
    samples = []
    for _ in range(reps):
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)[len(samples) // 2]


def time_ours(case: Case, overrides: dict | None = None) -> tuple[float, float]:
    """(forward ms, forward+backward ms) of our backend ``case.backend`` (or "reference")."""
    fn = backend_fn(case, overrides)
    wx, R, b, s0 = make_inputs(case, DEVICE, seed=7)
    dy = torch.randn(case.batch, case.length, case.num_heads, case.head_dim, device=DEVICE).to(wx.dtype)
    leaves = [x.detach().requires_grad_() for x in (wx, R, b, s0)]

    def fwd():
        with torch.no_grad():
            fn(case.cell, wx, R, b, s0)

    def fwdbwd():
        h, _ = fn(case.cell, *leaves)
        torch.autograd.grad(h, leaves, dy)

    timer = _time_slow if case.backend == "reference" else _time
    return timer(fwd), timer(fwdbwd)


def time_flashrnn(case: Case, backend: str, once: bool = False) -> tuple[float, float]:
    """flashrnn 1.0.8 (``flashrnn(Wx, R, b, function, backend, dtype)``), same work on random inputs;
    ``once``: run forward and forward + backward once (compile), not timed."""
    from flashrnn import flashrnn as flashrnn_fn

    spec = cell_spec(case.cell)
    B, T, NH, DH = case.batch, case.length, case.num_heads, case.head_dim
    dt = DTYPES[case.dtype]
    wx = torch.randn(B, T, spec.input_gates, NH, DH, device=DEVICE, dtype=dt)
    R = (torch.randn(spec.recurrent_gates, NH, DH, DH, device=DEVICE) / math.sqrt(DH)).to(dt)
    b = torch.randn(spec.bias_gates, NH, DH, device=DEVICE, dtype=dt)
    dy = torch.randn(B, T, NH, DH, device=DEVICE, dtype=dt)
    leaves = [x.requires_grad_() for x in (wx, R, b)]

    def call():
        return flashrnn_fn(*leaves, function=case.cell, backend=backend, dtype=case.dtype)

    def fwd():
        with torch.no_grad():
            call()

    def fwdbwd():
        states, _ = call()
        torch.autograd.grad(states[0], leaves, dy)

    if once:
        fwd(), fwdbwd()
        return math.nan, math.nan
    return _time(fwd), _time(fwdbwd)


def time_cudnn(cell: str, batch: int, length: int, dtype: torch.dtype, d: int = 768) -> tuple[float, float]:
    """cuDNN ``nn.LSTM(d, d)`` / ``nn.GRU(d, d)``: one head of d, input projection included."""
    module = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](d, d, batch_first=True).to(DEVICE, dtype)
    x = torch.randn(batch, length, d, device=DEVICE, dtype=dtype, requires_grad=True)
    dy = torch.randn(batch, length, d, device=DEVICE, dtype=dtype)
    params = [x, *module.parameters()]

    def fwd():
        with torch.no_grad():
            module(x)

    def fwdbwd():
        y, _ = module(x)
        torch.autograd.grad(y, params, dy)

    return _time(fwd), _time(fwdbwd)


def limits(case: Case, bw_gbs: float, tflops: dict[str, float]) -> tuple[float, float]:
    """Physical floors (ms) of forward and forward+backward: max(FLOPs / matmul rate, bytes / copy
    bandwidth). FLOPs: the recurrent matmul (x3 with the backward: R^T dg and dR). Bytes: wx read,
    h written (+ the saved states/gates written, read back, dwx written, for training)."""
    spec = cell_spec(case.cell)
    n = case.batch * case.length * case.num_heads * case.head_dim  # elements of h
    el = torch.finfo(DTYPES[case.dtype]).bits // 8
    flops = 2.0 * n * spec.recurrent_gates * case.head_dim
    from seqkernels.fused_rnn.cell_kernels import NUM_SAVED

    fwd_bytes = n * el * (spec.input_gates + 1)
    train_bytes = fwd_bytes + n * 4 * NUM_SAVED[case.cell] * 2 + n * el * (1 + spec.input_gates)
    rate = tflops[case.dtype] * 1e12
    floor = lambda f, by: max(f / rate, by / (bw_gbs * 1e9)) * 1e3
    return floor(flops, fwd_bytes), floor(3 * flops, train_bytes)


# ------------------------------------------------------------------ the run


def _cases(
    length: int, tune: bool, heads=HEAD_SHAPES, batches=BATCHES
) -> tuple[list[tuple[Case, dict]], list[tuple[Case, dict]]]:
    """(check list, time list) of (case, overrides), most important first. B=16 and 12x64 always
    run; ``heads`` / ``batches`` add head shapes (at B=16) and the batch sweep (at 12x64)."""
    heads = [(12, 64)] + [hd for hd in heads if hd != (12, 64)]
    sweep = [bsz for bsz in batches if bsz != 16]
    checks, timed = [], []
    for bsz in sweep:  # the big float64 references first, while few others run
        for dtype in DTYPES:
            checks.append((Case("lstm", bsz, length, 12, 64, dtype, backend="triton"), {}))
    for dtype in DTYPES:
        for cell in ("lstm", "slstm", "gru", "elman"):
            timed.append((Case(cell, 16, length, 12, 64, dtype, backend="triton"), {}))
    for dtype in DTYPES:
        for nh, dh in heads:
            for cell in ("lstm", "gru", "elman", "slstm"):
                c = Case(cell, 16, length, nh, dh, dtype, backend="triton")
                checks.append((c, {}))
                if cell == "lstm" and (nh, dh) != (12, 64):
                    timed.append((c, {}))
            checks.append((Case("lstm", 16, length, nh, dh, dtype, backend="alternating"), {}))
        timed.append((Case("lstm", 16, length, 12, 64, dtype, backend="alternating"), {}))
        timed += [(Case("lstm", bsz, length, 12, 64, dtype, backend="triton"), {}) for bsz in sweep]
    if tune:
        for (cell, bsz, nh, dh, dt), names in TUNE.items():
            if (nh, dh) not in heads or bsz not in [16, *sweep]:
                continue
            for v in names:
                o = parse_variant(v)
                c = Case(cell, bsz, length, nh, dh, dt, backend="fused", variant=v)
                timed.append((c, o))
                # launch variants of the batch sweep are checked at T=128 (the float64 reference of
                # B=256, T=1024 takes ~16 GB; the default launch is checked at full length above)
                checks.append((dataclasses.replace(c, length=min(length, 128)) if bsz > 16 else c, o))

    def priority(item):
        c, _ = item
        return (0 if (c.batch, c.num_heads) == (16, 12) else 2) + (1 if c.variant else 0)

    return checks, sorted(timed, key=priority)


def run_checks(checks: list[tuple[Case, dict]], workers: int, budget_s: float = math.inf) -> list[dict]:
    """Run ``check_case`` over a pool of spawned processes (which also compiles the kernels); checks
    not started within ``budget_s`` seconds are skipped (and reported)."""
    ctx = multiprocessing.get_context("spawn")
    results = []
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(check_case, c, o, i) for i, (c, o) in enumerate(checks)]
        try:
            done = list(cf.as_completed(futures, timeout=budget_s))
        except cf.TimeoutError:
            skipped = sum(f.cancel() for f in futures)
            print(f"check budget of {budget_s:.0f} s spent: {skipped} checks skipped", flush=True)
            cf.wait(futures)
            done = [f for f in futures if not f.cancelled()]
        for fut in done:
            r = fut.result()
            results.append(r)
            c = Case(**r["case"])
            status = "ok  " if r["ok"] else "FAIL"
            print(f"check {status} {c.impl:34s} {c.shape:28s} {c.dtype:8s} max rel err {r['max_rel_err']:.2e} "
                  f"{r.get('error', '')}", flush=True)  # fmt: skip
    return results


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ops fused_rnn", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="T=256, only B=16 and the 12x64 head shape")
    parser.add_argument(
        "--heads",
        default=",".join(f"{nh}x{dh}" for nh, dh in HEAD_SHAPES),
        help="head shapes NHxDH at B=16 (default: all; 12x64 always runs)",
    )
    parser.add_argument(
        "--batches", default=",".join(map(str, BATCHES)), help="batch sweep at 12x64 (default: 16,64,256)"
    )
    parser.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    parser.add_argument("--tune", action="store_true", help="also check and time launch variants")
    parser.add_argument("--workers", type=int, default=8, help="processes for the checks (default 8)")
    parser.add_argument("--cuda-peer", action="store_true", help="also try flashrnn's cuda_fused (builds with nvcc)")
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) reference loop rows")
    parser.add_argument(
        "--budget-s", type=float, default=math.inf, help="stop timing this many seconds after the start"
    )
    parser.add_argument("--check-budget-s", type=float, default=math.inf, help="skip checks not started by then")
    cli_common(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or DEVICE != "cuda":
        raise SystemExit("error: the fused_rnn benchmark needs a CUDA GPU (the CPU tests cover correctness)")
    length = 256 if args.quick else 1024
    heads = [tuple(int(v) for v in hd.split("x")) for hd in args.heads.split(",") if hd]
    batches = [int(v) for v in args.batches.split(",") if v]
    if args.quick:
        heads, batches = [(12, 64)], [16]
    check_list, time_list = _cases(length, args.tune, heads, batches)

    t0 = time.perf_counter()
    results = (
        []
        if args.no_check
        else run_checks(check_list, args.workers, args.check_budget_s if math.isfinite(args.check_budget_s) else None)
    )
    print(
        f"checks: {sum(r['ok'] for r in results)}/{len(results)} passed in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    if args.warm_only:  # the checks compiled ours; run the peers once (flashrnn compiles at first use)
        for case, _ in time_list:
            if case.cell in ("lstm", "slstm") and not case.variant:
                try:
                    time_flashrnn(case, "triton_fused", once=True)
                except Exception as e:  # noqa: BLE001
                    print(f"warm flashrnn {case.shape} {case.dtype}: {type(e).__name__}", flush=True)
        return
    errs = {(tuple(r["case"].values()), str(r["overrides"])): r["max_rel_err"] for r in results}

    env = environment("cuda")
    bw = copy_bandwidth_gbs()
    tflops = {"float32": matmul_tflops(dtype=torch.float32), "bfloat16": matmul_tflops(dtype=torch.bfloat16)}
    env.update(copy_gbs=bw, matmul_tflops=tflops, checks=results)
    print(
        f"copy {bw:.0f} GB/s, matmul fp32 {tflops['float32']:.0f} / bf16 {tflops['bfloat16']:.0f} TFLOP/s",
        flush=True,
    )
    rows: list[BenchRow] = []

    def add(impl, case, fwd_ms, fb_ms, err=math.nan, note="", extra=None):
        lim_f, lim_fb = limits(case, bw, tflops)
        for direction, ms, lim in (("fwd", fwd_ms, lim_f), ("fwd+bwd", fb_ms, lim_fb)):
            ex = {"us_per_step": ms * 1e3 / case.length, **(extra or {})}
            rows.append(
                BenchRow("fused_rnn", impl, direction, case.dtype, case.dims, ms, lim, err, note=note, extra=ex)
            )
        write_json("fused_rnn", rows, env, args.out)  # after every row: a run cut short keeps what it timed
        print(f"time {impl:34s} {case.shape:28s} {case.dtype:8s} fwd {fwd_ms:8.3f} ms  fwd+bwd {fb_ms:8.3f} ms {note}",
              flush=True)  # fmt: skip

    def attempt(impl, case, thunk, err=math.nan, extra=None):
        try:
            add(impl, case, *thunk(), err=err, extra=extra)
        except Exception as e:  # noqa: BLE001 - a peer that does not build / run here: a row with the reason
            add(impl, case, math.nan, math.nan, note=f"failed: {type(e).__name__}: {str(e)[:120]}")

    seen_peer = set()
    for case, o in time_list:
        if time.perf_counter() - t0 > args.budget_s:
            print(f"time budget of {args.budget_s} s spent: {len(rows) // 2} rows timed, the rest skipped")
            break
        err = errs.get((tuple(dataclasses.asdict(case).values()), str(o)), math.nan)
        attempt(case.impl, case, lambda case=case, o=o: time_ours(case, o), err=err, extra={"overrides": o})
        base = Case(case.cell, case.batch, case.length, case.num_heads, case.head_dim, case.dtype)
        if base in seen_peer:
            continue
        seen_peer.add(base)
        if case.cell in ("lstm", "slstm"):
            attempt("flashrnn-triton_fused", base, lambda base=base: time_flashrnn(base, "triton_fused"))
            if args.cuda_peer:
                attempt("flashrnn-cuda_fused", base, lambda base=base: time_flashrnn(base, "cuda_fused"))
        if case.cell in ("lstm", "gru") and (case.num_heads, case.head_dim) == (12, 64):
            half = torch.float16 if case.dtype == "bfloat16" else torch.float32
            name = f"cudnn-nn.{case.cell.upper()}(768)-{'fp16' if half == torch.float16 else 'fp32'}"
            attempt(name, base, lambda case=case, half=half: time_cudnn(case.cell, case.batch, case.length, half))
        if (
            not args.no_reference
            and case.cell == "lstm"
            and case.batch == 16
            and (case.num_heads, case.head_dim) == (12, 64)
        ):
            ref = dataclasses.replace(base, backend="reference")
            attempt("ours-reference", base, lambda ref=ref: time_ours(ref))

    path = write_json("fused_rnn", rows, env, args.out)
    print(f"\nwrote {path}\n")
    _summary(rows)


def _summary(rows: list[BenchRow]) -> None:
    """The table, then the family's targets (last in the output)."""
    print(table(rows, baseline="flashrnn-triton_fused"))
    t = {
        (r.impl, r.dims.get("cell"), r.dims.get("batch"), r.dims.get("heads"), r.direction, r.dtype): r.ms
        for r in rows
        if r.dims.get("length") == 1024
    }
    at = lambda impl, cell, dtype: t.get((impl, cell, 16, 12, "fwd+bwd", dtype))  # noqa: E731
    checks = [
        (
            "LSTM fp32 fwd+bwd vs flashrnn triton_fused (<= 0.8)",
            at("ours-triton", "lstm", "float32"),
            at("flashrnn-triton_fused", "lstm", "float32"),
        ),
        (
            "LSTM bf16 fwd+bwd vs cuDNN nn.LSTM(768) fp16 (< 1)",
            at("ours-triton", "lstm", "bfloat16"),
            at("cudnn-nn.LSTM(768)-fp16", "lstm", "bfloat16"),
        ),
        (
            "sLSTM / LSTM fp32 fwd+bwd (<= 1.3)",
            at("ours-triton", "slstm", "float32"),
            at("ours-triton", "lstm", "float32"),
        ),
        (
            "sLSTM / LSTM bf16 fwd+bwd (<= 1.3)",
            at("ours-triton", "slstm", "bfloat16"),
            at("ours-triton", "lstm", "bfloat16"),
        ),
    ]
    for name, a, b in checks:
        ratio = a / b if a and b and not (math.isnan(a) or math.isnan(b)) else math.nan
        print(f"target {name}: {a} ms / {b} ms = {ratio:.3f}")
