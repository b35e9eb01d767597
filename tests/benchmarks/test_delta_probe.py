"""``python -m benchmarks.ops delta-probe``: its kernels launched one by one compute what ``triton_chunk``'s
forward and backward compute; ``grid`` flags a configuration whose outputs differ; one-line errors."""

import os

import pytest
import torch

from benchmarks.ops import delta_probe
from benchmarks.ops.__main__ import main
from seqkernels.delta import chunk_kernels as ck
from seqkernels.delta import triton_chunk as tc

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(
    DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or the Triton interpreter"
)
SHAPE = (1, 37, 2, 32)  # a partial last chunk
TILES = tc.ChunkTiles(chunk=16, precision="ieee")


@needs_kernels
def test_the_probe_launches_what_the_forward_and_backward_launch():
    launch, buf = delta_probe.launches(SHAPE, TILES, DEVICE)
    for name in delta_probe.KERNELS:
        launch[name]()
    # the same inputs through triton_chunk's own forward and backward
    q, k, v, g, beta, do = delta_probe.inputs(SHAPE, DEVICE)
    D = SHAPE[-1]
    o, W, U, Tm, ckpt = tc._forward(q, k, v, g, beta, D**-0.5, 1, save=True, tiles=TILES)
    dq, dk, dv, dg, dbeta = tc._backward(do, q, k, v, g, beta, W, U, Tm, ckpt, D**-0.5, 1, tiles=TILES)
    pairs = {"o": o, "dq": dq, "dk": dk, "dv": dv, "dg": dg, "dbeta": dbeta}
    for name, want in pairs.items():
        got = buf[name].reshape(want.shape)
        assert torch.equal(got, want), name


class _Shifted:
    """A kernel that runs the real one, then shifts its sixth argument (an output: the chunk kernels' ``o``,
    the DPLR scan's ``U``) at ``warps`` warps (a configuration that computes something else)."""

    def __init__(self, kernel, warps=8):
        self.kernel, self.warps = kernel, warps

    def __getitem__(self, grid):
        def run(*args, **options):
            self.kernel[grid](*args, **options)
            if options.get("num_warps") == self.warps:
                args[5].add_(1.0)

        return run


@needs_kernels
def test_grid_reports_a_configuration_that_computes_something_else(monkeypatch):
    monkeypatch.setattr(ck, "chunk_out_kernel", _Shifted(ck.chunk_out_kernel))
    rows = list(delta_probe.probe_grid(SHAPE, TILES, DEVICE, "out", (4, 8), (2,)))
    assert [(w, s) for w, s, _, _ in rows] == [(4, 2), (8, 2)]
    (_, _, ms4, note4), (_, _, ms8, note8) = rows
    assert ms4 is not None and note4 == ""
    assert ms8 is None and "differs from the tiles' own launch" in note8


def test_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["delta-probe", "bogus"])
    assert e.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--shape must be BxLxHxD of positive ints, got '8x2048'"):
        main(["delta-probe", "kernels", "--shape", "8x2048"])
    with pytest.raises(SystemExit, match="grid needs --kernel"):
        main(["delta-probe", "grid", "--shape", "1x16x1x16"])
    with pytest.raises(SystemExit, match="--warps must be comma-separated ints, got '4,x'"):
        main(["delta-probe", "grid", "--kernel", "out", "--warps", "4,x"])
    with pytest.raises(SystemExit, match="unknown field 'chunks'"):
        main(["delta-probe", "kernels", "--tiles", "chunks=64"])
    with pytest.raises(SystemExit) as e:
        main(["delta-probe", "dplr", "--dtype", "fp16"])
    assert e.value.code == 2 and "invalid choice: 'fp16'" in capsys.readouterr().err


