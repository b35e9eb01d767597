"""seqkernels.fused_rnn: the Triton backends (fused, alternating) against the float64 reference loop.

On the CPU the Triton kernels run under ``TRITON_INTERPRET=1`` (set by tests/conftest.py when
there is no GPU) at small, awkward shapes: T in {1, 5, 33}, head dims 16 and 24 (padded to 32), batch 3 and 17 (two
batch blocks). Outputs are NaN-poisoned before each run. Forward (h, last states) and every
gradient (wx, R, b, initial states) are compared.
"""

import dataclasses

import pytest
import torch

from seqkernels._triton import poisoned
from seqkernels.fused_rnn import BACKENDS, CELLS, fused, fused_rnn, fused_rnn_reference, triton_ops
from seqkernels.fused_rnn.alternating import fused_rnn_alt_fwd
from seqkernels.fused_rnn.fused import fused_rnn_fwd

FAST = ("fused", "alternating")
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU, compiled kernels on a GPU
if DEV == "cuda":  # float64 Triton runs only in the interpreter: the float64 cases run in float32 on a GPU
    TOL[torch.float32] = 1e-4


def on_device(dtype):
    """``dtype``, or float32 for float64 on a GPU."""
    return torch.float32 if DEV == "cuda" and dtype == torch.float64 else dtype


@pytest.fixture(autouse=True)
def _poison():
    with poisoned():
        yield


def fused_with(**over):
    """The fused backend with its default launch configuration's fields replaced by ``over``."""

    def run(cell, wx, R, b, s0=None):
        cfg = fused.launch_config(cell, wx.shape[0], wx.shape[2], wx.shape[4], wx.dtype)
        return fused.fused_rnn_fused(cell, wx, R, b, s0, config=dataclasses.replace(cfg, **over))

    return run


def inputs(cell, B, T, NH, DH, dtype, seed=0, states=True):
    spec = CELLS[cell]
    g = torch.Generator().manual_seed(seed)
    wx = torch.randn(B, T, NH, spec.input_gates, DH, generator=g, dtype=torch.float64)
    R = (2 * torch.rand(NH, DH, spec.recurrent_gates, DH, generator=g, dtype=torch.float64) - 1) / DH**0.5
    b = 0.5 * torch.randn(NH, spec.bias_gates, DH, generator=g, dtype=torch.float64)
    s0 = None
    if states:
        s0 = torch.randn(spec.num_states, B, NH, DH, generator=g, dtype=torch.float64)
        if cell == "slstm":  # a normalizer state n > 0 (n == 0 is the "first step" case)
            s0[2] = s0[2].abs() + 0.5
    return [x.to(DEV, dtype) if x is not None else None for x in (wx, R, b, s0)]


def run(backend, cell, wx, R, b, s0, dy, dlast):
    """``backend``: a name, or a function with ``fused_rnn_reference``'s signature."""
    leaves = [x.detach().requires_grad_() if x is not None else None for x in (wx, R, b, s0)]
    if callable(backend):
        h, last = backend(cell, *leaves)
    else:
        h, last = fused_rnn(cell, *leaves, backend=backend)
    used = [x for x in leaves if x is not None]
    grads = torch.autograd.grad((h, last), used, (dy, dlast))
    return (h, last, *grads)


