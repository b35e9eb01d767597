"""mixers.cells: RNNCell / cell_mixer / FlashGRU / FlashLSTM.

Parallel (Newton) vs sequential agreement, forward and every gradient, for FlashGRU, FlashLSTM and
three cells written here with only ``recurrence_step`` (diag, block2, dense); closed-form vs
autograd Jacobians; ``verify_jacobian`` at random states and parameters; ``verify_position_wise``;
the run-time Jacobian check; divergence fallback / raise; the fused hook; bad input; parameter
layout and initialization; and a short parity run that must be solved.
"""

import math
import warnings

import pytest
import torch
from example_cells import (
    Block2Cell,
    Block2DeclaredDiag,
    ChaoticCell,
    ClosedFormIgnoresC,
    CumsumOverDim2,
    DenseCell,
    DenseDeclaredDiag,
    DiagCell,
    RunningMeanOverTime,
    ZeroCouplingDiag,
    ZeroPairingDiag,
)
from torch import nn

from mixers import build_mixer, cell_mixer
from mixers.cells import CellMixer, FlashGRUCell, FlashLSTMCell, RNNCell
from mixers.cells.convergence import newton_residuals
from mixers.cells.mixer import JacobianMismatchError
from seqkernels._triton import triton_available
from seqkernels.newton import NewtonDivergenceError, autograd_jacobian
from seqkernels.scan import SCAN_BACKENDS

CELLS = [FlashGRUCell, FlashLSTMCell, DiagCell, Block2Cell, DenseCell]
BATCH = {1: 4, 2: 1, 7: 3, 100: 2, 1000: 2}


def _grads(y, gy, tensors):
    return torch.autograd.grad((y * gy).sum(), tensors)


def _close(got, want, tol):
    scale = max(1.0, float(want.abs().max()))
    assert float((got - want).abs().max()) <= tol * scale, (float((got - want).abs().max()), scale)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-8), (torch.float32, 1e-4)], ids=["f64", "f32"])
@pytest.mark.parametrize("L", [1, 2, 7, 100, 1000])
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.__name__)
def test_parallel_matches_sequential(cell, L, dtype, tol):
    torch.manual_seed(L)
    mixer = cell_mixer(
        cell, 24, num_heads=3, mode="parallel", iters=40, tol=1e-13 if dtype == torch.float64 else 1e-6
    ).to(dtype)
    x = torch.randn(BATCH[L], L, 24, dtype=dtype, requires_grad=True)
    params = [x, *mixer.parameters()]
    y = mixer(x)
    assert not mixer.last_newton_stats.fell_back and mixer.last_newton_stats.mode == "parallel"
    # the run-time Jacobian check ran on this first training forward (a dense autograd Jacobian needs none)
    assert mixer.jacobian_checks == (0 if cell is DenseCell else 1) and mixer.jacobian_fallback is None
    gy = torch.randn_like(y)
    got = _grads(y, gy, params)
    mixer.mode = "sequential"
    ys = mixer(x)
    want = _grads(ys, gy, params)
    _close(y.detach(), ys.detach(), tol)
    for g, w in zip(got, want):
        _close(g, w, tol)


@pytest.mark.parametrize("cell", [FlashGRUCell, FlashLSTMCell])
def test_closed_form_jacobians_equal_autograd(cell):
    torch.manual_seed(0)
    c = cell(5, 6, clip_norm=None).double()
    with torch.no_grad():  # away from the init's small values, so every term of eq. 8 matters
        for p in c.parameters():
            p.normal_(0.0, 1.5)
    _, S = c.sizes()
    h, x = torch.randn(4, 9, S, dtype=torch.float64), torch.randn(4, 9, 5, dtype=torch.float64)
    u = c.input_projection(x)
    auto = autograd_jacobian(lambda hh: c.state_update(hh, u), h, c.jacobian)
    torch.testing.assert_close(c.jacobian_fn(h, u), auto, rtol=1e-12, atol=1e-12)
    check = c.verify_jacobian()
    assert check.ok and check.closed_form_error < 1e-12 and check.off_structure == 0.0


