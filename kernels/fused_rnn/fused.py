"""The fused backend: persistent Triton kernels (``fused_kernels.py``) as ``torch.library`` custom ops.

``fused_rnn_fused(cell, wx, R, b, states0=None)`` has the signature and result of
``fused_rnn_reference``. Ops (namespace ``expressivity``):

    fused_rnn_fwd(cell, wx, R, b, states0, save) -> (h, last_states, saved)
    fused_rnn_bwd(cell, dh, dlast, R, saved)     -> (dwx, dR, db, dstates0)

``saved`` (B, T + 1, NH, N_saved, DH), float32 (float64 for float64 inputs): the per-step states and
gate activations the backward reads (``cells_triton.py``); empty when ``save`` is False (no grad).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from kernels.fused_rnn.cells_triton import CELL_IDS, NUM_SAVED
from kernels.fused_rnn.checks import check_fast_inputs, full_precision_h, head_dim_padded, new_output
from kernels.fused_rnn.fused_kernels import fused_bwd_kernel, fused_fwd_kernel
from kernels.fused_rnn.reference import cell_spec, fused_rnn_reference

#: most bytes of R (all gates of one head, padded) the fused kernel keeps on chip; larger heads go
#: to the alternating backend. 128 KiB: DH=64 in any dtype, DH=128 for bfloat16 LSTM/GRU/sLSTM.
ON_CHIP_R_BYTES = 128 * 1024
#: dR accumulates in registers (ACC_DR) when its float32 tiles take at most this many bytes;
#: otherwise one matmul over all time steps computes it after the kernel.
ON_CHIP_DR_BYTES = 64 * 1024


@dataclasses.dataclass
class LaunchConfig:
    """Launch parameters of the fused kernels (see ``launch_config``)."""

    block_b: int
    num_warps: int
    acc_dr: bool
    precision: str  # tl.dot input precision for float32: "ieee" | "tf32x3" | "tf32"
    split_h: bool = False  # forward: h enters R^T h as bf16 hi + lo (two dots), ~16-bit mantissa
    acc_db: bool = False  # backward: db summed in registers (else one reduction of dg after the kernel)
    fma: bool = False  # bfloat16: float32 dots on the FMA units (h unrounded, dg and R bf16), any batch block


#: field -> value; overrides ``launch_config``'s choices (for tuning and benchmarks)
OVERRIDES: dict[str, object] = {}


def r_bytes(cell: str, dh: int, dtype: torch.dtype) -> int:
    """Bytes of one head's padded recurrent matrix (all gates) on chip."""
    elem = torch.finfo(dtype).bits // 8
    return cell_spec(cell).recurrent_gates * head_dim_padded(dh) ** 2 * elem


def fits_on_chip(cell: str, dh: int, dtype: torch.dtype) -> bool:
    """Whether the fused kernel can hold the head's R on chip (else: the alternating backend)."""
    return r_bytes(cell, dh, dtype) <= ON_CHIP_R_BYTES


def launch_config(cell: str, batch: int, num_heads: int, dh: int, dtype: torch.dtype) -> LaunchConfig:
    """Batch block, warps, dR-on-chip and float32 matmul precision for one call.

    float32 runs its dots on the FMA units ("ieee": tf32 tensor cores would miss the 1e-4 target),
    whose work per step is proportional to the batch block: small blocks (from 4 rows) spread a
    head over several SMs, and dR is one matmul after the kernel. bfloat16 runs on the tensor cores
    (rows padded to 16, so blocks start at 16) and accumulates dR on chip when it fits.

    ``split_h`` (``checks.full_precision_h``: the bfloat16 sLSTM): the forward's recurrent dot takes
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
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    while block_b < 64 and num_heads * triton.cdiv(batch, block_b) > sms:
        block_b *= 2
    cfg = LaunchConfig(
        block_b=block_b,
        num_warps=4 if dhp * gr * block_b <= 128 * 16 else 8,
        acc_dr=tensor_cores and gr * dhp * dhp * 4 <= ON_CHIP_DR_BYTES,
        precision="ieee",
        split_h=full_precision_h(cell, dtype),
        acc_db=not tensor_cores,
    )
    cfg = dataclasses.replace(cfg, **OVERRIDES)
    if cfg.block_b < 16:  # dR on chip is a dot over the batch block: K >= 16
        cfg.acc_dr = False
    return cfg


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _upcast(x: torch.Tensor, cfg: LaunchConfig) -> bool:
    """bfloat16 operands (rounded to bfloat16) multiplied in float32: with ``cfg.fma``, and always
    under ``TRITON_INTERPRET=1``, whose bfloat16 ``tl.dot`` is wrong (triton 3.9)."""
    return x.dtype == torch.bfloat16 and (cfg.fma or not x.is_cuda)


def _tl_acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


@torch.library.custom_op("expressivity::fused_rnn_fwd", mutates_args=())
def fused_rnn_fwd(
    cell: str, wx: torch.Tensor, R: torch.Tensor, b: torch.Tensor, states0: torch.Tensor, save: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward of the fused kernel: ``(h (B, T, NH, DH), last_states (N_s, B, NH, DH), saved)``."""
    spec = check_fast_inputs("fused", cell, wx, R, b, states0)
    bsz, length, nh, _, dh = wx.shape
    if not fits_on_chip(cell, dh, wx.dtype):
        raise ValueError(
            f"fused_rnn[fused]: {cell} R of head dim {dh} in {wx.dtype} takes {r_bytes(cell, dh, wx.dtype)} bytes, "
            f"more than the {ON_CHIP_R_BYTES} kept on chip; use backend='alternating' (or 'triton', which picks it)"
        )
    h = new_output(bsz, length, nh, dh, device=wx.device, dtype=wx.dtype)
    last = new_output(spec.num_states, bsz, nh, dh, device=wx.device, dtype=wx.dtype)
    nsave = NUM_SAVED[cell]
    saved_shape = (bsz, length + 1, nh, nsave, dh) if save else (0,)
    saved = new_output(saved_shape, device=wx.device, dtype=_acc_dtype(wx.dtype))
    if save:
        saved[:, 0].zero_()  # row 0 holds the initial states; its gate slots are never read
    cfg = launch_config(cell, bsz, nh, dh, wx.dtype)
    grid = (nh, triton.cdiv(bsz, cfg.block_b))
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