def rel(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values (unwritten output?)"
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def compare(backend, cell, B, T, NH, DH, dtype, seed=0, states=True):
    dtype = on_device(dtype)
    wx, R, b, s0 = inputs(cell, B, T, NH, DH, dtype, seed, states)
    g = torch.Generator().manual_seed(seed + 100)
    dy = torch.randn(B, T, NH, DH, generator=g, dtype=torch.float64)
    dlast = torch.randn(CELLS[cell].num_states, B, NH, DH, generator=g, dtype=torch.float64)
    dy, dlast = dy.to(DEV), dlast.to(DEV)
    got = run(backend, cell, wx, R, b, s0, dy.to(dtype), dlast.to(dtype))
    up = [x.double() if x is not None else None for x in (wx, R, b, s0)]
    ref = run("reference", cell, *up, dy, dlast)
    names = ("h", "last", "dwx", "dR", "db", "ds0")
    for name, a, r in zip(names, got, ref):
        assert a.shape == r.shape and a.dtype == dtype, name
        err = rel(a, r)
        assert err <= TOL[dtype], (
            f"{getattr(backend, '__name__', backend)} {cell} T={T} {dtype}: {name} rel err {err:.2e}"
        )


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("T", [1, 5, 33])
@pytest.mark.slow
def test_float64_matches_reference(backend, cell, T):
    compare(backend, cell, B=3, T=T, NH=2, DH=16, dtype=torch.float64, seed=T)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("cell", list(CELLS))
def test_padded_head_dim_and_two_batch_blocks(backend, cell):
    """DH=24 is padded to 32 inside the fused kernel; B=17 spans two batch blocks of 16."""
    compare(backend, cell, B=17, T=4, NH=1, DH=24, dtype=torch.float64, seed=1)


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_bfloat16_match_reference(backend, cell, dtype):
    compare(backend, cell, B=3, T=5, NH=2, DH=16, dtype=dtype, seed=2)


@pytest.mark.parametrize("cell", list(CELLS))
def test_zero_initial_state(cell):
    """states0=None: zeros (for the sLSTM, n = 0 takes m = i on the first step)."""
    compare("fused", cell, B=2, T=5, NH=1, DH=16, dtype=torch.float64, seed=3, states=False)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_dR_after_the_kernel(cell):
    """acc_dr=False: dR from one matmul over (batch, time) instead of registers."""
    compare(fused_with(acc_dr=False), cell, B=3, T=5, NH=2, DH=16, dtype=torch.float64, seed=4)


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize(("dtype", "acc_db"), [(torch.float64, True), (torch.float32, False)])
def test_backward_db_and_dR_placement(cell, dtype, acc_db):
    """db summed in registers (the float32 default) or from dg after the kernel (the bfloat16 and
    float64 default), with dR in registers (block 16) and after the kernel (block 4, two blocks)."""
    for block_b, acc_dr in ((16, True), (4, False)):
        compare(
            fused_with(block_b=block_b, acc_dr=acc_dr, acc_db=acc_db), cell, B=5, T=4, NH=2, DH=24, dtype=dtype, seed=5
        )


@pytest.mark.parametrize("cell", list(CELLS))
def test_bfloat16_on_fma_units(cell):
    """``fma``: bfloat16 storage with float32 dots (h unrounded in the forward), batch block 4."""
    compare(
        fused_with(fma=True, block_b=4, acc_dr=False, acc_db=True),
        cell,
        B=5,
        T=5,
        NH=2,
        DH=16,
        dtype=torch.bfloat16,
        seed=6,
    )


def test_triton_falls_back_to_alternating(monkeypatch):
    """``backend="triton"`` runs the alternating kernels when R does not fit on chip."""
    monkeypatch.setattr(fused, "ON_CHIP_R_BYTES", 1024)
    calls = []
    original = BACKENDS["alternating"]
    import seqkernels.fused_rnn as package

    monkeypatch.setattr(package, "fused_rnn_alternating", lambda *a: calls.append(1) or original(*a))
    compare("triton", "lstm", B=2, T=3, NH=1, DH=16, dtype=torch.float64)
    assert calls
    with pytest.raises(ValueError, match="alternating"):
        fused_rnn("lstm", *inputs("lstm", 2, 3, 1, 16, torch.float32), backend="fused")


def test_no_grad_forward_and_empty_sequence():
    dtype = on_device(torch.float64)
    wx, R, b, s0 = inputs("lstm", 3, 6, 2, 16, dtype)
    with torch.no_grad():
        h, last = fused_rnn("lstm", wx, R, b, s0, backend="fused")
    hr, lr = fused_rnn_reference("lstm", *(t.double() for t in (wx, R, b, s0)))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert rel(h, hr) < tol and rel(last, lr) < tol
    h0, last0 = fused_rnn("lstm", wx[:, :0], R, b, s0, backend="fused")
    assert h0.shape == (3, 0, 2, 16) and torch.equal(last0, s0)


def test_auto_is_reference_on_cpu(monkeypatch):
    wx, R, b, s0 = (t.cpu() for t in inputs("gru", 2, 3, 1, 16, torch.float64))
    monkeypatch.setitem(BACKENDS, "reference", lambda *a: "reference called")
    assert fused_rnn("gru", wx, R, b, s0) == "reference called"


@pytest.mark.parametrize("op", [fused_rnn_fwd, fused_rnn_alt_fwd])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.slow
def test_opcheck(op, cell):
    wx, R, b, s0 = inputs(cell, 2, 3, 1, 16, torch.float32)
    args = [x.requires_grad_() for x in (wx, R, b, s0)]
    torch.library.opcheck(op, (cell, *args, True))


@pytest.mark.parametrize("backend", FAST)
def test_bad_inputs_fail_with_one_line_errors(backend, monkeypatch):
    wx, R, b, s0 = inputs("lstm", 2, 3, 1, 16, torch.float32)
    cases = [
        ((wx.half(), R.half(), b.half(), s0.half()), TypeError, "not supported"),
        ((wx.double(), R.double(), b.double(), s0.double()), TypeError, "not supported")
        if DEV == "cuda"
        else ((wx, R, b, s0.double()), TypeError, "dtype"),
        ((wx, R.double(), b, s0), TypeError, "dtype"),
        ((wx, R[..., :8], b, s0), ValueError, "R must have shape"),
        ((wx.transpose(0, 1).contiguous().transpose(0, 1), R, b, s0), ValueError, "contiguous"),
        ((wx, R, b, s0[:1]), ValueError, "states0 must have shape"),
    ]
    for args, err, msg in cases:
        with pytest.raises(err, match=msg) as info:
            fused_rnn("lstm", *args, backend=backend)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="unknown cell"):
        fused_rnn("rnn", wx, R, b, s0, backend=backend)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="Triton cannot run"):
        fused_rnn("lstm", wx.cpu(), R.cpu(), b.cpu(), s0.cpu(), backend=backend)


