"""The delta family's fused recurrent Triton kernel (``backend="triton"``: ``seqkernels/delta/recurrent_kernels.py``
and the members mapped onto it in ``triton_ops.py``) against the float64 per-token references (themselves
checked against dense transition matrices in ``test_delta.py``): the output and every input gradient of
every member, at awkward lengths and widths, with the checkpoint chunk and the block of value rows small
enough that several of each run; outputs poisoned with NaN; the custom ops under ``opcheck``. On the CPU
the kernels run in the interpreter at small shapes; on a GPU (``-m gpu``) compiled, at lengths up to
1,024 and head dims 16 to 128, in float32 and bfloat16, and captured in a CUDA graph.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from seqkernels import delta as kd
from seqkernels._triton import triton_available
from seqkernels.delta import triton_ops
from seqkernels.delta.triton_ops import RecurrentTiles, delta_recurrent_fwd
from tests.kernels.test_delta_triton_chunk import compare_with_reference

F64 = torch.float64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_available(torch.empty(0, device=DEVICE)), reason="needs CUDA or TRITON_INTERPRET=1"
)


def _members(B, L, H, K, V, n, seed):
    """name -> (tensors, fn(backend, tiles) -> f(*tensors)); random inputs like the mixers' (unit keys,
    beta in [0, 2], log decays below 0; for DPLR RWKV-7's a = -kk, b = kk * lr)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=gen, dtype=F64)  # noqa: E731
    q, k, v, beta, g = r(B, L, H, K), F.normalize(r(B, L, H, K), dim=-1), r(B, L, H, V), 2 * u(B, L, H), -u(B, L, H)
    kn, vn, bn = F.normalize(r(B, L, n, H, K), dim=-1), r(B, L, n, H, V), 2 * u(B, L, n, H)
    kk, lr, w = F.normalize(r(B, L, H, K), dim=-1), u(B, L, H, K), -math.exp(-0.5) * u(B, L, H, K)
    return {
        "delta_rule": ([q, 3 * k, v, beta], lambda be, t: lambda *x: kd.delta_rule(*x, qk_l2norm=True, **be(t))),
        "gated_delta_rule": ([q, k, v, g, beta], lambda be, t: lambda *x: kd.gated_delta_rule(*x, **be(t))),
        "delta_product": ([q, kn, vn, bn], lambda be, t: lambda *x: kd.delta_product(*x, **be(t))),
        "gated_delta_product": ([q, kn, vn, bn, g], lambda be, t: lambda *x: kd.delta_product(*x, **be(t))),
        "dplr_delta_rule": ([q, k, v, -kk, kk * lr, w], lambda be, t: lambda *x: kd.dplr_delta_rule(*x, **be(t))),
    }


def _call(member, tensors, fn, tiles):
    if tiles is None:
        return fn(lambda t: {"backend": "triton"}, None)(*tensors)
    # explicit tiles: the member's function in triton_ops.py (same signature plus tiles)
    name = "delta_product" if member == "gated_delta_product" else member
    kw = {"qk_l2norm": True} if member == "delta_rule" else {}
    return getattr(triton_ops, name)(*tensors, tiles=tiles, **kw)


def _compare(member, tensors, fn, tiles, dtype, tol, seed=0):
    """Our kernel against the reference (``compare_with_reference``)."""
    fast = lambda *xs: _call(member, xs, fn, tiles)  # noqa: E731
    return compare_with_reference(fast, fn(lambda t: {"backend": "reference"}, None), tensors, dtype, tol, seed)


MEMBERS = ["delta_rule", "gated_delta_rule", "delta_product", "gated_delta_product", "dplr_delta_rule"]


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize(
    "B,L,H,K,V,n,tiles",
    [
        (2, 1, 1, 8, 8, 2, None),
        (1, 13, 3, 20, 5, 3, RecurrentTiles(chunk=4)),  # K, V not powers of two; chunks of 4 steps
        (1, 9, 2, 16, 40, 2, RecurrentTiles(block_v=16, chunk=5, stages=3)),  # 3 blocks of value rows, pipelined
    ],
)
def test_triton_equals_reference(member, B, L, H, K, V, n, tiles):
    tensors, fn = _members(B, L, H, K, V, n, seed=L * 7 + K)[member]
    _compare(member, tensors, fn, tiles, torch.float32, 1e-5)