def test_structured_jacobian_by_autograd():
    torch.manual_seed(0)
    for cell in (DiagCell(3, 4), Block2Cell(3, 4), DenseCell(3, 4)):
        cell = cell.double()
        h, x = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
        full = torch.func.vmap(torch.func.jacrev(cell.recurrence_step))(h, x)  # (5, 4, 4)
        got = cell.structured_jacobian(h, x)
        if cell.jacobian == "diag":
            want = torch.diagonal(full, dim1=-2, dim2=-1)
        elif cell.jacobian == "block2":
            want = torch.stack(
                [
                    torch.stack(
                        [
                            torch.diagonal(full[:, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2], dim1=-2, dim2=-1)
                            for j in range(2)
                        ],
                        1,
                    )
                    for i in range(2)
                ],
                1,
            )
        else:
            want = full
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_verify_jacobian_catches_wrong_declarations():
    for cell, fits in [(DenseDeclaredDiag, "dense"), (Block2DeclaredDiag, "block2")]:
        with pytest.raises(ValueError, match=f"declares jacobian='diag'.*declare jacobian='{fits}'"):
            cell(4, 6).verify_jacobian()
        report = cell(4, 6).verify_jacobian(raise_on_error=False)
        assert not report.ok and report.off_structure > 1e-3
        with pytest.raises(ValueError, match="outside that structure"):
            cell_mixer(cell, 8, num_heads=2)
    for cell in (DiagCell, Block2Cell, DenseCell):
        assert cell(4, 6).verify_jacobian().ok

    class WrongClosedForm(FlashGRUCell):
        def jacobian_fn(self, h, u):
            return super().jacobian_fn(h, u) * 1.01

    with pytest.raises(ValueError, match="jacobian_fn differs from autograd"):
        WrongClosedForm(4, 6).verify_jacobian()


def test_verify_jacobian_at_random_parameters_catches_zero_initialized_couplings():
    """At the built parameters these Jacobians fit the declaration; once a parameter moves they do not."""
    for cell, fits in [(ZeroCouplingDiag, "dense"), (ZeroPairingDiag, "block2")]:
        built = cell(4, 6).verify_jacobian(param_draws=0)  # what a check at the built parameters sees
        assert built.ok and built.off_structure == 0.0
        with pytest.raises(
            ValueError, match=f"declares jacobian='diag'.*at randomly moved parameters.*declare jacobian='{fits}'"
        ):
            cell(4, 6).verify_jacobian()
        report = cell(4, 6).verify_jacobian(raise_on_error=False)
        assert not report.ok and report.fits == fits and report.off_structure > 1e-3 and report.param_draws == 2
        with pytest.raises(ValueError, match=f"declare jacobian='{fits}'"):
            cell_mixer(cell, 8, num_heads=2)
    with pytest.raises(ValueError, match="jacobian_fn differs from autograd"):
        ClosedFormIgnoresC(4, 6).verify_jacobian()
    assert ClosedFormIgnoresC(4, 6).verify_jacobian(param_draws=0).ok
    # the moved parameters: every trainable parameter moved, buffers and frozen ones kept, the constraint applied
    from mixers.cells.base import _parameter_draws

    gru = FlashGRUCell(4, 6)
    gru.b.requires_grad_(False)
    draws = _parameter_draws(gru, 3, torch.Generator().manual_seed(0))
    assert {k: tuple(v.shape) for k, v in draws.items()} == {"B": (4, 3, 4, 6), "b": (4, 3, 6), "a": (4, 3, 6)}
    assert (draws["b"] == 0).all() and (draws["B"][1:] != draws["B"][0]).all()
    assert float(draws["a"].abs().max()) <= gru.clip_norm and torch.equal(draws["a"][0].float(), gru.a.detach())


def test_verify_position_wise():
    for cell in (RunningMeanOverTime, CumsumOverDim2):
        check = cell(4, 6).verify_position_wise(raise_on_error=False)
        assert not check.ok and check.error > 0.1 and "breaks the position-wise rule" in check.message
        with pytest.raises(ValueError, match="position-wise"):
            cell_mixer(cell, 8, num_heads=2)
    for cell in (*CELLS, ZeroCouplingDiag):
        check = cell(4, 6).verify_position_wise()
        assert check.ok and check.error < 1e-12


