"""The fused backend: persistent Triton kernels (``fused_kernels.py``), forward and backward.

``fused_rnn_fused(cell, wx, R, b, states0=None, *, config=None)`` has the signature and result of
``fused_rnn_reference``; ``config``: a ``LaunchConfig`` (default ``launch_config``). Custom ops
(``triton_ops.TritonBackend``; namespace ``expressivity``):

    fused_rnn_fwd(cell, wx, R, b, states0, save) -> (h, last_states, saved)
    fused_rnn_bwd(cell, dh, dlast, R, saved)     -> (dwx, dR, db, dstates0)

``saved`` (B, T + 1, NH, N_saved, DH), float32 (float64 for float64 inputs): the per-step states and
gate activations the backward reads (``cell_kernels.py``); empty when ``save`` is False (no grad).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton.language as tl

from seqkernels._triton import cdiv, empty
from seqkernels.fused_rnn.cell_kernels import CELL_IDS, NUM_SAVED
from seqkernels.fused_rnn.fused_kernels import fused_bwd_kernel, fused_fwd_kernel
from seqkernels.fused_rnn.reference import cell_spec
from seqkernels.fused_rnn.triton_ops import (
    TritonBackend,
    acc_dtype,
    check_saved,
    full_precision_h,
    head_dim_padded,
    run_checked,
)

#: most bytes of R (all gates of one head, padded) the fused kernel keeps on chip; larger heads go
#: to the alternating backend. 128 KiB: DH=64 in any dtype, DH=128 for bfloat16 LSTM/GRU/sLSTM.
ON_CHIP_R_BYTES = 128 * 1024
#: dR accumulates in registers (ACC_DR) when its float32 tiles take at most this many bytes;
#: otherwise one matmul over all time steps computes it after the kernel.
ON_CHIP_DR_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Launch parameters of the fused kernels (defaults: ``launch_config``)."""

    block_b: int
    num_warps: int
    acc_dr: bool
    precision: str  # tl.dot input precision for float32: "ieee" | "tf32x3" | "tf32"
    split_h: bool = False  # forward: h enters R^T h as bf16 hi + lo (two dots), ~16-bit mantissa
    acc_db: bool = False  # backward: db summed in registers (else one reduction of dg after the kernel)
    fma: bool = False  # bfloat16: float32 dots on the FMA units (h unrounded, dg and R bf16), any batch block


def r_bytes(cell: str, dh: int, dtype: torch.dtype) -> int:
    """Bytes of one head's padded recurrent matrix (all gates) on chip."""
    elem = torch.finfo(dtype).bits // 8
    return cell_spec(cell).recurrent_gates * head_dim_padded(dh) ** 2 * elem


def fits_on_chip(cell: str, dh: int, dtype: torch.dtype) -> bool:
    """Whether the fused kernel can hold the head's R on chip (else: the alternating backend)."""
    return r_bytes(cell, dh, dtype) <= ON_CHIP_R_BYTES


@functools.lru_cache(maxsize=1)
def _sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