@needs_kernels
def test_dplr_scan_inputs_are_what_the_fused_kernels_hand_over():
    """The scan's inputs the probe builds, run through the scan and the fused output kernel, give the op's
    output in chunks of the fused kernels' default: they are the call's own hand-over."""
    from benchmarks.ops.delta import inputs as op_inputs
    from seqkernels import delta as kd
    from seqkernels.delta import triton_dplr as td

    shape, C = (1, 70, 2, 16), td.FUSED_DEFAULT_CHUNK
    xs, rows = delta_probe.dplr_scan_inputs(shape, DEVICE)
    NC = -(-70 // C)
    assert [x.shape for x in xs] == [(2, NC, C, 16)] * 4 + [shape, (2, NC, 16)]
    q, k, v, a, b, w = op_inputs("dplr", *shape, torch.bfloat16, DEVICE)
    assert torch.equal(xs[4], v) and torch.equal(rows[0], q) and torch.equal(rows[1], w)
    assert rows[2].shape == v.shape and rows[3] == 16**-0.5
    rebuilt = td._fused_out(q, k, v, b, w, *td._scan_fwd(*xs, heads=2), 1.0, td._chunk_meta(q, v, C, None))
    want = kd.dplr_delta_rule(
        q.double(), k.double(), v.double(), a.double(), b.double(), w.double(), backend="reference"
    )
    assert float((rebuilt.double() - want).norm() / want.norm()) < 1e-2  # bfloat16 output
    with pytest.raises(SystemExit, match="head dims up to 128"):
        delta_probe.dplr_scan_inputs((1, 8, 1, 256), DEVICE)


@needs_kernels
def test_dplr_probe_times_each_tiles_and_flags_one_that_computes_something_else(monkeypatch):
    from seqkernels.delta import triton_dplr as td

    monkeypatch.setattr(td, "dplr_scan_fwd_kernel", _Shifted(td.dplr_scan_fwd_kernel, warps=2))
    rows = list(delta_probe.probe_dplr((1, 40, 1, 16), DEVICE, (16, 32), (4, 2), (1, 2)))
    # block_v 32 is wider than the 16 values
    assert [(bv, w, st) for bv, w, st, *_ in rows] == [(16, 4, 1), (16, 4, 2), (16, 2, 1), (16, 2, 2)]
    for _, w, _, fwd, bwd, note in rows:
        if w == 4:
            assert fwd > 0 and bwd > 0 and note == ""
        else:
            assert fwd is None and "differs from the default tiles" in note


@needs_kernels
def test_dplr_probe_times_each_chunk_and_precision_against_the_defaults():
    """The defaults first (error 0), then each chunk x precision with its error against them: within the
    bfloat16 outputs' and gradients' rounding, for the fused chunks and for chunks of 5 (PyTorch's form); a
    precision that cannot run is a row."""
    rows = list(delta_probe.time_dplr_calls((1, 40, 1, 16), DEVICE, (16, 5), ("tf32x3", "fp8")))
    assert [(C, p) for C, p, *_ in rows] == [(None, None), (16, "tf32x3"), (16, "fp8"), (5, "tf32x3"), (5, "fp8")]
    for C, p, fwd, both, err in rows:
        if p == "fp8":
            assert fwd is None and "precision must be one of" in err
        else:
            assert fwd > 0 and both > 0 and err < (1e-2 if C is not None else 1e-12)


@needs_kernels
def test_dplr_kernel_probe_times_each_kernel_and_flags_warps_that_compute_something_else(monkeypatch):
    """Every fused per-chunk kernel at every ``chunk_warps`` x ``chunk_block_v`` (a block wider than the values
    skipped) and precision is a row; a launch whose outputs differ from the defaults' (the prep kernel's
    ``U_v`` shifted at 8 warps) is flagged, not timed; two 16-column blocks give the defaults' outputs, also
    on float32 inputs."""
    from seqkernels.delta import triton_dplr as td

    monkeypatch.setattr(td, "dplr_prep_kernel", _Shifted(td.dplr_prep_kernel, warps=8))
    rows = list(delta_probe.probe_dplr_kernels((1, 40, 1, 32), DEVICE, (2, 8), ("bf16",), (None, 16, 64)))
    rows += delta_probe.probe_dplr_kernels((1, 40, 2, 32), DEVICE, (2,), ("ieee",), (16,), torch.float32)
    assert [(name, p, n, bv) for name, p, n, bv, *_ in rows] == [
        (name, "bf16", n, bv) for name in delta_probe.DPLR_KERNELS for n in (2, 8) for bv in (None, 16)
    ] + [(name, "ieee", 2, 16) for name in delta_probe.DPLR_KERNELS]  # float32 inputs, two heads
    for name, _, n, bv, ms, note in rows:
        if (name, n) == ("prep", 8):
            assert ms is None and "differs from the defaults" in note
        else:
            assert ms > 0 and note == "", (name, n, bv, note)