@fused_rnn_fwd.register_fake
def _(cell, wx, R, b, states0, save):
    bsz, length, nh, _, dh = wx.shape
    saved_shape = (bsz, length + 1, nh, NUM_SAVED[cell], dh) if save else (0,)
    return (
        wx.new_empty(bsz, length, nh, dh),
        wx.new_empty(cell_spec(cell).num_states, bsz, nh, dh),
        wx.new_empty(saved_shape, dtype=_acc_dtype(wx.dtype)),
    )


@torch.library.custom_op("expressivity::fused_rnn_bwd", mutates_args=())
def fused_rnn_bwd(
    cell: str, dh_out: torch.Tensor, dlast: torch.Tensor, R: torch.Tensor, saved: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of the fused kernel: ``(dwx, dR, db, dstates0)`` from the output gradients."""
    spec = cell_spec(cell)
    bsz, length, nh, dh = dh_out.shape
    if saved.dim() != 5 or saved.shape != (bsz, length + 1, nh, NUM_SAVED[cell], dh):
        raise ValueError(
            f"fused_rnn_bwd: saved has shape {tuple(saved.shape)}; run the forward with save=True"
        )
    acc = _acc_dtype(R.dtype)
    dh_out, dlast = dh_out.contiguous(), dlast.contiguous()
    cfg = launch_config(cell, bsz, nh, dh, R.dtype)
    nbb = triton.cdiv(bsz, cfg.block_b)
    dg = new_output(bsz, length, nh, spec.bias_gates, dh, device=R.device, dtype=R.dtype)
    ds0 = new_output(spec.num_states, bsz, nh, dh, device=R.device, dtype=R.dtype)
    db_part = new_output((nbb, nh, spec.bias_gates, dh) if cfg.acc_db else (0,), device=R.device, dtype=acc)
    dr_part = new_output((nbb, *R.shape) if cfg.acc_dr else (0,), device=R.device, dtype=acc)
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


@fused_rnn_bwd.register_fake
def _(cell, dh_out, dlast, R, saved):
    spec = cell_spec(cell)
    bsz, length, nh, dh = dh_out.shape
    return (
        R.new_empty(bsz, length, nh, spec.input_gates, dh),
        torch.empty_like(R),
        R.new_empty(nh, spec.bias_gates, dh),
        R.new_empty(spec.num_states, bsz, nh, dh),
    )


def _setup_context(ctx, inputs, output):
    cell, _, R, _, _, _ = inputs
    _, _, saved = output
    ctx.cell = cell
    ctx.save_for_backward(R, saved)
    ctx.mark_non_differentiable(saved)


def _backward(ctx, dh, dlast, _dsaved):
    R, saved = ctx.saved_tensors
    if saved.dim() != 5:
        raise RuntimeError("fused_rnn: backward through a forward run with save=False (under no_grad?)")
    bsz, length1, nh, _, dhd = saved.shape
    if dh is None:
        dh = R.new_zeros(bsz, length1 - 1, nh, dhd)
    if dlast is None:
        dlast = R.new_zeros(cell_spec(ctx.cell).num_states, bsz, nh, dhd)
    dwx, dR, db, ds0 = fused_rnn_bwd(ctx.cell, dh, dlast, R, saved)
    return None, dwx, dR, db, ds0, None


fused_rnn_fwd.register_autograd(_backward, setup_context=_setup_context)


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def fused_rnn_fused(
    cell: str,
    wx: torch.Tensor,
    R: torch.Tensor,
    b: torch.Tensor,
    states0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused persistent kernel; same signature and result as ``fused_rnn_reference``."""
    spec = check_fast_inputs("fused", cell, wx, R, b, states0)
    if wx.shape[1] == 0:  # nothing to run
        return fused_rnn_reference(cell, wx, R, b, states0)
    if states0 is None:
        states0 = wx.new_zeros(spec.num_states, wx.shape[0], wx.shape[2], wx.shape[4])
    h, last, _ = fused_rnn_fwd(cell, wx, R, b, states0, needs_grad(wx, R, b, states0))
    return h, last