@functools.lru_cache(maxsize=1024)
def launch_config(cell: str, batch: int, num_heads: int, dh: int, dtype: torch.dtype) -> LaunchConfig:
    """Batch block, warps, dR-on-chip and float32 matmul precision for one call.

    float32 runs its dots on the FMA units ("ieee": tf32 tensor cores would miss the 1e-4 target),
    whose work per step is proportional to the batch block: small blocks (from 4 rows) spread a
    head over several SMs, and dR is one matmul after the kernel. bfloat16 runs on the tensor cores
    (rows padded to 16, so blocks start at 16) and accumulates dR on chip when it fits.

    ``split_h`` (``triton_ops.full_precision_h``: the bfloat16 sLSTM): the forward's recurrent dot takes
    h as two bfloat16 parts, ``hi = bf16(h)`` and ``lo = bf16(h - hi)``, so h keeps ~16 mantissa bits
    instead of 8. The sLSTM's stabilizer branch ``m = max(log σ(f) + m_prev, i)`` has a gradient
    that jumps at ties; with h rounded to 8 bits the gates move by ~1e-3 and flip that branch where
    float64 would not (errors up to 0.2 in dwx / dR / db at B=5, T=65, DH=128).

    ``acc_db`` (float32): the backward sums db elementwise in registers and reduces over the batch
    block once after the loop; a per-step ``tl.sum`` over the batch rows crosses warps on the FMA
    path (10 of its 12 barriers per step, sm_90 PTX, triton 3.6). On the tensor-core path the sum
    stays within warps (shuffles), and register sums would spill, so db is ``dg.sum`` after the kernel.
    """
    dhp = head_dim_padded(dh)
    gr = cell_spec(cell).recurrent_gates
    tensor_cores = dtype != torch.float32
    block_b = 16 if tensor_cores else 4
    while block_b < 64 and num_heads * cdiv(batch, block_b) > _sm_count():
        block_b *= 2
    return LaunchConfig(
        block_b=block_b,
        num_warps=4 if dhp * gr * block_b <= 128 * 16 else 8,
        acc_dr=tensor_cores and gr * dhp * dhp * 4 <= ON_CHIP_DR_BYTES,
        precision="ieee",
        split_h=full_precision_h(cell, dtype),
        acc_db=not tensor_cores,
    )


def _upcast(x: torch.Tensor, cfg: LaunchConfig) -> bool:
    """bfloat16 operands (rounded to bfloat16) multiplied in float32: with ``cfg.fma``, and always
    under ``TRITON_INTERPRET=1``, whose bfloat16 ``tl.dot`` is wrong (triton 3.9)."""
    return x.dtype == torch.bfloat16 and (cfg.fma or not x.is_cuda)


def _check_r_on_chip(cell: str, dh: int, dtype: torch.dtype, cfg: LaunchConfig) -> None:
    """Refuse a head whose R does not fit on chip in the dtype the kernel holds it in (``cfg.fma``
    upcasts a bfloat16 R to float32, doubling it)."""
    held = torch.float32 if cfg.fma and dtype == torch.bfloat16 else dtype
    if not fits_on_chip(cell, dh, held):
        raise ValueError(
            f"fused_rnn[fused]: {cell} R of head dim {dh} held in {held} takes {r_bytes(cell, dh, held)} bytes, "
            f"more than the {ON_CHIP_R_BYTES} kept on chip; use backend='alternating' (or 'triton', which picks it)"
        )


def _tl_acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _forward(cell: str, wx, R, b, states0, save: bool, cfg: LaunchConfig | None):
    """Forward of the fused kernel: ``(h (B, T, NH, DH), last_states (N_s, B, NH, DH), saved)``."""
    spec = cell_spec(cell)
    bsz, length, nh, _, dh = wx.shape
    cfg = cfg or launch_config(cell, bsz, nh, dh, wx.dtype)
    _check_r_on_chip(cell, dh, wx.dtype, cfg)
    h = empty((bsz, length, nh, dh), wx.device, wx.dtype)
    last = empty((spec.num_states, bsz, nh, dh), wx.device, wx.dtype)
    nsave = NUM_SAVED[cell]
    saved = empty((bsz, length + 1, nh, nsave, dh) if save else (0,), wx.device, acc_dtype(wx.dtype))
    if save:
        saved[:, 0].zero_()  # row 0 holds the initial states; its gate slots are never read
    grid = (nh, cdiv(bsz, cfg.block_b))
    fused_fwd_kernel[grid](
        wx, R, b, states0, h, last, saved if save else h,
        bsz, length, nh, dh,
        CELL=CELL_IDS[cell], GX=spec.input_gates, GR=spec.recurrent_gates, GB=spec.bias_gates,
        NS=spec.num_states, NSAVE=nsave, SAVE=save,
        BLOCK_B=cfg.block_b, DHP=head_dim_padded(dh), PREC=cfg.precision, ACC=_tl_acc(wx.dtype), UPCAST=_upcast(wx, cfg),
        SPLIT_H=cfg.split_h and wx.dtype == torch.bfloat16 and not cfg.fma,
        FULL_H=cfg.fma and wx.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=1,
    )  # fmt: skip
    return h, last, saved