def _slstm_stabilizer_inputs(DH, seed):
    """bfloat16 sLSTM inputs at the GPU test's shape (B=5, T=65, NH=2); states |randn|, so some n0 ~ 1e-4."""
    spec = CELLS["slstm"]
    g = torch.Generator().manual_seed(DH * 1000 + seed)
    wx = torch.randn(5, 65, 2, spec.input_gates, DH, generator=g)
    R = (2 * torch.rand(2, DH, spec.recurrent_gates, DH, generator=g) - 1) / DH**0.5
    b = torch.randn(2, spec.bias_gates, DH, generator=g)
    s0 = torch.randn(spec.num_states, 5, 2, DH, generator=g).abs()
    dy, dlast = torch.randn(5, 65, 2, DH, generator=g), torch.randn(s0.shape, generator=g)
    return [x.to(DEV, torch.bfloat16) for x in (wx, R, b, s0, dy, dlast)]


@pytest.mark.parametrize(
    ("backend", "DH", "seed"),
    [("fused", 128, 4), ("alternating", 128, 44), ("fma", 64, 4), ("fma", 64, 7)],
)
@pytest.mark.slow
def test_slstm_bfloat16_stabilizer_branch(backend, DH, seed):
    """bfloat16 sLSTM against float64 where the stabilizer branch is sensitive.

    The stabilizer branch m = max(log σ(f) + m_prev, i) makes the gradients of i and f jump at
    ties; with h rounded to bfloat16 before R^T h, the gates move by ~1e-3 and flip the branch where
    float64 does not. The DH=128 seeds gave dwx errors of 7e-2 (fused, interpreter) and 0.22
    (alternating) before the forward kept h at ~float32 precision (``triton_ops.full_precision_h``).
    ``fma`` (float32 dots, h unrounded instead of split) holds R in float32, which fits on chip up to DH=64.
    """
    ins = _slstm_stabilizer_inputs(DH, seed)
    if backend == "fma":
        backend = fused_with(fma=True, block_b=4, acc_dr=False, acc_db=True)
    got = run(backend, "slstm", *ins)
    ref = run("reference", "slstm", *(x.double() for x in ins))
    for name, a, r in zip(("h", "last", "dwx", "dR", "db", "ds0"), got, ref):
        err = rel(a, r)
        assert err <= TOL[torch.bfloat16], f"{backend} slstm bf16 DH={DH}: {name} rel err {err:.2e}"


