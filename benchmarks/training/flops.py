"""Model FLOPs of one training step, and the device peaks that turn FLOP/s into MFU.

``step_flops(spec, device)`` builds the trial's model and one training batch as ``run_trial`` does and
counts the FLOPs of its forward, loss and backward with ``torch.utils.flop_counter.FlopCounterMode``: the
matrix products (``mm``, ``bmm``, ``addmm``, convolutions, scaled-dot-product attention), each counted
``2 * m * n * k``. Elementwise work, reductions and the optimizer update are not counted (the usual
model-FLOPs convention), nor is the work inside a custom operator (``torch.library.custom_op``) or a Triton
kernel launched directly: ``uncounted_ops`` names the custom operators the step called, so a reader knows
which mixers' recurrences the count leaves out. The batch is the padded training batch ``(B, L_max)``.

``device_peaks(name)``: dense tensor-core bfloat16, TF32 and plain float32 peaks (FLOP/s) of a GPU named
``name`` (``torch.cuda.get_device_name``), from its data sheet; ``None`` for a device not in ``PEAKS`` (a
CPU, an unknown GPU): its MFU is not stated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

#: with length bucketing, the FLOPs per step are the mean over this many training batches
BUCKETED_BATCHES = 8

#: ``(fragment of the device name, bf16 dense, tf32 dense, fp32 non-tensor)`` in TFLOP/s, from NVIDIA's data
#: sheets (the dense figures: half the "with sparsity" ones); the first fragment the name contains wins
PEAKS: tuple[tuple[str, float, float, float], ...] = (
    ("H100 PCIe", 756.0, 378.0, 51.0),
    ("H100 NVL", 835.0, 418.0, 60.0),
    ("H100", 989.0, 494.0, 67.0),  # SXM5 (NVIDIA H100 80GB HBM3)
    ("H200", 989.0, 494.0, 67.0),  # the H100 SXM's compute with more and faster memory
    ("A100", 312.0, 156.0, 19.5),
)


@dataclasses.dataclass(frozen=True)
class Peaks:
    """A device's dense peaks in FLOP/s."""

    device: str
    bf16: float
    tf32: float
    fp32: float


def device_peaks(name: str) -> Peaks | None:
    """The peaks of the device called ``name``, or ``None`` when it is not in ``PEAKS``."""
    for fragment, bf16, tf32, fp32 in PEAKS:
        if fragment in name:
            return Peaks(name, bf16 * 1e12, tf32 * 1e12, fp32 * 1e12)
    return None


class _CustomOps(TorchDispatchMode):
    """Records the operators outside ``aten`` / ``prims`` that run under it (``names``: ``namespace::op``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace not in ("aten", "prims"):
            self.names.add(func.name().split(".")[0])
        return func(*args, **(kwargs or {}))


def count_flops(step) -> tuple[int, list[str]]:
    """``(FLOPs, custom operators)`` of calling ``step()`` once (forward and backward inside it)."""
    names = _CustomOps()
    with FlopCounterMode(display=False) as counter, names:
        step()
    return int(counter.get_total_flops()), sorted(names.names)


def step_flops(spec, device: str | torch.device = "cpu", sample: int = 4096) -> dict[str, Any]:
    """One training step of ``spec`` (a ``TrialSpec``) on ``device``: ``flops`` (forward, loss and backward of
    one padded training batch, in the trial's precision; NaN and ``flops_error`` saying why when the counter
    could not run the step), ``uncounted_ops``, ``batch`` (sequences per step), ``padded_len`` (the batches'
    width), ``real_len`` (mean non-padding tokens per training sequence, over ``sample`` training
    sequences), ``n_params``. The Newton mixers' periodic Jacobian check (every ``jacobian_check_every``
    forwards) is off: the count is of the steps between checks. With ``train.length_bucketing`` the batches
    differ in width: ``padded_len`` is their mean over an epoch of the whole training set and ``flops`` the
    mean of the first ``BUCKETED_BATCHES``."""
    from experiments.trial.model import count_parameters
    from experiments.trial.train import build_datamodule, build_module

    t = spec.train
    size = t.train_size if t.length_bucketing else min(t.train_size, max(sample, t.batch_size))
    train = dataclasses.replace(t, train_size=size, val_size=1, test_size=1)
    small = dataclasses.replace(spec, train=train, extrapolation=_one_eval_length(spec.extrapolation))
    torch.manual_seed(spec.seed)
    dm = build_datamodule(small, device)
    dm.setup("fit")
    module = build_module(small, dm).to(device)
    for m in module.modules():  # the Newton mixers' periodic Jacobian check: not a training step's work
        if hasattr(m, "jacobian_check_every"):  # (and autograd's vmap under the counter's mode fails)
            m.jacobian_check_every = 0
    stream = dm.train_dataloader()
    # bucketed batches differ in width: the FLOPs averaged over the first few, the width over a whole epoch
    batches = [stream.batch(i) for i in range(min(stream.per_epoch, BUCKETED_BATCHES if stream.length_pool else 1))]
    autocast = (
        torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
        if spec.model.precision == "bf16-mixed"
        else torch.autocast(torch.device(device).type, enabled=False)
    )

    def step(tokens: torch.Tensor, targets: torch.Tensor) -> None:
        with autocast:
            loss = module.loss(module.model(tokens), targets)
        loss.backward()

    try:
        counts = [count_flops(lambda b=b: step(*b)) for b in batches]
        flops, custom, error = sum(c[0] for c in counts) / len(counts), counts[0][1], {}
    except Exception as e:  # noqa: BLE001  (a mixer the counter cannot run: the rates are still measured)
        flops, custom, error = float("nan"), [], {"flops_error": f"{type(e).__name__}: {str(e)[:200]}"}
    lengths = dm.data["train"].lengths
    full_width = int(batches[0][0].shape[1]) if not stream.length_pool else dm.data["train"].inputs.shape[1]
    widths = stream.widths if stream.length_pool else [full_width]
    return {
        "flops": flops,
        "uncounted_ops": custom,
        **error,
        "batch": int(batches[0][0].shape[0]),
        "padded_len": sum(widths) / len(widths),
        "real_len": float(lengths.float().mean()) if lengths is not None else float(full_width),
        "n_params": count_parameters(module.model),
    }


def _one_eval_length(extrapolation: dict[str, Any] | None) -> dict[str, Any] | None:
    """The extrapolation settings with one short evaluation set (the count needs only training batches)."""
    if not extrapolation:
        return extrapolation
    return {**extrapolation, "eval_lengths": [extrapolation.get("min_len", 3)], "test_range": None}