def _backward(cell: str, dh_out, dlast, R, saved, cfg: LaunchConfig | None):
    """Backward of the fused kernel: ``(dwx, dR, db, dstates0)`` from the output gradients."""
    spec = cell_spec(cell)
    bsz, length, nh, dh = dh_out.shape
    check_saved("fused_rnn_bwd", cell, saved, dh_out.shape)
    acc = acc_dtype(R.dtype)
    dh_out, dlast = dh_out.contiguous(), dlast.contiguous()
    cfg = cfg or launch_config(cell, bsz, nh, dh, R.dtype)
    _check_r_on_chip(cell, dh, R.dtype, cfg)
    nbb = cdiv(bsz, cfg.block_b)
    dg = empty((bsz, length, nh, spec.bias_gates, dh), R.device, R.dtype)
    ds0 = empty((spec.num_states, bsz, nh, dh), R.device, R.dtype)
    db_part = empty((nbb, nh, spec.bias_gates, dh) if cfg.acc_db else (0,), R.device, acc)
    dr_part = empty((nbb, *R.shape) if cfg.acc_dr else (0,), R.device, acc)
    rt = R.permute(0, 2, 3, 1).contiguous()  # RT[h, g, j, i] = R[h, i, g, j]: see ``_load_rt``
    fused_bwd_kernel[(nh, nbb)](
        dh_out, dlast, rt, saved, dg, ds0, dr_part if cfg.acc_dr else ds0, db_part if cfg.acc_db else ds0,
        bsz, length, nh, dh,
        CELL=CELL_IDS[cell], GR=spec.recurrent_gates, GB=spec.bias_gates, NS=spec.num_states,
        NSAVE=NUM_SAVED[cell], ACC_DR=cfg.acc_dr, ACC_DB=cfg.acc_db,
        BLOCK_B=cfg.block_b, DHP=head_dim_padded(dh), PREC=cfg.precision, ACC=_tl_acc(R.dtype), UPCAST=_upcast(R, cfg),
        num_warps=cfg.num_warps, num_stages=1,
    )  # fmt: skip
    if cfg.acc_dr:
        dR = dr_part.sum(0)
    else:  # eq. 7 as one matmul over all (batch, time): dR[h,i,g,j] = sum h_prev[i] dg[g,j]
        h_prev = saved[:, :length, :, 0].to(R.dtype)
        dgr = dg[:, :, :, : spec.recurrent_gates]  # the recurrent gates lead the bias gates
        dR = torch.einsum("bthi,bthgj->higj", h_prev.to(acc), dgr.to(acc))
    db = db_part.sum(0) if cfg.acc_db else dg.sum((0, 1), dtype=acc)
    dwx = dg[:, :, :, spec.bias_gates - spec.input_gates :]
    return (
        dwx.contiguous() if spec.bias_gates != spec.input_gates else dwx,
        dR.to(R.dtype),
        db.to(R.dtype),
        ds0,
    )


_BACKEND = TritonBackend("fused_rnn", _forward, _backward)
fused_rnn_fwd, fused_rnn_bwd = _BACKEND.fwd_op, _BACKEND.bwd_op


def fused_rnn_fused(
    cell: str,
    wx: torch.Tensor,
    R: torch.Tensor,
    b: torch.Tensor,
    states0: torch.Tensor | None = None,
    *,
    config: LaunchConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused persistent kernel; same signature and result as ``fused_rnn_reference``."""
    return run_checked(_BACKEND, "fused", cell, wx, R, b, states0, config)
