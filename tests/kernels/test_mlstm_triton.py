"""The Triton (TFLA) mLSTM against the parallel reference: forward, every gradient, states; outputs
poisoned with NaN first; the per-chunk inter-chunk loop is bit-identical to the fused recurrence.
On the CPU these run under ``TRITON_INTERPRET=1`` at small shapes."""

import types

import pytest
import torch

from seqkernels._triton import triton_available

pytestmark = [pytest.mark.triton, pytest.mark.usefixtures("poison")]

from test_mlstm import assert_all_close, make_inputs, run  # noqa: E402

from seqkernels.mlstm import mlstm, mlstm_parallel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _triton(*args, **kw):
    from seqkernels.mlstm.triton_ops import mlstm_triton

    return mlstm_triton(*args, **kw)


def _to(x, st, dtype=None):
    x = [t.to(DEV, dtype) for t in x]
    return x, None if st is None else tuple(t.to(DEV, dtype) for t in st)


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize(
    "S,chunk,DQK,DV,init",
    [(1, 16, 8, 8, False), (17, 16, 8, 24, True), (37, 16, 16, 8, False), (150, 128, 8, 16, True)],
)
def test_matches_parallel_float64(gate, S, chunk, DQK, DV, init):
    """Length 1, just over a chunk, a prime, and a chunk of two query/key tiles (S not a multiple).
    float64 under the interpreter; on CUDA (no float64 Triton path) float32 with IEEE dots."""
    x, st = _to(*make_inputs(1, 2, S, DQK, DV, gate, init=init, seed=S))
    out_p, grad_p = run(mlstm_parallel, x, st, gate)
    dtype = torch.float64 if DEV == "cpu" else torch.float32
    tol = dict(rtol=1e-9, atol=1e-10) if DEV == "cpu" else dict(rtol=1e-4, atol=1e-4)
    torch.set_float32_matmul_precision("highest")
    out, grad = run(_triton, *_to(x, st, dtype), gate, chunk_size=chunk)
    assert all(torch.isfinite(t).all() for t in out + [g for g in grad if g is not None])
    assert_all_close([t.double() for t in out], out_p, **tol)
    assert_all_close([g.double() if g is not None else g for g in grad], grad_p, **{k: 10 * v for k, v in tol.items()})


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_matches_parallel_float32(gate):
    x, st = make_inputs(2, 1, 21, 16, 16, gate, init=True, seed=11)
    out_p, grad_p = run(mlstm_parallel, *_to(x, st), gate)
    torch.set_float32_matmul_precision("highest")
    out, grad = run(_triton, *_to(x, st, torch.float32), gate, chunk_size=16)
    assert_all_close([t.double() for t in out], out_p, rtol=1e-4, atol=1e-4)
    assert_all_close([g.double() for g in grad], grad_p, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_explicit_tiles():
    """Non-default tiles (16-row blocks of a 32-step chunk, 16-wide feature and state tiles, 2 warps, one
    stage): two query/key blocks per chunk, two feature blocks of DQK = DV = 24, 3 chunks; forward and
    gradients against the parallel form."""
    from seqkernels.mlstm.triton_ops import MlstmTiles

    tiles = MlstmTiles(blq=16, blkv=16, bk=16, bv=16, bv_dqdk=16, bki=16, bvi=16, bl=16, warps=2, stages=1)
    x, st = make_inputs(1, 2, 70, 24, 24, "exp", init=True, seed=15)
    out_p, grad_p = run(mlstm_parallel, *_to(x, st), "exp")
    torch.set_float32_matmul_precision("highest")
    out, grad = run(lambda *a, **k: _triton(*a, tiles=tiles, **k), *_to(x, st, torch.float32), "exp", chunk_size=32)
    assert_all_close([t.double() for t in out], out_p, rtol=1e-4, atol=1e-4)
    assert_all_close([g.double() for g in grad], grad_p, rtol=1e-3, atol=1e-3)


def test_large_input_gates_stay_finite():
    x, st = make_inputs(1, 1, 20, 8, 8, "exp", init=True, seed=12)
    x[3] = x[3] + 60.0  # exp(60) overflows float32 without the max state
    want = mlstm_parallel(*_to(x, st)[0], initial_state=_to(x, st)[1])
    got = _triton(*_to(x, st, torch.float32)[0], initial_state=_to(x, st, torch.float32)[1], chunk_size=16)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_per_chunk_loop_is_bit_identical_to_fused(gate):
    """Paper 004: the on-chip inter-chunk recurrence and the per-chunk loop give the same bits."""
    from seqkernels.mlstm.triton_ops import _gates, run_inter_chunk_states

    x, st = _to(*make_inputs(1, 2, 50, 16, 16, gate, init=True, seed=13), torch.float32)
    b, li, a, g, amax = _gates(x[3], x[4], gate == "exp", 16, 4)
    c0, n0, m0 = st if gate == "exp" else (st[0], torch.zeros(1, 2, 16, device=DEV), torch.zeros(1, 2, device=DEV))
    fused = run_inter_chunk_states(x[1], x[2], a, g, amax, c0, n0, m0, exp_gate=gate == "exp", L=16, fused=True)
    loop = run_inter_chunk_states(x[1], x[2], a, g, amax, c0, n0, m0, exp_gate=gate == "exp", L=16, fused=False)
    for f, lp in zip(fused, loop):
        assert torch.isfinite(f).all()
        assert torch.equal(f, lp)
    h1 = _triton(*x, input_gate=gate, chunk_size=16, initial_state=st)
    h2 = _triton(*x, input_gate=gate, chunk_size=16, initial_state=st, fused_inter=False)
    assert torch.equal(h1, h2)


def test_entry_point_and_opcheck():
    from seqkernels.mlstm.triton_ops import mlstm_chunkwise_fwd

    x, st = _to(*make_inputs(1, 1, 17, 16, 16, "exp", init=True, seed=14), torch.float32)
    torch.testing.assert_close(mlstm(*x, backend="triton", chunk_size=16), _triton(*x, chunk_size=16))
    x = [t.requires_grad_(True) for t in x]
    st = [t.requires_grad_(True) for t in st]
    torch.library.opcheck(
        mlstm_chunkwise_fwd,
        (*x, *st, True, 16, 1e-6, True, "ieee", torch.float32),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_forward_op_stores_states_in_the_dtype_it_names(state_dtype):
    """The forward op stores the chunk states in the dtype its caller names, and its fake promises that
    dtype whatever the tile defaults say (a traced graph names it, so a cached graph cannot disagree
    with a changed default); ``mlstm_triton`` names ``_state_dtype`` of the default tiles."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from seqkernels.mlstm import triton_ops as tc

    x, st = _to(*make_inputs(1, 1, 20, 16, 16, "exp", init=True, seed=16), torch.bfloat16)
    args = (*x, *(t.float() for t in st), True, 16, 1e-6, True, tc._precision(torch.bfloat16), state_dtype)
    real = tc.mlstm_chunkwise_fwd(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = tc.mlstm_chunkwise_fwd(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert real[1].dtype == fake[1].dtype == state_dtype
    assert [t.shape for t in real] == [t.shape for t in fake]
    assert tc._state_dtype(torch.bfloat16, tc.default_tiles(torch.bfloat16, "tf32")) == torch.bfloat16
    assert tc._state_dtype(torch.bfloat16, tc.default_tiles(torch.bfloat16, "tf32"), False) == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.slow
def test_compiled_matches_eager(dtype):
    """Under ``torch.compile`` (the custom ops, their fakes and autograd registration; Inductor on a GPU,
    ``aot_eager`` under the CPU interpreter) the output, final state and gradients equal the eager path's."""
    x, st = _to(*make_inputs(2, 2, 37, 16, 16, "exp", init=True, seed=17), dtype)

    def loss(*t):
        h, (c, n, m) = _triton(*t[:5], chunk_size=16, initial_state=t[5:], return_last_state=True)
        return h.float().square().sum() + c.float().sum() + n.float().sum() + m.float().sum(), h

    compiled = torch.compile(loss, fullgraph=True, backend="inductor" if DEV == "cuda" else "aot_eager")
    outs = []
    for fn in (loss, compiled):
        leaves = [t.detach().clone().requires_grad_(True) for t in (*x, *st)]
        value, h = fn(*leaves)
        value.backward()
        outs.append([value.detach(), h.detach(), *(t.grad for t in leaves)])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("S", [17, 32])
def test_backward_op_outputs_match_its_fake(S):
    """``mlstm_chunkwise_bwd``'s outputs have the shapes and strides its fake kernel promises (what
    ``torch.compile`` plans with), with and without a partial last chunk."""
    from seqkernels.mlstm.triton_ops import mlstm_chunkwise_bwd, mlstm_chunkwise_fwd

    x, st = _to(*make_inputs(1, 2, S, 16, 16, "exp", init=True, seed=15), torch.float32)
    h, cst, nst, mst, mtok, dtok, c_last, _ = mlstm_chunkwise_fwd(*x, *st, True, 16, 1e-6, True, "ieee", torch.float32)
    dc, dn = torch.randn_like(c_last), torch.randn_like(nst[:, :, -1])
    args = (torch.randn_like(h), dc, dn, *x, h, cst, nst, mst, mtok, dtok, c_last, True, 16, 1e-6, "ieee")
    torch.library.opcheck(mlstm_chunkwise_bwd, args, test_utils=("test_schema", "test_faketensor"))


def test_bad_inputs():
    x, _ = _to(*make_inputs(1, 1, 17, 16, 16, "exp"), torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        _triton(*x, chunk_size=24)
    with pytest.raises(ValueError, match="contiguous"):
        _triton(x[0].transpose(-1, -2).contiguous().transpose(-1, -2), *x[1:], chunk_size=16)
    with pytest.raises(TypeError, match="one dtype"):
        _triton(x[0], x[1].double(), *x[2:], chunk_size=16)
    if not triton_available(torch.zeros(1)):
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            _triton(*[t.cpu() for t in x])


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def _spy_launches(monkeypatch):
    """Record (kernel name, launch meta) of every kernel launch of ``triton_ops``."""
    import seqkernels.mlstm.triton_ops as tc

    metas = []
    real = tc._launch

    def spy(kernel, grid, args, meta, shrink=()):
        metas.append((kernel.fn.__name__ if hasattr(kernel, "fn") else repr(kernel), dict(meta)))
        return real(kernel, grid, args, meta, shrink)

    monkeypatch.setattr(tc, "_launch", spy)
    return metas


DOT_KERNELS = {
    "inter_chunk_states",
    "intra_chunk_h",
    "inter_chunk_dstates",
    "intra_chunk_dq",
    "intra_chunk_dk",
    "intra_chunk_dv",
}
KERNELS = DOT_KERNELS | {"chunk_gates", "gate_grads"}  # the gate kernels have no dots


def _precs(metas):
    return {m["PREC"] for name, m in metas if name in DOT_KERNELS}


def test_float32_exp_gradients_with_active_normalizer(monkeypatch):
    """float32 mLSTMexp at matmul precision "high" with large input gates (pre-activations +2..+6, so
    the max state and the normalizer are active and dP = inv dh V^T + dd cancels): every gradient
    within 1e-3 (relative norm) of float64, df included (it is a reverse cumulative sum of
    q.dq - k.dk). Also checks that every kernel of the forward and the backward is launched with
    3-pass TF32 (the interpreter computes every dot in full float32, so the accuracy half alone could
    not catch a single-pass TF32 dot on the CPU; test_every_dot_takes_the_launch_precision covers
    the dots inside the kernels)."""
    B, NH, S, DQK, DV, L = 1, 2, 130, 32, 48, 64
    x, _ = make_inputs(B, NH, S, DQK, DV, "exp", seed=21)
    g = torch.Generator().manual_seed(22)
    x[3] = 2.0 + 4.0 * torch.rand(B, NH, S, generator=g, dtype=torch.float64)
    dh = torch.randn(B, NH, S, DV, generator=g, dtype=torch.float64)

    def grads(fn, xs):
        xs = [t.detach().clone().requires_grad_(True) for t in xs]
        h = fn(*xs)
        return [h.detach(), *torch.autograd.grad(h, xs, dh.to(h.device, h.dtype))]

    want = grads(lambda *a: mlstm_parallel(*a, input_gate="exp"), x)
    metas = _spy_launches(monkeypatch)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # the benchmark's setting: 3-pass TF32 on CUDA
    try:
        got = grads(lambda *a: _triton(*a, input_gate="exp", chunk_size=L), _to(x, None, torch.float32)[0])
    finally:
        torch.set_float32_matmul_precision(old)
    errs = [_rel(a.cpu(), b) for a, b in zip(got, want)]
    assert all(e < 1e-3 for e in errs), errs  # h, dq, dk, dv, di, df
    assert {name for name, _ in metas} == KERNELS
    assert _precs(metas) == {"tf32x3"}


def test_every_dot_takes_the_launch_precision():
    """Every ``tl.dot`` in the forward and backward kernels passes ``input_precision=PREC`` (the one
    launch value, ``_precision``), and every kernel with a dot declares ``PREC``: no dot can run at
    Triton's default (single-pass TF32 for float32) or at another precision. Read from the source."""
    import ast
    import inspect

    from seqkernels.mlstm import bwd_kernels, fwd_kernels

    with_dots = set()
    for mod in (fwd_kernels, bwd_kernels):
        tree = ast.parse(inspect.getsource(mod))
        for fn in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
            calls = [
                c
                for c in ast.walk(fn)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "dot"
            ]
            if calls:
                assert "PREC" in [a.arg for a in fn.args.args], fn.name
            for c in calls:
                kw = {k.arg: k.value for k in c.keywords}
                assert isinstance(kw.get("input_precision"), ast.Name) and kw["input_precision"].id == "PREC", (
                    f"{mod.__name__}.{fn.name} line {c.lineno}: tl.dot without input_precision=PREC"
                )
            with_dots |= {fn.name} if calls else set()
    assert with_dots == DOT_KERNELS - {"inter_chunk_states"} | {"_state_update"}  # the walk found the dots


def test_float32_precision_follows_torch_setting():
    """float32: "high" -> 3-pass TF32 (accurate, the default on tensor cores), "medium" -> single-pass
    TF32 (opt-in, the peers' precision), "highest" -> IEEE; other dtypes fixed."""
    import seqkernels.mlstm.triton_ops as tc

    old = torch.get_float32_matmul_precision()
    try:
        for setting, want in (("high", "tf32x3"), ("medium", "tf32"), ("highest", "ieee")):
            torch.set_float32_matmul_precision(setting)
            assert tc._precision(torch.float32) == want
            assert tc._precision(torch.float64) == "ieee"
            assert tc._precision(torch.bfloat16) == "tf32"  # 16-bit operands: multiplied in their own type
    finally:
        torch.set_float32_matmul_precision(old)


def test_backward_reuses_the_forward_precision(monkeypatch):
    """The precision is fixed when the forward runs: changing the torch setting before backward()
    does not mix precisions within one forward + backward; "medium" reaches every kernel."""
    metas = _spy_launches(monkeypatch)
    x, _ = _to(*make_inputs(1, 1, 20, 16, 16, "exp", seed=23), torch.float32)
    x = [t.requires_grad_(True) for t in x]
    old = torch.get_float32_matmul_precision()
    try:
        for fwd, bwd in (("medium", "high"), ("high", "medium")):
            metas.clear()
            torch.set_float32_matmul_precision(fwd)
            h = _triton(*x, chunk_size=16)
            torch.set_float32_matmul_precision(bwd)
            h.sum().backward()
            assert {name for name, _ in metas} == KERNELS
            assert _precs(metas) == {"tf32" if fwd == "medium" else "tf32x3"}
    finally:
        torch.set_float32_matmul_precision(old)


@pytest.mark.parametrize("L", [64, 128])
def test_float32_tiles_fit_with_3_pass_tf32(L):
    """At the benchmark shape (DQK=128, DV=256) 3-pass TF32 halves the DV tile of the dq / dk kernels
    (a loop tile, not a grid dimension) so they fit 227 KiB of shared memory
    (python -m benchmarks.ops compile measures every kernel); other precisions and bf16 keep the tiles;
    the launch fallback never changes the precision."""
    import seqkernels.mlstm.triton_ops as tc

    cfg = tc._config(L, 128, 256, tc.default_tiles(torch.float32, "tf32x3"))
    assert cfg["BVDP"] <= 64 and cfg["BV"] == 128
    for dtype, prec in ((torch.float32, "tf32"), (torch.float32, "ieee"), (torch.bfloat16, "tf32")):
        assert tc._config(L, 128, 256, tc.default_tiles(dtype, prec))["BVDP"] == 128
    assert all("PREC" not in lv for lv in tc._LADDER)


class OutOfResources(Exception):
    pass


class _Fake:
    def __init__(self, fits=lambda meta: True, name="fake"):
        self.calls, self.fits = [], fits
        self.fn = types.SimpleNamespace(__name__=name)

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.calls.append(meta)
            if not self.fits(meta):
                raise OutOfResources("shared memory")

        return launch


def test_launch_falls_back_when_out_of_shared_memory(monkeypatch):
    """A kernel that does not fit is retried with one pipeline stage, then with the caller's smaller
    (non-grid) tiles; never with a lower precision; if nothing fits, a clear error."""
    import seqkernels.mlstm.triton_ops as tc

    monkeypatch.setattr(tc, "_LEVEL", {})
    k = _Fake(lambda meta: meta["BV"] <= 32)
    meta = {"PREC": "tf32x3", "num_stages": 2, "BV": 64}
    tc._launch(k, (1,), (), meta, ({"BV": 32},))
    assert [(c["num_stages"], c["BV"], c["PREC"]) for c in k.calls] == [
        (2, 64, "tf32x3"),
        (1, 64, "tf32x3"),
        (1, 32, "tf32x3"),
    ]
    tc._launch(k, (1,), (), meta, ({"BV": 32},))  # remembered: one call
    assert len(k.calls) == 4
    never = _Fake(lambda meta: False, "never")
    with pytest.raises(RuntimeError, match="precision is not lowered"):
        tc._launch(never, (1,), (), {"PREC": "tf32x3", "num_stages": 2, "BV": 64}, ({"BV": 32},))
    assert all(c["PREC"] == "tf32x3" for c in never.calls) and len(never.calls) == 3
    other = _Fake(name="other")
    other.fits = lambda meta: (_ for _ in ()).throw(ValueError("not a resource error"))
    with pytest.raises(ValueError, match="not a resource error"):
        tc._launch(other, (1,), (), {"num_stages": 2})


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize("S, block", [(37, 1024), (150, 64)])
@pytest.mark.slow
def test_gate_kernels_match_torch(gate, S, block):
    """``chunk_gates`` / ``gate_grads`` (``MlstmTiles.gate_kernels``) against their PyTorch references
    in float64: S not a multiple of the chunk (padding: log f = 0, log i = -inf), and S = 150 over three
    blocks of 64 of the reverse cumulative sum, with and without the final-state term."""
    from seqkernels.mlstm.triton_ops import _gate_grads, _gate_grads_torch, _gates

    B, NH, L, NKB = 2, 3, 16, 2
    NC = -(-S // L)
    g = torch.Generator().manual_seed(S)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(DEV)  # noqa: E731
    i_pre, f_pre = 3.0 * r(B, NH, S), 2.0 + 3.0 * r(B, NH, S)
    for got, want in zip(
        _gates(i_pre, f_pre, gate == "exp", L, NC, kernel=True), _gates(i_pre, f_pre, gate == "exp", L, NC)
    ):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)  # -inf padding compares equal
    qdq, kdk = r(NKB, B, NH, NC * L), r(NKB, B, NH, NC * L)
    for dlast in (None, r(B, NH)):
        for got, want in zip(
            _gate_grads(qdq, kdk, i_pre, f_pre, dlast, gate == "exp", block),
            _gate_grads_torch(qdq, kdk, i_pre, f_pre, dlast, gate == "exp"),
        ):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(DEV != "cuda", reason="a GPU's test (the interpreter takes a minute)")
@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_gate_kernels_match_torch_in_the_default_blocks(gate):
    """As above at S = 2100: three of the default 1024-step blocks."""
    test_gate_kernels_match_torch(gate, 2100, 1024)


def _opts_run(x, st, gate, dtype, chunk, **opts):
    from seqkernels.mlstm.triton_ops import MlstmTiles

    tiles = MlstmTiles(bki=16, bvi=16, **opts)
    return run(lambda *a, **k: _triton(*a, tiles=tiles, **k), *_to(x, st, dtype), gate, chunk_size=chunk)


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize("gate_kernels", [False, True])
@pytest.mark.parametrize("init", [False, True])
def test_options_match_parallel_float64(gate, gate_kernels, init):
    """Both gate-vector paths (PyTorch ops, ``chunk_gates`` + ``gate_grads``) with and without an
    initial state at S = 37 (two full chunks of 16 and a partial one), forward and every gradient,
    against the float64 parallel form (``lp_states`` is a no-op for float64: see the bf16 test)."""
    if DEV != "cpu":
        pytest.skip("float64 Triton runs under the interpreter only")
    x, st = make_inputs(1, 2, 37, 16, 24, gate, init=init, seed=31)
    out_p, grad_p = run(mlstm_parallel, x, st, gate)
    out, grad = _opts_run(x, st, gate, torch.float64, 16, gate_kernels=gate_kernels)
    assert_all_close(out, out_p, rtol=1e-9, atol=1e-10)
    assert_all_close(grad, grad_p, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.slow
def test_lp_states_bf16_bit_identical(gate):
    """bfloat16: chunk states stored in bfloat16 (``lp_states``) give the same bits as float32
    storage for h, the final state and every gradient (the readers cast to bfloat16 before their
    dots either way); S = 45 (partial last chunk), chunk 16, initial state; and (on CUDA) h, the
    final state and the gradients are within bfloat16 error of the float64 parallel form (Triton's
    CPU interpreter computes bfloat16 kernels wrongly, every variant alike)."""
    x, st = make_inputs(1, 2, 45, 16, 32, gate, init=True, seed=32)
    ref_out, ref_grad = _opts_run(x, st, gate, torch.bfloat16, 16, lp_states=False)
    out, grad = _opts_run(x, st, gate, torch.bfloat16, 16, lp_states=True)
    for a, b in zip(out + grad, ref_out + ref_grad):
        assert (a is None and b is None) or torch.equal(a, b)
    if DEV == "cpu":
        return
    out_p, grad_p = run(mlstm_parallel, *_to(x, st), gate)
    errs = [_rel(a.cpu(), b.cpu()) for a, b in zip(out[:2] + grad, out_p[:2] + grad_p) if b is not None]
    assert all(e < 1e-1 for e in errs), (
        errs
    )  # bfloat16 inputs at S = 45: up to 5.1e-2 on an H200 (a wrong kernel: O(1))
