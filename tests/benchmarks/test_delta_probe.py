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
    """A kernel that runs the real one, then shifts its output at 8 warps (a configuration that computes
    something else)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def run(*args, **options):
            self.kernel[grid](*args, **options)
            if options.get("num_warps") == 8:
                args[5].add_(1.0)  # o

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