def test_fma_refuses_an_r_that_does_not_fit_on_chip_in_float32():
    """At DH=128 the sLSTM's R is 128 KiB in bfloat16 (fits) but 256 KiB once ``fma`` upcasts it."""
    wx, R, b, s0, _, _ = _slstm_stabilizer_inputs(128, 0)
    with pytest.raises(ValueError, match=r"held in torch.float32 takes 262144 bytes") as info:
        fused_with(fma=True, block_b=4, acc_dr=False, acc_db=True)("slstm", wx, R, b, s0)
    assert "\n" not in str(info.value)


def test_saved_states_float32_and_split_h():
    """bfloat16 storage is for the caller's tensors only: the saved states / gates are float32, and
    only the bfloat16 sLSTM splits h for the forward's recurrent dot."""
    for op in (fused_rnn_fwd, fused_rnn_alt_fwd):
        for cell in ("lstm", "slstm"):
            wx, R, b, s0 = inputs(cell, 2, 3, 1, 16, torch.bfloat16)
            h, last, saved = op(cell, wx, R, b, s0, True)
            assert h.dtype == last.dtype == torch.bfloat16 and saved.dtype == torch.float32
    for cell in CELLS:
        for dtype in (torch.float32, torch.bfloat16):
            want = cell == "slstm" and dtype == torch.bfloat16
            assert triton_ops.full_precision_h(cell, dtype) == want
            assert fused.launch_config(cell, 16, 12, 64, dtype).split_h == want


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown fused_rnn backend 'cuda'; valid: auto, reference"):
        fused_rnn("lstm", *inputs("lstm", 2, 3, 1, 16, torch.float32), backend="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("DH", [16, 64, 128])
def test_gpu_matches_reference(cell, dtype, DH):
    """On the GPU: the backend "triton" (fused, or alternating where R does not fit on chip)."""
    spec = CELLS[cell]
    B, T, NH = 5, 65, 2
    g = torch.Generator(device="cuda").manual_seed(DH)
    wx = torch.randn(B, T, NH, spec.input_gates, DH, device="cuda", generator=g)
    R = (2 * torch.rand(NH, DH, spec.recurrent_gates, DH, device="cuda", generator=g) - 1) / DH**0.5
    b = torch.randn(NH, spec.bias_gates, DH, device="cuda", generator=g)
    s0 = torch.randn(spec.num_states, B, NH, DH, device="cuda", generator=g).abs()
    dy, dlast = torch.randn(B, T, NH, DH, device="cuda"), torch.randn_like(s0)
    got = run("triton", cell, *(x.to(dtype) for x in (wx, R, b, s0)), dy.to(dtype), dlast.to(dtype))
    ref = run(
        "reference",
        cell,
        *(x.to(dtype).double() for x in (wx, R, b, s0)),
        dy.to(dtype).double(),
        dlast.to(dtype).double(),
    )
    for a, r in zip(got, ref):
        assert rel(a, r) <= (1e-4 if dtype == torch.float32 else 2e-2)
