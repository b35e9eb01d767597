"""The Triton (TFLA) mLSTM against the parallel reference: forward, every gradient, states; outputs
poisoned with NaN first; the per-chunk inter-chunk loop is bit-identical to the fused recurrence.
On the CPU these run under ``TRITON_INTERPRET=1`` at small shapes."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from kernels._triton import triton_available, triton_importable

pytestmark = pytest.mark.skipif(
    not triton_importable() or not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs Triton on CUDA or TRITON_INTERPRET=1",
)

from test_mlstm import assert_all_close, make_inputs, run  # noqa: E402

from kernels.mlstm import mlstm, mlstm_parallel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    import kernels.mlstm.triton_chunkwise as tc

    monkeypatch.setattr(tc, "POISON", True)


def _triton(*args, **kw):
    from kernels.mlstm.triton_chunkwise import mlstm_triton

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


def test_large_input_gates_stay_finite():
    x, st = make_inputs(1, 1, 20, 8, 8, "exp", init=True, seed=12)
    x[3] = x[3] + 60.0  # exp(60) overflows float32 without the max state
    want = mlstm_parallel(*_to(x, st)[0], initial_state=_to(x, st)[1])
    got = _triton(*_to(x, st, torch.float32)[0], initial_state=_to(x, st, torch.float32)[1], chunk_size=16)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_per_chunk_loop_is_bit_identical_to_fused(gate):
    """Paper 004: the on-chip inter-chunk recurrence and the per-chunk loop give the same bits."""
    from kernels.mlstm.triton_chunkwise import _gates, run_inter_chunk_states

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
    from kernels.mlstm.triton_chunkwise import mlstm_chunkwise_fwd

    x, st = _to(*make_inputs(1, 1, 17, 16, 16, "exp", init=True, seed=14), torch.float32)
    torch.testing.assert_close(mlstm(*x, backend="triton", chunk_size=16), _triton(*x, chunk_size=16))
    x = [t.requires_grad_(True) for t in x]
    st = [t.requires_grad_(True) for t in st]
    torch.library.opcheck(mlstm_chunkwise_fwd, (*x, *st, True, 16, 1e-6, True),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


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


def test_launch_falls_back_when_out_of_shared_memory(monkeypatch):
    """A kernel that does not fit is retried with one pipeline stage, then single-pass TF32."""
    import kernels.mlstm.triton_chunkwise as tc

    class OutOfResources(Exception):
        pass

    calls = []

    class Fake:
        fn = type("F", (), {"__name__": "fake"})

        def __getitem__(self, grid):
            def launch(*args, **meta):
                calls.append(meta)
                if meta.get("PREC_DP") == "tf32x3":
                    raise OutOfResources("shared memory")

            return launch

    monkeypatch.setattr(tc, "_LEVEL", {})
    tc._launch(Fake(), (1,), (), {"PREC_DP": "tf32x3", "num_stages": 2})
    assert [c.get("num_stages") for c in calls] == [2, 1, 1] and calls[-1]["PREC_DP"] == "tf32"
    tc._launch(Fake(), (1,), (), {"PREC_DP": "tf32x3", "num_stages": 2})  # remembered: one call
    assert len(calls) == 4
    class Never(Fake):
        def __getitem__(self, grid):
            def launch(*args, **meta):
                raise OutOfResources("shared memory")

            return launch

    with pytest.raises(OutOfResources):  # nothing fits: the last failure propagates
        tc._launch(Never(), (1,), (), {"num_stages": 2})