def _moved_coupling_mixer(check_every, on_divergence="fallback"):
    torch.manual_seed(0)
    mixer = cell_mixer(
        ZeroCouplingDiag,
        12,
        num_heads=2,
        mode="parallel",
        iters=30,
        tol=1e-13,
        verify=False,
        jacobian_check_every=check_every,
        on_divergence=on_divergence,
    ).double()
    x = torch.randn(3, 40, 12, dtype=torch.float64, requires_grad=True)
    for _ in range(2):  # R = 0: the declaration holds
        mixer(x).sum().backward()
    with torch.no_grad():  # training moves the coupling
        for c in mixer.cells:
            c.R.normal_(0.0, 0.01)
    return mixer, x


def _grad_errors(mixer, x, tensors=None):
    """Max relative errors of this forward's gradients (``x`` and ``tensors``; default: every parameter)
    against the sequential loop's."""
    gy = torch.randn(*x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    tensors = [x, *(mixer.parameters() if tensors is None else tensors)]
    got = _grads(mixer(x), gy, tensors)
    mode, mixer.mode = mixer.mode, "sequential"
    want = _grads(mixer(x), gy, tensors)
    mixer.mode = mode
    return [float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want)]


def test_run_time_jacobian_check_catches_a_coupling_moved_by_training():
    every = 4
    # without the check the parallel gradients are silently wrong (the forward's residual check passes)
    mixer, x = _moved_coupling_mixer(0)
    errors = _grad_errors(mixer, x, [mixer.cells[0].R])
    assert min(errors) > 1e-3 and not mixer.last_newton_stats.fell_back, errors
    # raise: within `every` training forwards, naming the declared and the fitting structure
    mixer, x = _moved_coupling_mixer(every, "raise")
    with pytest.raises(JacobianMismatchError, match="declares jacobian='diag'.*declare jacobian='dense'"):
        for _ in range(every):
            mixer(x)
    # no_grad forwards neither count nor check
    mixer, x = _moved_coupling_mixer(every)
    with torch.no_grad():
        for _ in range(2 * every):
            mixer(x)
    assert mixer.jacobian_checks == 1 and mixer.jacobian_fallback is None  # the first forward only
    # fallback: the checking forward and every later one solve with the dense structure by autograd
    caught = None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(every):
            errors = _grad_errors(mixer, x)
            if mixer.jacobian_fallback is not None:
                caught = k
                break
    said = "declare jacobian='dense'; this mixer now solves with jacobian='dense' by autograd"
    assert [str(w.message).endswith(said) for w in seen if w.category is RuntimeWarning] == [True]
    assert caught is not None and caught < every and mixer.structure == "dense" and not mixer.closed_form
    assert all(e < 1e-9 for e in errors), errors  # the checking forward's gradients are right
    assert all(e < 1e-9 for e in _grad_errors(mixer, x)) and mixer.jacobian_checks == 2


