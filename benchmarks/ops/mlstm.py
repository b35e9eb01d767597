"""``python -m benchmarks.ops mlstm``: check, then time, the mLSTM kernels and their peers in one run.

Implementations (``B, NH, S, DQK, DV`` layout; peers get their own layout prepared before timing):
* ours: ``ours-triton-c{L}`` (TFLA kernels at chunk size ``L``; the gate is a dimension of the row);
* ``mlstm_kernels`` (when importable): ``chunkwise--triton_limit_chunk`` and ``--triton_xl_chunk``
  (mLSTMexp), ``--triton_xl_chunk_siging`` with ``normalize=False`` (mLSTMsig), each with
  ``autocast_kernel_dtype`` = the input dtype;
* ``fla-core`` (when importable): ``chunk_simple_gla`` (layout ``B, S, NH, D``; gate = log sigmoid of
  the forget pre-activation; the sigmoid input gate is folded into ``k`` for the check, not timed).

Every implementation is checked first, forward and all gradients (q, k, v, both gates), against our
chunkwise PyTorch form in float64 on the same fresh random inputs (the chunkwise form is tested
against the parallel reference in ``tests/kernels/test_mlstm.py``); our outputs are poisoned with
NaN first. The reported error is the largest relative error (``||x - ref|| / ||ref||``) over h and
the gradients. Timing: ``triton.testing.do_bench`` medians; forward alone, and forward + backward
(``torch.autograd.grad`` of h with a random dh w.r.t. q, k, v, i, f).

Physical limits (per batch*head; ``L`` = chunk size, causal half of each chunk counted): forward
FLOPs ``S L (DQK + DV) + 4 S DQK DV``, backward ``S L (3 DQK + 2 DV) + 8 S DQK DV``, over the
measured matmul rate of the dtype (single-pass TF32 for float32, although our float32 default runs
3 TF32 passes); bytes: inputs read once, outputs written once, over the measured copy bandwidth.
The larger is the floor.

float32 precision (``--matmul-precision``, torch's float32 matmul setting): ``high`` (default)
runs our float32 dots in 3-pass TF32 (float32-accurate); ``medium`` in single-pass TF32, the
precision of the peers' float32 kernels (their ``tl.dot`` default, whatever the torch setting), and
names ours ``ours-triton-...-tf32``.

Sections (``--sections``): ``main`` (B=4, NH=16, S=4096, DQK=128, DV=256; bf16 and fp32; chunk
sizes), ``grid`` (65,536 tokens: (B, S) in (32, 2048), (8, 8192), (1, 65536); bf16), ``chunk``
(paper 002 Fig. 5: mLSTMsig, B=8, NH=8, S=8192, DQK=DV=512, chunk 64..4096, time and peak memory)
and ``inter`` (paper 004: the inter-chunk kernel fused vs one launch per chunk; B=4, NH=16,
DQK=DV=64, chunk 64, G in (32, 64, 128) chunks; bit-identity checked).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import re
import time

import torch

from benchmarks.ops.common import (
    BenchRow,
    cli_common,
    copy_bandwidth_gbs,
    environment,
    kernel_lines,
    kernel_times,
    lift_fla_gated_guard,
    matmul_tflops,
    rel_error,
    table,
    time_ms,
    write_json,
)
from seqkernels._triton import float32_matmul_precision, poisoned

log = logging.getLogger("benchmarks.ops.mlstm")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
DEVICE = "cuda"  # a CPU smoke test under TRITON_INTERPRET=1 sets "cpu"


@dataclasses.dataclass
class Limits:
    bw_gbs: float
    tflops: dict

    def ms(self, B, NH, S, DQK, DV, L, dtype, direction) -> float:
        fl = S * L * (DQK + DV) + 4 * S * DQK * DV
        nbytes = S * (2 * DQK + 2 * DV + 2) * torch.finfo(dtype).bits // 8
        if direction == "fwd+bwd":
            fl += S * L * (3 * DQK + 2 * DV) + 8 * S * DQK * DV
            nbytes *= 3
        fl *= B * NH
        nbytes *= B * NH
        rate = self.tflops["bf16" if dtype == torch.bfloat16 else "fp32"]
        return max(fl / (rate * 1e12), nbytes / (self.bw_gbs * 1e9)) * 1e3


def _inputs(B, NH, S, DQK, DV, dtype, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=DEVICE, generator=g)  # noqa: E731
    q, k, v = r(B, NH, S, DQK), r(B, NH, S, DQK), r(B, NH, S, DV)
    i_pre, f_pre = r(B, NH, S), 3.0 + r(B, NH, S)
    return [t.to(dtype).contiguous() for t in (q, k, v, i_pre, f_pre)]


# ---------------------------------------------------------------- implementations: fn(q, k, v, i, f)
def _ours(gate, chunk, fused=True, tiles=None):
    from seqkernels.mlstm.triton_ops import mlstm_triton

    return lambda q, k, v, i, f: mlstm_triton(
        q, k, v, i, f, input_gate=gate, chunk_size=chunk, fused_inter=fused, tiles=tiles
    )


def parse_tiles(spec: str, dtype: torch.dtype, prec: str):
    """``"warps=8,bv=256"`` -> ``MlstmTiles`` with those fields replacing the defaults for ``dtype, prec``."""
    from seqkernels.mlstm.triton_ops import default_tiles

    over = {k: int(v) for k, v in (item.split("=") for item in spec.split(",") if item)}
    return dataclasses.replace(default_tiles(dtype, prec), **over)


def _peers(gate, fla=True) -> dict:
    out = {}
    try:
        from mlstm_kernels.torch import get_mlstm_kernel
    except Exception as err:  # noqa: BLE001
        log.warning("mlstm_kernels not usable: %s", err)
        get_mlstm_kernel = None
    if get_mlstm_kernel is not None:
        names = ["triton_limit_chunk", "triton_xl_chunk"] if gate == "exp" else ["triton_xl_chunk_siging"]
        for name in names:
            fn = get_mlstm_kernel(f"chunkwise--{name}")
            extra = {"normalize": False} if gate == "sig" else {}

            def call(q, k, v, i, f, fn=fn, extra=extra):
                return fn(q, k, v, i, f, autocast_kernel_dtype=q.dtype, **extra)

            out[f"mlstm_kernels:{name}"] = call
    if gate == "sig" and fla:
        try:
            from fla.ops.simple_gla import chunk_simple_gla
        except Exception as err:  # noqa: BLE001
            log.warning("fla-core not usable: %s", err)
        else:
            out["fla:chunk_simple_gla"] = ("fla", chunk_simple_gla)
    return out


def _fla_call(fla_fn, q, k, v, i, f, fold_input_gate):
    """fla layout (B, S, NH, D); the sigmoid input gate folded into k only for the check."""
    kk = k * torch.sigmoid(i.float())[..., None].to(k.dtype) if fold_input_gate else k
    t = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
    g = torch.nn.functional.logsigmoid(f.float()).transpose(1, 2).contiguous()
    return t(q), t(kk), t(v), g


# ---------------------------------------------------------------- checking
def _grads(fn, x, dh):
    x = [t.detach().clone().requires_grad_(True) for t in x]
    h = fn(*x)
    return [h.detach(), *torch.autograd.grad(h, x, dh, allow_unused=True)]


def _reference(gate, x, dh):
    from seqkernels.mlstm.pytorch import mlstm_chunkwise

    x64 = [t.double() for t in x]
    return _grads(lambda *a: mlstm_chunkwise(*a, input_gate=gate, chunk_size=256), x64, dh.double())  # "torch"


def _check(name, fn, gate, x, dh, ref) -> list[float]:
    """Relative errors of h, dq, dk, dv, di, df (nan where an implementation has no such output)."""
    with poisoned():
        if isinstance(fn, tuple):  # fla: h, dq, dv (k carries the folded input gate)
            fla_fn = fn[1]
            xx = [t.detach().clone() for t in x]
            qf, kf, vf, gf = _fla_call(fla_fn, *xx, fold_input_gate=True)
            qf, vf = qf.requires_grad_(True), vf.requires_grad_(True)
            o = fla_fn(qf, kf, vf, g=gf)[0]
            dq, dv = torch.autograd.grad(o, [qf, vf], dh.transpose(1, 2))
            got = [o.transpose(1, 2), dq.transpose(1, 2), None, dv.transpose(1, 2), None, None]
        else:
            got = _grads(fn, x, dh)
    return [rel_error(a, b) if a is not None else math.nan for a, b in zip(got, ref)]


# ---------------------------------------------------------------- timing
def _timed(fn, x, dh, direction):
    if isinstance(fn, tuple):
        fla_fn = fn[1]
        qf, kf, vf, gf = _fla_call(fla_fn, *x, fold_input_gate=False)
        dhf = dh.transpose(1, 2).contiguous()
        if direction == "fwd":
            return lambda: fla_fn(qf, kf, vf, g=gf)
        leaves = [t.requires_grad_(True) for t in (qf, kf, vf, gf)]
        return lambda: torch.autograd.grad(fla_fn(*leaves[:3], g=leaves[3])[0], leaves, dhf)
    if direction == "fwd":
        with torch.no_grad():
            return lambda: fn(*x)
    leaves = [t.detach().clone().requires_grad_(True) for t in x]
    return lambda: torch.autograd.grad(fn(*leaves), leaves, dh)


def _float32_floor(gate, x, dh, ref, sh) -> BenchRow:
    """Errors of our PyTorch chunkwise form in float32 with IEEE matmuls on the same inputs: what
    exact float32 arithmetic gives there (the conditioning floor of any float32 kernel). Not timed."""
    from seqkernels.mlstm.pytorch import mlstm_chunkwise

    with float32_matmul_precision("highest"):
        got = _grads(lambda *a: mlstm_chunkwise(*a, input_gate=gate, chunk_size=64), x, dh)
    errs = [rel_error(a, b) for a, b in zip(got, ref)]
    log.info(
        "%s fp32 float32 floor (torch chunkwise, IEEE matmuls), %s: errs %s",
        sh,
        gate,
        ", ".join(f"{e:.2g}" for e in errs),
    )
    return BenchRow(
        "mlstm",
        "ours-torch-fp32-ieee",
        "fwd+bwd",
        "fp32",
        dict(sh, gate=gate),
        math.nan,
        max_rel_err=errs[0],
        note=f"float32 floor, not timed; grad err {max(errs[1:]):.2g}",
        extra={"errors_h_dq_dk_dv_di_df": errs},
    )


def _profile(fn, x, dh, label):
    """Log the device kernels of a forward + backward step, heaviest first (``kernel_times``)."""
    kernels = kernel_times(_timed(fn, x, dh, "fwd+bwd"), top=14)
    log.info("%s: device kernels per fwd+bwd step\n%s", label, kernel_lines(kernels))


def _bench_shape(
    rows,
    limits,
    shape,
    dtype_name,
    gates,
    chunks,
    *,
    check=True,
    peers=True,
    fla=True,
    seed=0,
    skip=(),
    only="",
    suffix="",
    profile=False,
    tiles=None,
    section="main",
    warm_only=False,
):
    B, NH, S, DQK, DV = shape
    dtype = DTYPES[dtype_name]
    sh = {"batch": B, "heads": NH, "length": S, "qk_dim": DQK, "v_dim": DV}
    for gate in gates:
        x = _inputs(B, NH, S, DQK, DV, dtype, seed)
        dh = torch.randn(B, NH, S, DV, device=DEVICE, dtype=dtype)
        check = check and not warm_only
        ref = _reference(gate, x, dh) if check else None
        if check and peers and dtype == torch.float32:
            rows.append(_float32_floor(gate, x, dh, ref, sh))
        impls = {f"ours-triton-c{L}{suffix}": _ours(gate, L, tiles=tiles) for L in chunks[gate]}
        if peers:
            impls.update(_peers(gate, fla))
        for name, fn in impls.items():
            if only and only not in name:
                continue
            if any(name.endswith(sub) and dt == dtype_name for sub, dt in skip):
                rows.append(
                    BenchRow(
                        "mlstm",
                        name,
                        "fwd+bwd",
                        dtype_name,
                        dict(sh, gate=gate),
                        math.nan,
                        section=section,
                        note="skipped (--skip)",
                    )
                )
                continue
            if warm_only:
                try:
                    for direction in ("fwd", "fwd+bwd"):
                        _timed(fn, x, dh, direction)()
                except Exception as e:  # noqa: BLE001
                    log.warning("warm-up of %s failed: %s", name, e)
                continue
            errs, note = [math.nan] * 6, ""
            for attempt in range(2):
                try:
                    if check:
                        errs = _check(name, fn, gate, x, dh, ref)
                    L = int(re.search(r"-c(\d+)", name).group(1)) if name.startswith("ours") else 64
                    gerr = max((e for e in errs[1:] if e == e), default=math.nan)
                    note += f"grad err {gerr:.2g}" if check else ""
                    for direction in ("fwd", "fwd+bwd"):
                        ms = time_ms(_timed(fn, x, dh, direction))
                        rows.append(
                            BenchRow(
                                "mlstm",
                                name,
                                direction,
                                dtype_name,
                                dict(sh, gate=gate),
                                ms,
                                limits.ms(B, NH, S, DQK, DV, L, dtype, direction),
                                errs[0],
                                section,
                                note,
                                extra={"errors_h_dq_dk_dv_di_df": errs},
                            )
                        )
                        log.info(
                            "%s %s %s %s: %.3f ms (errs %s)",
                            sh,
                            dtype_name,
                            name,
                            direction,
                            ms,
                            ", ".join(f"{e:.2g}" for e in errs),
                        )
                    if profile and name.startswith("ours"):
                        try:
                            _profile(fn, x, dh, f"{sh} {dtype_name} {name}")
                        except Exception as e:  # noqa: BLE001 - the timings stand without the profile
                            log.warning("profile of %s failed: %s", name, e)
                    break
                except Exception as e:  # noqa: BLE001 - a peer failing is recorded, the run goes on
                    msg = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
                    if attempt == 0 and "#640" in msg:
                        lift_fla_gated_guard()  # for the rest of the run
                        note = "fla Hopper/Triton<3.7.1 guard (#640) lifted; "
                        continue
                    log.warning("%s %s %s failed: %s", sh, dtype_name, name, msg)
                    log.debug("traceback", exc_info=True)
                    rows.append(
                        BenchRow(
                            "mlstm",
                            name,
                            "fwd+bwd",
                            dtype_name,
                            dict(sh, gate=gate),
                            math.nan,
                            max_rel_err=errs[0],
                            section=section,
                            note=note + "failed: " + msg,
                        )
                    )
                    break
            torch.cuda.empty_cache()


def _bench_chunk_tradeoff(rows, limits, chunks):
    """Paper 002 Fig. 5: mLSTMsig, B=8, NH=8, S=8192, DQK=DV=512; time and peak memory vs chunk size."""
    B, NH, S, D = 8, 8, 8192, 512
    dims = {"gate": "sig", "batch": B, "heads": NH, "length": S, "qk_dim": D, "v_dim": D}
    x = _inputs(B, NH, S, D, D, torch.bfloat16, 1)
    dh = torch.randn(B, NH, S, D, device=DEVICE, dtype=torch.bfloat16)
    for L in chunks:
        fn = _ours("sig", L)
        try:
            step = _timed(fn, x, dh, "fwd+bwd")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            ms = time_ms(step)
            rows.append(
                BenchRow(
                    "mlstm",
                    "ours-triton",
                    "fwd+bwd",
                    "bf16",
                    dict(dims, chunk=L),
                    ms,
                    limits.ms(B, NH, S, D, D, L, torch.bfloat16, "fwd+bwd"),
                    section="chunk",
                    note=f"peak {peak:.2f} GiB",
                    extra={"peak_gib": peak},
                )
            )
        except Exception as e:  # noqa: BLE001
            rows.append(
                BenchRow(
                    "mlstm",
                    "ours-triton",
                    "fwd+bwd",
                    "bf16",
                    dict(dims, chunk=L),
                    math.nan,
                    section="chunk",
                    note=f"failed: {type(e).__name__}",
                )
            )
        torch.cuda.empty_cache()


def _bench_inter(rows, limits, B=4, NH=16, D=64, L=64, Gs=(32, 64, 128), dtypes=("bf16", "fp32")):
    """Paper 004: inter-chunk state kernel, state on chip vs one launch per chunk (bit-identical)."""
    from seqkernels.mlstm.triton_ops import _gates, run_inter_chunk_states

    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for G in Gs:
            S = G * L
            q, k, v, i_pre, f_pre = _inputs(B, NH, S, D, D, dtype, G)
            b, li, a, g, amax = _gates(i_pre, f_pre, True, L, G)
            run = lambda fused: run_inter_chunk_states(
                k,
                v,
                a,
                g,
                amax,
                None,
                None,
                None,  # noqa: E731
                exp_gate=True,
                L=L,
                fused=fused,
            )
            same = all(torch.equal(x, y) for x, y in zip(run(True), run(False)))
            # bytes: read k, v once, write NC+1 fp32 states (the minimum for a materializing kernel)
            nbytes = B * NH * (S * 2 * D * torch.finfo(dtype).bits // 8 + (G + 1) * D * D * 4)
            lim = nbytes / (limits.bw_gbs * 1e9) * 1e3
            t = {}
            for fused in (True, False):
                t[fused] = time_ms(lambda: run(fused))
                dims = {
                    "gate": "exp",
                    "batch": B,
                    "heads": NH,
                    "length": S,
                    "qk_dim": D,
                    "v_dim": D,
                    "chunk": L,
                    "chunks": G,
                }
                rows.append(
                    BenchRow(
                        "mlstm",
                        "inter-fused" if fused else "inter-loop",
                        "fwd",
                        dtype_name,
                        dims,
                        t[fused],
                        lim,
                        section="inter",
                        note=("bit-identical" if same else "DIFFERENT")
                        + (f", speedup {t[False] / t[True]:.2f}x" if not fused else ""),
                        extra={"bit_identical": same},
                    )
                )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops mlstm", description=__doc__.split("\n")[0])
    p.add_argument("--sections", default="main,grid,chunk,inter")
    p.add_argument("--exp-chunks", default="64,128", help="our mLSTMexp chunk sizes (main; grid uses the first)")
    p.add_argument("--sig-chunks", default="64,128", help="our mLSTMsig chunk sizes (main; grid uses the first)")
    p.add_argument("--no-fla", action="store_true", help="leave fla-core out (its autotuning takes ~1 min a shape)")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--skip", default="", help="comma list of 'impl-substring+dtype' to skip, e.g. xl_chunk+bf16")
    p.add_argument("--tradeoff-chunks", default="64,128,256,512,1024,2048,4096")
    p.add_argument("--only", default="", help="time only implementations whose name contains this")
    p.add_argument("--quick", action="store_true", help="smaller shapes (S/4), no grid / chunk sections")
    p.add_argument("--no-check", action="store_true")
    p.add_argument(
        "--matmul-precision",
        default="high",
        choices=["high", "medium"],
        help="torch float32 matmul precision: high = our float32 dots in 3-pass TF32 (accurate), "
        "medium = single-pass TF32 like the peers (ours named ours-triton-...-tf32)",
    )
    p.add_argument(
        "--tiles",
        default="",
        help="main section: ';'-separated MlstmTiles fields to time ours with, e.g. "
        "'warps=8;stages=1;bv=256,warps=8;lp_states=0,gate_kernels=0' (rows named "
        "ours-triton-...[setting]; 0/1 for the boolean options); the defaults run first",
    )
    p.add_argument("--profile", action="store_true", help="log our kernels' CUDA times (torch.profiler)")
    cli_common(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("benchmarks.ops.mlstm").setLevel(logging.DEBUG)
    if not torch.cuda.is_available():
        raise SystemExit("error: the mLSTM benchmark needs a CUDA GPU")
    torch.set_float32_matmul_precision(args.matmul_precision)  # ours: 3-pass / 1-pass TF32; peers: TF32 anyway
    suffix = "-tf32" if args.matmul_precision == "medium" else ""
    sections = set(args.sections.split(","))
    if args.quick:
        sections -= {"grid", "chunk"}
    chunks = {"exp": [int(c) for c in args.exp_chunks.split(",")], "sig": [int(c) for c in args.sig_chunks.split(",")]}
    skip = tuple(tuple(s.split("+", 1)) for s in args.skip.split(",") if "+" in s)
    env = environment("cuda")
    limits = Limits(
        copy_bandwidth_gbs(), {"bf16": matmul_tflops(dtype=torch.bfloat16), "fp32": matmul_tflops(dtype=torch.float32)}
    )
    env.update(copy_gbs=limits.bw_gbs, matmul_tflops=limits.tflops, float32_matmul_precision=args.matmul_precision)
    log.info("copy %.0f GB/s, matmul %s TFLOP/s", limits.bw_gbs, limits.tflops)
    rows: list[BenchRow] = []
    t0 = time.time()

    def flush():
        if not args.warm_only:
            write_json("mlstm", rows, env, args.out)

    S_main = 1024 if args.quick else 4096
    if "inter" in sections and not args.warm_only:
        _bench_inter(rows, limits)
        flush()
    if "main" in sections:
        for dn in args.dtypes.split(","):
            sfx = suffix if dn == "fp32" else ""
            _bench_shape(
                rows,
                limits,
                (4, 16, S_main, 128, 256),
                dn,
                ("exp", "sig"),
                chunks,
                check=not args.no_check,
                fla=not args.no_fla,
                skip=skip,
                only=args.only,
                suffix=sfx,
                profile=args.profile,
                warm_only=args.warm_only,
            )
            flush()
            for spec in filter(None, args.tiles.split(";")):
                from seqkernels.mlstm.triton_ops import _precision

                tiles = parse_tiles(spec, DTYPES[dn], _precision(DTYPES[dn]))
                _bench_shape(
                    rows,
                    limits,
                    (4, 16, S_main, 128, 256),
                    dn,
                    ("exp", "sig"),
                    chunks,
                    check=not args.no_check,
                    peers=False,
                    only=args.only,
                    suffix=f"{sfx}[{spec}]",
                    tiles=tiles,
                    section="tiles",
                    warm_only=args.warm_only,
                )
                flush()
    if "grid" in sections:
        for B, S in ((32, 2048), (8, 8192), (1, 65536)):
            first = {g: c[:1] for g, c in chunks.items()}
            _bench_shape(
                rows,
                limits,
                (B, 16, S, 128, 256),
                "bf16",
                ("exp", "sig"),
                first,
                check=not args.no_check,
                fla=not args.no_fla,
                skip=skip,
                only=args.only,
                section="grid",
                warm_only=args.warm_only,
            )
            flush()
    if args.warm_only:
        print("mlstm: warm-up done")
        return
    if "chunk" in sections:
        _bench_chunk_tradeoff(rows, limits, [int(c) for c in args.tradeoff_chunks.split(",")])
        flush()
    path = write_json("mlstm", rows, env, args.out)
    log.info("wrote %s after %.0f s", path, time.time() - t0)
    from seqkernels.mlstm.triton_ops import _LEVEL

    log.info(
        "launch fallbacks (kernel: ladder level; 1 = one pipeline stage, 2 = smaller tile): %s",
        {f"{name}/L{dict(meta).get('L')}/{dict(meta).get('PREC')}": lv for (name, meta), lv in _LEVEL.items() if lv}
        or "none",
    )
    print(
        f"device: {env['device']}  date: {env['date']}  copy {limits.bw_gbs:.0f} GB/s  "
        f"matmul bf16 {limits.tflops['bf16']:.0f} / tf32 {limits.tflops['fp32']:.0f} TFLOP/s"
    )
    print(table(rows, baseline="mlstm_kernels:triton_limit_chunk"))