def test_triton_bfloat16_inputs():
    """bfloat16 storage, float32 arithmetic: about bfloat16's rounding of the inputs."""
    tensors, fn = _members(1, 11, 2, 16, 16, 2, seed=3)["gated_delta_product"]
    _compare("gated_delta_product", tensors, fn, RecurrentTiles(chunk=4), torch.bfloat16, 3e-2)


def test_custom_ops_opcheck():
    """The custom ops' registration (fake tensors, autograd) is consistent (``torch.library.opcheck``)."""
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen).to(DEVICE)  # noqa: E731
    B, L, H, K, V, n = 1, 5, 2, 8, 8, 2
    args = (r(B, L, H, K), r(B, L * n, H, K), r(B, L * n, H, V), r(B, L * n, H, K), r(B, L * n, H, K))
    for w in (None, -torch.rand(B, L * n, H, K, generator=gen).to(DEVICE)):
        inputs = [t.clone().requires_grad_() for t in args] + [None if w is None else w.requires_grad_()]
        torch.library.opcheck(delta_recurrent_fwd, (*inputs, 0.5, n), test_utils=("test_schema", "test_faketensor"))


def test_triton_named_on_cpu_without_interpreter_is_one_line(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 2, 1, 4)
    if torch.cuda.is_available():
        pytest.skip("CPU tensors on a GPU machine: covered elsewhere")
    with pytest.raises(ValueError, match="backend 'triton' needs CUDA tensors"):
        kd.delta_rule(q, q, q, q[..., 0], backend="triton")


# ---------------------------------------------------------------------------------------------- GPU


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))


@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("L", [1, 67, 130, 1024])
@pytest.mark.parametrize("D", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@gpu
def test_gpu_triton_equals_reference(member, L, D, dtype, tol):
    """Lengths 1 to 1,024 (none a multiple of the 32-step chunk but 1,024), head dims 16 to 128."""
    B, H, n = (2, 3, 2) if L <= 130 else (1, 2, 2)
    tensors, fn = _members(B, L, H, D, D, n, seed=L + D)[member]
    _compare(member, tensors, fn, None, dtype, tol)


@pytest.mark.parametrize("member", ["gated_delta_product", "dplr_delta_rule"])
@pytest.mark.parametrize(
    "tiles", [RecurrentTiles(stages=1), RecurrentTiles(stages=2), RecurrentTiles(stages=4, block_v=16, chunk=16)]
)
@gpu
def test_gpu_triton_tiles_equal_reference(member, tiles):
    """Every pipelining depth and block of value rows the benchmark may choose computes the same function."""
    tensors, fn = _members(2, 130, 3, 64, 64, 2, seed=5)[member]
    _compare(member, tensors, fn, tiles, torch.float32, 1e-4)


@pytest.mark.parametrize("member", ["delta_rule", "gated_delta_product", "dplr_delta_rule"])
@pytest.mark.parametrize("L,D", [(67, 16), (1024, 32), (130, 64), (67, 128)])
@gpu
def test_gpu_triton_pipelined_equals_reference(member, L, D):
    """Loads pipelined 4 deep (``RecurrentTiles(stages=4)``) with the default blocks, at every head dim:
    the depth the benchmark found fastest, checked where a default would use it."""
    B, H = (2, 3) if L <= 130 else (1, 2)
    tensors, fn = _members(B, L, H, D, D, 2, seed=L + D)[member]
    _compare(member, tensors, fn, RecurrentTiles(stages=4), torch.float32, 1e-4)


@gpu
def test_gpu_triton_in_a_cuda_graph(graph_grads):
    """Forward and backward captured in one CUDA graph replay what an eager call computes."""
    tensors, fn = _members(8, 40, 4, 16, 16, 2, seed=1)["gated_delta_product"]
    xs = [t.float().cuda().requires_grad_() for t in tensors]
    f = fn(lambda t: {"backend": "triton"}, None)
    do = torch.randn(8, 40, 4, 16, device="cuda")
    eager = torch.autograd.grad(f(*xs), xs, do)
    captured = graph_grads(f, xs, do)
    for a, b in zip(captured, eager):
        assert torch.allclose(a, b, rtol=0, atol=0)