def test_run_time_jacobian_check_of_closed_forms_and_position_wise_steps():
    torch.manual_seed(0)
    x = torch.randn(2, 30, 8, dtype=torch.float64, requires_grad=True)
    mixer = cell_mixer(
        ClosedFormIgnoresC,
        8,
        num_heads=2,
        mode="parallel",
        iters=30,
        tol=1e-13,
        verify=False,
        jacobian_check_every=1,
        on_divergence="raise",
    ).double()
    mixer(x)  # c = 0: the closed form is right
    with torch.no_grad():
        for c in mixer.cells:
            c.c.normal_(0.0, 0.3)
    assert "jacobian_fn differs from autograd" in mixer.check_jacobian(x)
    with pytest.raises(JacobianMismatchError, match="jacobian_fn differs from autograd"):
        mixer(x)
    mixer.on_divergence = "fallback"
    with pytest.warns(RuntimeWarning, match="now solves with jacobian='diag' by autograd"):
        mixer(x)
    assert mixer.structure == "diag" and not mixer.closed_form and max(_grad_errors(mixer, x)) < 1e-9
    # a step that cannot be differentiated one position at a time: sequential from then on
    cum = cell_mixer(CumsumOverDim2, 8, num_heads=2, mode="parallel", verify=False, jacobian_check_every=1).double()
    with pytest.warns(RuntimeWarning, match="position-wise rule.*now runs sequentially"):
        y = cum(x)
    assert cum.resolve_mode(x) == "sequential" and cum.last_newton_stats.mode == "sequential"
    cum.mode = "sequential"
    torch.testing.assert_close(y, cum(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="jacobian_check_every must be an int >= 0"):
        cell_mixer(DiagCell, 8, num_heads=2, jacobian_check_every=-1)


def test_divergence_falls_back_or_raises():
    torch.manual_seed(0)
    x = torch.randn(2, 50, 8, requires_grad=True)
    mixer = cell_mixer(ChaoticCell, 8, num_heads=2, mode="parallel", iters=3)
    y = mixer(x)
    stats = mixer.last_newton_stats
    assert stats.fell_back and mixer.fallback_count == 1 and len(stats.residuals) == 4 and stats.residuals[-1] > 1e-4
    mixer.mode = "sequential"
    torch.testing.assert_close(y, mixer(x), rtol=0, atol=0)
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(gx).all()
    raising = cell_mixer(ChaoticCell, 8, num_heads=2, mode="parallel", iters=3, on_divergence="raise")
    with pytest.raises(NewtonDivergenceError, match="did not converge") as info:
        raising(x)
    assert len(info.value.residuals) == 4
    # a converging cell stopped too early (0 iterations: only the initial guess) also falls back
    gru = cell_mixer(FlashGRUCell, 8, num_heads=2, mode="parallel", iters=0)
    gru(x)
    assert gru.last_newton_stats.fell_back and gru.fallback_count == 1


class TorchFusedGRU(FlashGRUCell):
    """Implements the fused hook in plain torch (a loop) to test its contract."""

    @classmethod
    def fused_apply(cls, params, u, *, iters, tol):
        a = params["a"]  # (H, 3, Ds)
        H, B, L = u.shape[:3]
        assert params["B"].shape == (H, 3, 4, 4) and u.shape == (H, B, L, 3, 4)
        h, out = u.new_zeros(H, B, a.shape[-1]), []
        az, ar, ac = (a[:, k, None, :] for k in range(3))
        for t in range(L):
            ut = u[:, :, t]
            z, r = torch.sigmoid(az * h + ut[..., 0, :]), torch.sigmoid(ar * h + ut[..., 1, :])
            h = (1 - z) * h + z * torch.tanh(ac * h * r + ut[..., 2, :])
            out.append(h)
        return torch.stack(out, dim=2) + (cls.offset if iters < cls.exact_from_iters else 0.0)

    offset = 0.0  # error of a broken kernel ...
    exact_from_iters = 10**9  # ... unless it runs this many iterations


@pytest.mark.skipif(not triton_available(torch.zeros(1)), reason="needs Triton (the CPU interpreter)")
@pytest.mark.parametrize("cell", [FlashGRUCell, FlashLSTMCell])
@pytest.mark.parametrize("first_passes", [True, False])
@pytest.mark.slow
def test_in_graph_resolve_is_predicated_on_the_first_check(monkeypatch, cell, first_passes):
    """``_solve_in_graph`` (the policy a captured step runs) passes the first solve's check to the fused
    re-solve as ``skip``: when it passed, the re-solve runs no iteration (its result is the initial guess,
    unused); either way the states, their gradients, ``step_ok`` and the device counts equal those of the
    re-solve run in full (a ``fused_apply`` without ``skip``). Called directly: outside a capture, and on
    the CPU under the Triton interpreter."""
    torch.manual_seed(1)
    x = torch.randn(2, 23, 8)
    g = None
    runs = {}
    for takes_skip in (True, False):
        torch.manual_seed(2)
        m = cell_mixer(
            cell,
            8,
            num_heads=2,
            mode="fused",
            iters=3 if first_passes else 1,
            divergence_tol=1e-2 if first_passes else 1e-30,
            retry_iters=12,
        )
        assert m._fused_takes_skip
        m._fused_takes_skip = takes_skip
        seen = []
        fused = type(m.cells[0]).fused_apply
        monkeypatch.setattr(
            type(m.cells[0]), "fused_apply", classmethod(lambda c, *a, **k: seen.append(fused(*a, **k)) or seen[-1])
        )
        params = m.stacked_parameters()
        B, L, _ = x.shape
        u = m._heads("input_projection", params, x.reshape(B, L, 2, -1).permute(2, 0, 1, 3))
        h = m._solve_in_graph("fused", u, params, x)
        g = torch.randn_like(h) if g is None else g
        grads = torch.autograd.grad(h, list(params.values()), g, allow_unused=True)
        runs[takes_skip] = (h, grads, m.step_ok.clone(), m.graph_counts.clone(), seen)
        monkeypatch.undo()
    (h, grads, ok, counts, seen), (h_full, grads_full, ok_full, counts_full, seen_full) = runs[True], runs[False]
    assert bool(ok) == bool(ok_full) == first_passes  # (failing: 1e-30 fails the re-solve too)
    torch.testing.assert_close(h, h_full, rtol=0, atol=0)
    for a, b in zip(grads, grads_full):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(ok, ok_full) and torch.equal(counts, counts_full)
    assert len(seen) == len(seen_full) == 2
    torch.testing.assert_close(seen[0], seen_full[0], rtol=0, atol=0)  # the first solves agree
    if first_passes:  # the predicated re-solve returned the initial guess, the full one 12 iterations' result
        guess = type(m.cells[0]).fused_apply(m.stacked_parameters(), u.detach(), iters=0, tol=None)
        torch.testing.assert_close(seen[1], guess, rtol=0, atol=0)
        assert not torch.equal(seen[1], seen_full[1])
    else:
        torch.testing.assert_close(seen[1], seen_full[1], rtol=0, atol=0)


@pytest.mark.parametrize("cell", [FlashGRUCell, FlashLSTMCell])
def test_heads_input_projection_equals_the_per_head_projection(cell):
    """The Flash cells' one-GEMM projection of all heads (block-diagonal weight) gives each head's
    ``input_projection`` and the same gradients (float64, 3 heads of 5 channels, an odd length)."""
    torch.manual_seed(3)
    m = cell_mixer(cell, 15, num_heads=3, mode="parallel").double()
    for c in m.cells:  # non-zero biases, so their broadcast is checked too
        torch.nn.init.normal_(c.b)
    x = torch.randn(2, 7, 15, dtype=torch.float64, requires_grad=True)
    params = m.stacked_parameters()
    fast = cell.heads_input_projection(params, x)
    per_head = m._heads("input_projection", params, x.reshape(2, 7, 3, 5).permute(2, 0, 1, 3))
    assert fast.shape == per_head.shape == (3, 2, 7, 3, 5)
    torch.testing.assert_close(fast, per_head, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(fast)
    leaves = [x, params["B"], params["b"]]
    for a, b in zip(torch.autograd.grad(fast, leaves, g), torch.autograd.grad(per_head, leaves, g)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_fused_hook_contract_and_check():
    torch.manual_seed(0)
    x = torch.randn(2, 9, 8, requires_grad=True)
    fused = cell_mixer(TorchFusedGRU, 8, num_heads=2, mode="fused")
    y = fused(x)
    assert fused.last_newton_stats.mode == "fused" and fused.last_newton_stats.final_residual < 1e-5
    fused.mode = "sequential"
    torch.testing.assert_close(y, fused(x))
    TorchFusedGRU.offset = 0.1  # a broken kernel: the residual check catches it
    try:
        fused.mode = "fused"
        torch.testing.assert_close(fused(x), y)  # retried with 12 iterations, still wrong: sequential
        stats = fused.last_newton_stats
        assert stats.retried and stats.fell_back and fused.fallback_count == 1 and fused.retry_count == 1
        assert len(stats.residuals) == 2 and min(stats.residuals) > 0.05
        TorchFusedGRU.exact_from_iters = 12  # not converged in 3 iterations, converged in max(4 * 3, 8)
        torch.testing.assert_close(fused(x), y)
        stats = fused.last_newton_stats
        assert stats.retried and not stats.fell_back and fused.fallback_count == 1 and fused.retry_count == 2
        assert stats.residuals[0] > 0.05 and stats.final_residual < 1e-5
        no_retry = cell_mixer(TorchFusedGRU, 8, num_heads=2, mode="fused", retry_iters=0)
        TorchFusedGRU.exact_from_iters = 4
        no_retry(x)
        assert (
            no_retry.last_newton_stats.fell_back
            and not no_retry.last_newton_stats.retried
            and no_retry.retry_count == 0
        )
        with pytest.raises(ValueError, match="retry_iters"):
            cell_mixer(TorchFusedGRU, 8, num_heads=2, mode="fused", retry_iters=-1)
    finally:
        TorchFusedGRU.offset, TorchFusedGRU.exact_from_iters = 0.0, 10**9


def test_modes_and_bad_input():
    m = build_mixer("flashgru", d_model=8, num_heads=2)
    assert m.resolve_mode(torch.zeros(1, 2, 8)) == "parallel" and m.BACKENDS[0] == "auto"
    assert build_mixer("flashgru", d_model=8, num_heads=2, backend="sequential").mode == "sequential"
    cases = [
        (lambda: build_mixer("flashgru", d_model=8, mode="warp"), ValueError, "unknown mode 'warp'"),
        (lambda: cell_mixer(DiagCell, 8, backend="fused"), ValueError, "needs DiagCell.fused_apply"),
        (lambda: build_mixer("flashgru", d_model=8, mode="parallel", backend="sequential"), ValueError, "disagree"),
        (lambda: build_mixer("flashgru", d_model=10, num_heads=4), ValueError, "divisible by num_heads"),
        (lambda: build_mixer("flashgru", d_model=8, iters=-1), ValueError, "iters must be"),
        (lambda: build_mixer("flashgru", d_model=8, damping=3), ValueError, "damping must be"),
        (lambda: build_mixer("flashgru", d_model=8, clip_norm=-1), ValueError, "clip_norm must be"),
        (lambda: build_mixer("flashgru", d_model=8, colour="red"), TypeError, "unknown config key.*'colour'"),
        (lambda: cell_mixer(DenseCell, 8, mode="parallel-triton"), ValueError, "dense"),
        (lambda: m(torch.zeros(2, 3, 7)), ValueError, r"expected x of shape \(B, L, d_model=8\)"),
        (lambda: m(torch.zeros(2, 3, 8, dtype=torch.float64)), TypeError, "dtype"),
        (lambda: cell_mixer(nn.Linear, 8), TypeError, "RNNCell subclass"),
    ]
    for make, err, match in cases:
        with pytest.raises(err, match=match):
            make()
    if not ("triton" in SCAN_BACKENDS and triton_available(torch.zeros(1))):
        with pytest.raises(ValueError, match="parallel-triton"):
            build_mixer("flashgru", d_model=8, mode="parallel-triton")(torch.zeros(1, 3, 8))

    class WrongShape(RNNCell):
        jacobian = "diag"

        def __init__(self, d_in, d_state):
            super().__init__()

        def recurrence_step(self, h, x):
            return x  # d_in values, not d_state

    with pytest.raises(ValueError, match=r"recurrence_step returned shape \(2, 3, 2\).*expected \(2, 3, 3\)"):
        cell_mixer(WrongShape, 4, num_heads=2, d_state=6)

    with pytest.raises(ValueError, match="'tridiagonal' is not a Jacobian structure"):
        type("BadStructure", (DiagCell,), {"jacobian": "tridiagonal"})

    class OddBlock(Block2Cell):
        def __init__(self, d_in, d_state):
            super().__init__(d_in, d_state)
            self.state_size = 3

    with pytest.raises(ValueError, match="odd"):
        cell_mixer(OddBlock, 4, num_heads=2)


def test_flash_parameter_layout_init_and_clipping():
    torch.manual_seed(0)
    gru, lstm = build_mixer("flashgru", d_model=64), build_mixer("flashlstm", d_model=64)
    assert sum(p.numel() for p in gru.parameters()) == 3456  # paper 000 Parity†: 3.8k with the model around it
    assert sum(p.numel() for p in lstm.parameters()) == 3584
    with torch.no_grad():
        sg, sl = gru.stacked_parameters(), lstm.stacked_parameters()
    assert {k: tuple(v.shape) for k, v in sg.items()} == {"B": (4, 3, 16, 16), "b": (4, 3, 16), "a": (4, 3, 16)}
    assert tuple(sl["p"].shape) == (4, 2, 16) and gru.out_proj is None and lstm.out_proj is None
    assert (sg["b"] == 0).all() and sg["B"].abs().max() <= math.sqrt(3 / 16)  # statistics: test_rnn_mixers.py
    assert 0.10 < float(sg["a"].std()) < 0.16 and float(sg["a"].abs().max()) <= 0.9
    with torch.no_grad():
        lstm.cells[1].p[0, 0] = 5.0
        lstm.cells[1].a[2, 3] = -7.0
    lstm(torch.randn(1, 3, 64))
    assert float(lstm.cells[1].p[0, 0]) == pytest.approx(0.9) and float(lstm.cells[1].a[2, 3]) == pytest.approx(-0.9)
    free = build_mixer("flashlstm", d_model=64, clip_norm=None)
    with torch.no_grad():
        free.cells[0].a[0, 0] = 5.0
    free(torch.randn(1, 3, 64))
    assert float(free.cells[0].a[0, 0]) == 5.0
    wide = build_mixer("flashgru", d_model=8, num_heads=2, d_state=12)
    assert wide(torch.randn(2, 5, 8)).shape == (2, 5, 8) and wide.out_proj.in_features == 12


def test_registry_spec_and_causality():
    torch.manual_seed(0)
    m = build_mixer("mixers.cells.flash:FlashLSTMCell", d_model=8, num_heads=2)
    assert isinstance(m, CellMixer)
    x = torch.randn(2, 20, 8)
    y = m(x)
    x2 = x.clone()
    x2[:, 12:] += 1.0
    y2 = m(x2)
    torch.testing.assert_close(y2[:, :12], y[:, :12], rtol=0, atol=1e-6)
    assert (y2[:, 12:] - y[:, 12:]).abs().max() > 1e-3


def test_newton_residuals_converge_at_init():
    """Paper 000 Fig. 4 at init: below 1e-5 within 3 (GRU) / 4 (LSTM) iterations."""
    torch.manual_seed(0)
    x = torch.randn(8, 256, 64, dtype=torch.float64)
    for name, k in (("flashgru", 3), ("flashlstm", 4)):
        res = newton_residuals(build_mixer(name, d_model=64).double(), x, iters=5)
        assert len(res) == 6 and res[k] < 1e-5 and res[-1] < 1e-12
    cell = FlashGRUCell(16, 16).double()
    res = newton_residuals(cell, torch.randn(8, 256, 16, dtype=torch.float64), iters=4)
    assert len(res) == 5 and res[3] < 1e-5


@pytest.mark.slow
def test_learns_short_parity():
    """FlashGRU and FlashLSTM (mixer only, no clipping) between an embedding and a linear head learn
    parity of 10 bits (trained on the running parity, scored on the final one) in a few hundred steps."""
    for name in ("flashgru", "flashlstm"):
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(1)
        model = nn.Sequential(
            nn.Embedding(2, 32), build_mixer(name, d_model=32, num_heads=2, clip_norm=None), nn.Linear(32, 2)
        )
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        acc = 0.0
        for step in range(600):
            x = torch.randint(0, 2, (32, 10), generator=gen)
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), (x.cumsum(1) % 2).flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 25 == 24:
                with torch.no_grad():
                    xt = torch.randint(0, 2, (512, 10), generator=gen)
                    acc = float((model(xt)[:, -1].argmax(-1) == xt.sum(1) % 2).float().mean())
                if acc > 0.99:
                    break
        assert acc > 0.99, (name, step, acc)
