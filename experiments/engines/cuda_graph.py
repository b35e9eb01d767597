"""``CUDAGraphPrecision``: Lightning runs each optimizer step as the replay of one CUDA graph.

A training step of these models is ~90 small kernels: launched one by one from Python it costs 3-4 ms
of host time for 0.3-0.4 ms of GPU work. Captured once in a CUDA graph (forward, loss, backward, the
learning-rate schedule and the fused AdamW update), it replays with one launch.

Lightning's precision plugin is where it decides how an optimizer step runs
(``Precision.optimizer_step(optimizer, model, closure)``); this one runs the first ``warmup`` steps
eagerly on a side stream (Triton compilation, the optimizer's state), captures the next step's
closure and ``optimizer.step()`` in a graph and replays it from then on. The closure must read its
batch from tensors that stay in place (``experiments.trial.captured`` copies each batch into static buffers)
and must not read anything on the host. Steps with another ``key`` (a batch width under length
bucketing: ``experiments.trial.captured``) warm up and capture a graph of their own, each in its own
memory pool; every graph updates the same parameters and optimizer state. Private pools, not one shared:
a tensor that outlives its capture (the scan kernels' look-back workspace, reallocated larger by a wider
capture) must not sit where another graph's replay writes its intermediates; so memory grows with the
number of widths (each graph holds one step's activations at its width). A step called with
``graph=False`` (a batch of another size) runs eagerly. ``reset()`` drops the graphs (captured again at
the next steps), e.g. after a mixer changed how it solves; ``stop_graphs()`` runs every later step eagerly.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable
from typing import Any

import torch
from lightning.pytorch.plugins.precision import Precision


def set_graph_policy(model: torch.nn.Module, on: bool) -> None:
    """Switch the in-graph Newton policy of every ``CellMixer`` in ``model`` (``CellMixer.graph_policy``)."""
    for m in model.modules():
        if hasattr(m, "graph_policy"):
            m.graph_policy = on


#: with ``compiled_loss(static_shapes=True)``, Dynamo's recompile limit is at least this: batches of up to
#: 32 shapes (widths of 16 up to 512, and each epoch's smaller last batch) compile a graph each
STATIC_SHAPES_RECOMPILE_LIMIT = 64


def compiled_loss(
    model: torch.nn.Module, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], static_shapes: bool = False
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(tokens, targets) -> loss(model(tokens), targets)`` ``torch.compile``d as one graph, so Inductor
    fuses the loss with the model's last ops (a function: nothing enters the checkpoint). The Newton
    mixers run their in-graph policy from the warm-up on (``set_graph_policy``), so the capture compiles
    nothing new. Inductor's combo kernels (``combo_kernels``) launch independent kernels of the step as one.

    Drops Dynamo's compiled code of earlier calls first (``torch._dynamo.reset``): Dynamo keys its cache
    on this function's code, shared by every model, and after ``recompile_limit`` (8) structurally
    different models in one process (a worker training trial after trial) it would run the next ones
    eagerly without a word. A loss compiled by an earlier call still works; it compiles again when next
    called.

    ``static_shapes``: every batch shape gets a graph of its own, specialized to it (``dynamic=False``), as
    length-bucketed batches of a few widths need (each width's steps are captured in a CUDA graph of their
    own); Dynamo's recompile limit is raised to ``STATIC_SHAPES_RECOMPILE_LIMIT`` so that none of them
    runs eagerly. Otherwise Dynamo's default: a second shape compiles one graph with dynamic sizes."""
    torch._dynamo.reset()
    set_graph_policy(model, True)
    if static_shapes:
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, STATIC_SHAPES_RECOMPILE_LIMIT)
    fn = lambda tokens, targets: loss(model(tokens), targets)  # noqa: E731
    return torch.compile(fn, dynamic=False if static_shapes else None, options={"combo_kernels": True})


class CUDAGraphPrecision(Precision):
    """Training whose optimizer steps replay a captured CUDA graph (see the module docstring): float32,
    or with ``autocast`` Lightning's ``bf16-mixed`` (the forward under ``torch.autocast(bfloat16)``;
    weights, optimizer and loss in float32)."""

    def __init__(self, warmup: int = 3, autocast: bool = False) -> None:
        super().__init__()
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (the optimizer state must exist before capture), got {warmup}")
        self.warmup, self.autocast = warmup, autocast
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}  #: the captured step of each key
        self.eager_steps = 0  #: steps run eagerly (warm-up, other batch shapes, after a reset)
        self.replays = 0
        self.stopped = False  #: ``stop_graphs()`` was called: every step runs eagerly
        self._warm: dict[Hashable, int] = {}

    def forward_context(self):
        """Lightning runs training, validation and test steps in this context: bfloat16 autocast with ``autocast``."""
        if self.autocast:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return super().forward_context()

    def reset(self) -> None:
        """Drop the captured graphs; the next steps warm up and capture again."""
        self.graphs, self._warm = {}, {}

    def stop_graphs(self) -> None:
        """Drop the graph and run every later step eagerly (``experiments.trial.captured``: when captured steps keep
        skipping their updates because a Newton solve fails its check)."""
        self.reset()
        self.stopped = True

    def teardown(self) -> None:
        """Release the graphs when training ends (Lightning calls this, also after an interruption): a graph
        freed later, while another one is being captured, would break that capture."""
        self.reset()
        super().teardown()

    def optimizer_step(
        self, optimizer, model, closure: Callable[[], Any], graph: bool = True, key: Hashable = None, **kwargs: Any
    ) -> Any:
        """One optimizer step: the replay of ``key``'s graph, else (``warmup`` times per key) an eager step on a
        side stream, then the capture; eager with ``graph=False`` or after ``stop_graphs()``."""
        if not graph or self.stopped:
            self.eager_steps += 1
            closure()
            return optimizer.step(**kwargs)
        if key in self.graphs:
            self.graphs[key].replay()
            self.replays += 1
            return None
        if self._warm.get(key, 0) < self.warmup:  # eager, on a side stream as graph capture wants it
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                closure()
                optimizer.step(**kwargs)
            torch.cuda.current_stream().wait_stream(side)
            self._warm[key] = self._warm.get(key, 0) + 1
            self.eager_steps += 1
            return None
        gc.collect()  # graphs of finished trials must not be freed in the middle of this capture
        graph_ = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph_):
            closure()
            optimizer.step(**kwargs)
        self.graphs[key] = graph_
        graph_.replay()  # capturing records the step without running it
        self.replays += 1
        return None
