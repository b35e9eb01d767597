"""The delta-rule family: delta rule, gated delta rule, Householder product (DeltaProduct) and the
generalized (diagonal plus low rank) delta rule of RWKV-7. Equations and shapes: ``reference.py``
and ``seqkernels/delta/README.md``.

Entry points (``backend=`` picks the implementation; all compute the same function):

    delta_rule(q, k, v, beta, *, scale=None, qk_l2norm=False, backend="auto")
    gated_delta_rule(q, k, v, g, beta, *, scale=None, qk_l2norm=False, backend="auto")
    delta_product(q, k, v, beta, g=None, *, scale=None, qk_l2norm=False, backend="auto")
    dplr_delta_rule(q, k, v, a, b, w, *, scale=1.0, lower_bound=None, backend="auto")

Backends:
- ``"reference"``: per-token loops (``reference.py``), any device, float64 included;
- ``"chunk"`` (all but ``dplr_delta_rule``): the chunkwise (WY) form in plain PyTorch (``pytorch.py``),
  any device, autograd gradients, CUDA-graph capturable;
- ``"triton"``: our fused recurrent Triton kernel, forward and backward (``recurrent_kernels.py``, the
  members mapped onto it in ``triton_ops.py``), CUDA (or the interpreter), float32/bfloat16/float16 inputs,
  float32 arithmetic and state;
- ``"triton_chunk"``: our chunkwise (WY) Triton kernels with the inter-chunk state recurrence on chip,
  forward and backward (``chunk_kernels.py``, host code in ``triton_chunk.py``); for ``dplr_delta_rule``
  under a decay bound our per-chunk kernels (heads up to 128) around a Triton inter-chunk scan
  (``dplr_chunk_kernels.py``, ``dplr_scan_kernels.py``, host code in ``triton_dplr.py``), else the
  ``"chunk"`` form in PyTorch with that scan; CUDA (or the interpreter), float32/bfloat16/float16 inputs,
  float32 arithmetic;
- ``"fla"``: flash-linear-attention's chunked Triton kernels (``fla.py``), CUDA only, computed in
  bfloat16 (inputs cast inside, outputs cast back);
- ``"fla_recurrent"`` (``delta_rule``, ungated ``delta_product``): fla's ``fused_recurrent_delta_rule``
  in the input dtype (float32 included), CUDA only;
- ``"auto"``: the fastest measured on CUDA (``resolve_backend``): ``"fla"`` where fla is importable, but
  ours (``"triton_chunk"``; for ``dplr_delta_rule`` ``"triton"`` below ``AUTO_DPLR_CHUNK_MIN_STEPS`` steps)
  for narrow heads over short recurrences, and over longer ones where fla's own path is slow (``dplr_delta_rule``;
  a gated op whose backward fla refuses here when its stand-in runs in PyTorch, see ``fla_gated_bwd``);
  without fla ours. Off CUDA ``"chunk"`` (``"reference"`` for ``dplr_delta_rule``).

``fla`` is imported only when an fla backend runs; this package imports nothing else of the suite.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from seqkernels._triton import triton_available
from seqkernels.delta import fla as _fla
from seqkernels.delta import pytorch as _chunk
from seqkernels.delta import reference as _ref

try:  # the Triton path needs triton importable (not on every platform)
    from seqkernels.delta import triton_ops as _rec
except ImportError:  # pragma: no cover - platforms without triton
    _rec = None
try:
    from seqkernels.delta import triton_chunk as _tchunk
    from seqkernels.delta import triton_dplr as _tdplr
except ImportError:  # pragma: no cover - platforms without triton
    _tchunk = _tdplr = None

AUTO = "auto"
BACKENDS = ("reference", "chunk", "triton", "triton_chunk", "fla", "fla_recurrent")
_AVAILABLE = {
    "delta_rule": {
        "reference": _ref.delta_rule,
        "chunk": _chunk.delta_rule,
        "fla": _fla.delta_rule,
        "fla_recurrent": _fla.delta_rule_recurrent,
    },
    "gated_delta_rule": {
        "reference": _ref.gated_delta_rule,
        "chunk": _chunk.gated_delta_rule,
        "fla": _fla.gated_delta_rule,
    },
    "delta_product": {
        "reference": _ref.delta_product,
        "chunk": _chunk.delta_product,
        "fla": _fla.delta_product,
        "fla_recurrent": _fla.delta_product_recurrent,
    },
    "dplr_delta_rule": {
        "reference": _ref.dplr_delta_rule,
        "chunk": _chunk.dplr_delta_rule,
        "fla": _fla.dplr_delta_rule,
    },
}
if _rec is not None:  # "triton" after the PyTorch forms, before fla's
    for _op, _fns in _AVAILABLE.items():
        _fast = {k: f for k, f in _fns.items() if k.startswith("fla")}
        _AVAILABLE[_op] = {**{k: f for k, f in _fns.items() if k not in _fast}, "triton": getattr(_rec, _op), **_fast}
    del _op, _fns, _fast
if _tchunk is not None:  # "triton_chunk" after "triton", before fla's
    _chunked = {op: getattr(_tchunk, op) for op in ("delta_rule", "gated_delta_rule", "delta_product")}
    for _op, _fn in {**_chunked, "dplr_delta_rule": _tdplr.dplr_delta_rule}.items():
        _fns = _AVAILABLE[_op]
        _fast = {k: f for k, f in _fns.items() if k.startswith("fla")}
        _slow = {k: f for k, f in _fns.items() if k not in _fast}
        _AVAILABLE[_op] = {**_slow, "triton_chunk": _fn, **_fast}
    del _chunked, _op, _fn, _fns, _fast, _slow


@functools.cache
def fla_available() -> bool:
    """Whether the ``fla`` package (flash-linear-attention) can be imported."""
    return importlib.util.find_spec("fla") is not None


#: where fla runs, ``"auto"`` gives our kernels heads at most this wide (key width) over short recurrences:
#: at 16 ours beat fla's up to 64 steps, at 32 fla's were twice as fast
#: (``benchmarks/ops/results/delta.evidence.md``, "The crossover in length")
AUTO_OURS_MAX_HEAD_DIM = 16
#: recurrences (tokens times steps per token) of at most this many steps take ours where fla's path is
#: fast: at head dim 16 ours was as fast or faster up to 64 steps, fla's 9% faster at 256
AUTO_OURS_MAX_STEPS = 64
#: ... and of at most this many where fla's path is slow: the crossover of our recurrent kernel against
#: fla's gated path with its PyTorch backward, at head dim 16 (our chunk kernels beat the recurrent one
#: at every length timed; against that fla path beyond 256 steps they are untimed)
AUTO_OURS_MAX_STEPS_SLOW_FLA = 256
#: ``dplr_delta_rule`` takes our chunk kernels over our recurrent one from this many steps: several times faster
#: at 8 x 2,048 x 16 x 64, the recurrent kernel the faster at 256 x 128 x 4 x 16; the lengths between untimed
#: (``delta.evidence.md``, "RWKV-7's chunk form in Triton")
AUTO_DPLR_CHUNK_MIN_STEPS = 2048


@functools.cache
def _fla_refuses_gated() -> bool:
    """fla's own condition for refusing its gated backward here (``fla_gated_bwd.triton_refuses``), read
    once: ``resolve_backend`` runs on every call."""
    from seqkernels.delta import fla_gated_bwd

    return fla_gated_bwd.triton_refuses()


def _fla_gated_is_slow(x: torch.Tensor) -> bool:
    """Whether fla's gated path runs its backward in PyTorch here: fla refuses its own Triton kernel and
    the stand-in registered for it is the PyTorch function for inputs like ``x`` (``fla_gated_bwd.
    registered_function``: ``REGISTERED``, no Triton, or keys wider than the kernel takes)."""
    from seqkernels.delta import fla_gated_bwd

    return _fla_refuses_gated() and fla_gated_bwd.registered_function(x) is fla_gated_bwd.chunk_bwd_dqkwg


def _auto(op: str, available: dict, x: torch.Tensor, gated: bool, steps: int, bounded: bool) -> str:
    """What ``"auto"`` runs, the fastest in CUDA-graph replays of forward and backward (``python -m
    benchmarks.ops delta --graph --sweep``). On CUDA, ours is ``"triton_chunk"`` (faster than our recurrent
    ``"triton"`` at every length timed, head dims 16 to 64; for ``dplr_delta_rule`` from
    ``AUTO_DPLR_CHUNK_MIN_STEPS`` steps, ``"triton"`` below). With fla
    importable: ``"fla"``, except ours for heads at most ``AUTO_OURS_MAX_HEAD_DIM`` wide over at most
    ``AUTO_OURS_MAX_STEPS`` steps, or ``AUTO_OURS_MAX_STEPS_SLOW_FLA`` where fla's own path is slow
    (``dplr_delta_rule``; a ``gated`` op whose backward runs in PyTorch, ``_fla_gated_is_slow``). Without
    fla: ours. Off CUDA: ``"chunk"`` (for ``dplr_delta_rule`` only with a decay bound, ``bounded``: its
    pairwise chunk form is slower than the per-token loop on a CPU)."""
    if not x.is_cuda:
        return "chunk" if "chunk" in available and (bounded or op != "dplr_delta_rule") else "reference"
    recurrent_first = op == "dplr_delta_rule" and steps < AUTO_DPLR_CHUNK_MIN_STEPS
    preferred = ("triton", "triton_chunk") if recurrent_first else ("triton_chunk", "triton")
    ours = next((name for name in preferred if name in available), None)
    if not fla_available():
        return ours or ("chunk" if "chunk" in available else "reference")
    if ours is not None and x.shape[-1] <= AUTO_OURS_MAX_HEAD_DIM:
        fla_slow = op == "dplr_delta_rule" or (gated and _fla_gated_is_slow(x))
        if steps <= (AUTO_OURS_MAX_STEPS_SLOW_FLA if fla_slow else AUTO_OURS_MAX_STEPS):
            return ours
    return "fla"


def resolve_backend(
    op: str, backend: str, x: torch.Tensor, *, gated: bool = False, steps: int = 0, bounded: bool = False
) -> str:
    """The backend ``backend`` stands for when ``op`` runs on tensors like ``x`` (``(..., K)``, ``K`` the
    key width) over ``steps`` steps, ``gated`` or not, with a lower bound on the log decay (``bounded``,
    ``dplr_delta_rule``) or not; one-line ``ValueError``s. ``"auto"``: ``_auto``."""
    available = _AVAILABLE[op]
    if backend == AUTO:
        return _auto(op, available, x, gated, steps, bounded)
    if backend not in available:
        raise ValueError(f"unknown {op} backend {backend!r}; valid: {', '.join([AUTO, *available])}")
    if backend.startswith("triton") and not triton_available(x):
        raise ValueError(
            f"{op}: backend {backend!r} needs CUDA tensors (got {x.device}; on the CPU only under "
            "TRITON_INTERPRET=1); use 'chunk', 'reference' or 'auto'"
        )
    if backend.startswith("fla"):
        if not x.is_cuda:
            raise ValueError(
                f"{op}: backend {backend!r} runs fla's Triton kernels, which need CUDA tensors "
                f"(got {x.device}); use 'reference' or 'auto'"
            )
        if not fla_available():
            raise ValueError(
                f"{op}: backend {backend!r} needs flash-linear-attention (pip install "
                "flash-linear-attention); use 'reference' or 'auto'"
            )
    return backend


def _check(op: str, named: dict[str, torch.Tensor], shapes: dict[str, tuple]) -> None:
    """Every tensor floating point, on one device, with the expected shape (``None``: any size)."""
    device = next(iter(named.values())).device
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{op}: {name} must be floating point, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device}, the others on {device}")
        want = shapes[name]
        if t.dim() != len(want) or any(w is not None and w != s for w, s in zip(want, t.shape)):
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected {want} (None: any)")


def delta_rule(q, k, v, beta, *, scale: float | None = None, qk_l2norm: bool = False, backend: str = AUTO):
    """``S_t = S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = scale S_t q_t``.
    ``q, k (B, L, H, K)``, ``v (B, L, H, V)``, ``beta (B, L, H)`` -> ``o (B, L, H, V)``."""
    B, L, H, K = q.shape
    _check(
        "delta_rule",
        {"q": q, "k": k, "v": v, "beta": beta},
        {"q": (B, L, H, K), "k": (B, L, H, K), "v": (B, L, H, None), "beta": (B, L, H)},
    )
    fn = _AVAILABLE["delta_rule"][resolve_backend("delta_rule", backend, q, steps=L)]
    return fn(q, k, v, beta, scale=scale, qk_l2norm=qk_l2norm)


def gated_delta_rule(q, k, v, g, beta, *, scale: float | None = None, qk_l2norm: bool = False, backend: str = AUTO):
    """``S_t = exp(g_t) S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T``; ``g (B, L, H)`` log decay (<= 0)."""
    B, L, H, K = q.shape
    _check(
        "gated_delta_rule",
        {"q": q, "k": k, "v": v, "g": g, "beta": beta},
        {"q": (B, L, H, K), "k": (B, L, H, K), "v": (B, L, H, None), "g": (B, L, H), "beta": (B, L, H)},
    )
    fn = _AVAILABLE["gated_delta_rule"][resolve_backend("gated_delta_rule", backend, q, gated=True, steps=L)]
    return fn(q, k, v, g, beta, scale=scale, qk_l2norm=qk_l2norm)


def delta_product(q, k, v, beta, g=None, *, scale: float | None = None, qk_l2norm: bool = False, backend: str = AUTO):
    """``n`` delta steps per token (``k (B, L, n, H, K)``, ``v (B, L, n, H, V)``, ``beta (B, L, n, H)``),
    the decay ``exp(g_t)`` (``g (B, L, H)`` or None) once before them; output read after the last step."""
    B, L, H, K = q.shape
    n = k.shape[2] if k.dim() == 5 else None
    named = {"q": q, "k": k, "v": v, "beta": beta, **({} if g is None else {"g": g})}
    _check(
        "delta_product",
        named,
        {"q": (B, L, H, K), "k": (B, L, n, H, K), "v": (B, L, n, H, None), "beta": (B, L, n, H), "g": (B, L, H)},
    )
    name = resolve_backend("delta_product", backend, q, gated=g is not None, steps=L * k.shape[2])
    fn = _AVAILABLE["delta_product"][name]
    return fn(q, k, v, beta, g, scale=scale, qk_l2norm=qk_l2norm)


def dplr_delta_rule(q, k, v, a, b, w, *, scale: float = 1.0, lower_bound: float | None = None, backend: str = AUTO):
    """``S_t = S_{t-1}(diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T``, ``o_t = scale S_t q_t``;
    ``q, k, a, b, w (B, L, H, K)``, ``v (B, L, H, V)``. ``lower_bound``: a promise ``lower_bound <= w < 0``
    that lets fla, ``"chunk"`` and ``"triton_chunk"`` use their faster chunking (RWKV-7: ``-exp(-0.5)``); the
    recurrences ignore it."""
    B, L, H, K = q.shape
    _check(
        "dplr_delta_rule",
        {"q": q, "k": k, "v": v, "a": a, "b": b, "w": w},
        {
            "q": (B, L, H, K),
            "k": (B, L, H, K),
            "v": (B, L, H, None),
            "a": (B, L, H, K),
            "b": (B, L, H, K),
            "w": (B, L, H, K),
        },
    )
    name = resolve_backend("dplr_delta_rule", backend, q, steps=L, bounded=lower_bound is not None)
    fn = _AVAILABLE["dplr_delta_rule"][name]
    if name in ("fla", "chunk", "triton_chunk"):
        return fn(q, k, v, a, b, w, scale=scale, lower_bound=lower_bound)
    return fn(q, k, v, a, b, w, scale=scale)


def backends(op: str) -> tuple[str, ...]:
    """The backend names ``op`` accepts (``"auto"`` first)."""
    return (AUTO, *_AVAILABLE[op])


__all__ = [
    "AUTO",
    "BACKENDS",
    "backends",
    "delta_product",
    "delta_rule",
    "dplr_delta_rule",
    "fla_available",
    "gated_delta_rule",
    "resolve_backend",
]
