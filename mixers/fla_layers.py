"""``fla:<Layer>``: any layer of flash-linear-attention (``fla.layers``) as a mixer.

``build_mixer("fla:GatedDeltaNet", 64, num_heads=4, allow_neg_eigval=True)`` builds
``fla.layers.GatedDeltaNet(hidden_size=64, num_heads=4, head_dim=16, allow_neg_eigval=True)``
(``num_heads`` where the layer takes it, and ``head_dim = d_model // num_heads`` where it takes that and
the options do not set it, so "4 heads" means 4 heads of the model's width; ``layer_idx=0`` where the
layer takes it: each fla layer is built as a first layer, so RWKV-7's value residual ``v_first`` stays
inside the layer, and ``num_hidden_layers=2`` where it takes that (RWKV-7's initialization divides by
``num_hidden_layers - 1``: the first of two layers); every other option goes to the layer's constructor
as it is) and wraps it:

- the layer's output tuple ``(o, attentions, cache)`` is unwrapped to ``o`` ``(B, L, d)``;
- with ``bf16=True`` (the default) the layer runs under ``torch.autocast(bfloat16)`` on CUDA, since
  fla's chunked kernels refuse float32; its output is cast back to the input's dtype, so a float32 trial
  keeps float32 parameters, optimizer and loss (``bf16=False`` runs the layer as it is);
- fla's kernels are Triton kernels for a GPU: the module declares ``requires_cuda`` (the sweep's
  up-front check refuses it on a machine without one) and ``graph_capturable = False`` (the layer's
  kernels autotune and allocate on the host at run time: a trial with it runs eager steps and its
  results row says so);
- fla's gated layers (``GatedDeltaNet``, ``GatedDeltaProduct``, ...) train on Hopper GPUs with a Triton
  whose gated chunk backward fla refuses: building a layer registers
  ``seqkernels.delta.fla_gated_bwd``'s ``chunk_bwd_dqkwg`` (our Triton kernel) with fla's backend registry.

fla is an optional extra: ``pip install 'expressivity-suite[fla]'`` (a CUDA machine).
"""

from __future__ import annotations

import inspect
import warnings

import torch
from torch import nn

from seqkernels.delta import fla_gated_bwd

PREFIX = "fla:"
INSTALL_HINT = "pip install 'expressivity-suite[fla]' (flash-linear-attention, for a CUDA GPU)"


class FLALayer(nn.Module):
    """A wrapped ``fla.layers`` layer: ``(B, L, d) -> (B, L, d)`` (see the module docstring)."""

    requires_cuda = True
    graph_capturable = False

    def __init__(self, name: str, layer: nn.Module, bf16: bool = True) -> None:
        super().__init__()
        self.name, self.layer, self.bf16 = name, layer, bf16
        self.graph_note = f"{name} runs fla's Triton kernels (autotuned at run time), not capturable in a CUDA graph"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16 and x.is_cuda):
            out = self.layer(x)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.to(x.dtype)


def fla_layer_class(name: str) -> type:
    """The class ``fla.layers.<name>`` of ``fla:<name>``; one-line ``ValueError`` when fla is missing or
    has no such layer."""
    layer = name[len(PREFIX) :]
    try:
        with warnings.catch_warnings():  # on a CPU fla warns that it "rolls back to CPU"; the sweep says more
            warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
            import fla.layers
    except ImportError as err:
        raise ValueError(f"mixer {name!r} needs flash-linear-attention: {INSTALL_HINT} ({err})") from None
    fla_gated_bwd.register()  # once per process: fla's gated backward where fla refuses its own
    cls = getattr(fla.layers, layer, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        known = ", ".join(sorted(getattr(fla.layers, "__all__", [])))
        raise ValueError(f"mixer {name!r}: fla.layers has no layer {layer!r}; its layers: {known}")
    return cls


def fla_factory(name: str):
    """The mixer factory of ``fla:<Layer>``: ``factory(d_model, num_heads=4, bf16=True, **layer_options)``."""
    if not name.startswith(PREFIX) or len(name) == len(PREFIX):
        raise ValueError(f"mixer {name!r}: expected 'fla:<Layer>', a class of fla.layers (e.g. fla:GatedDeltaNet)")

    def factory(d_model: int, num_heads: int = 4, bf16: bool = True, **options) -> FLALayer:
        cls = fla_layer_class(name)
        params = inspect.signature(cls.__init__).parameters
        kwargs = {
            "hidden_size": d_model,
            **({"num_heads": num_heads} if "num_heads" in params else {}),
            **({"head_dim": d_model // num_heads} if "head_dim" in params and "num_heads" in params else {}),
            **({"layer_idx": 0} if "layer_idx" in params else {}),
            **({"num_hidden_layers": 2} if "num_hidden_layers" in params else {}),
            **options,
        }
        try:
            layer = cls(**kwargs)
        except AssertionError as err:  # fla checks its options with asserts
            raise ValueError(f"mixer {name!r} with options {options}: {err or 'rejected by the layer'}") from None
        return FLALayer(name, layer, bf16=bool(bf16))

    return factory
