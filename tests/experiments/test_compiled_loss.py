"""``experiments.engines.cuda_graph.compiled_loss`` compiles every model a process trains, not only its first
eight: Dynamo keys its cache on the function's code, and past its recompile limit it runs eagerly."""

import torch
from torch import nn

from experiments.engines import cuda_graph


def test_every_model_of_a_process_is_compiled(monkeypatch):
    traced = []

    def counting_backend(gm, example_inputs):
        traced.append(gm)
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(cuda_graph.torch, "compile", lambda fn, **kw: real_compile(fn, backend=counting_backend))
    loss = nn.functional.mse_loss
    limit = 2
    with torch._dynamo.config.patch(recompile_limit=limit):
        for depth in range(1, limit + 3):  # structurally different models, as one worker's trials are
            model = nn.Sequential(*[nn.Linear(3, 3) for _ in range(depth)])
            tokens, targets = torch.randn(4, 3), torch.randn(4, 3)
            before = len(traced)
            got = cuda_graph.compiled_loss(model, loss)(tokens, targets)
            assert len(traced) > before, f"model {depth} ran eagerly: Dynamo did not compile it"
            torch.testing.assert_close(got, loss(model(tokens), targets))
    torch._dynamo.reset()


def test_static_shapes_compile_a_graph_per_batch_width(monkeypatch):
    """Length-bucketed batches come in a few widths: with ``static_shapes`` each width gets a graph
    specialized to it (no dynamic sizes) and none runs eagerly, even past Dynamo's recompile limit."""
    traced = []

    def counting_backend(gm, example_inputs):
        traced.append(gm)
        return gm.forward

    real_compile = torch.compile
    compile_dynamic = []

    def compile_counting(fn, dynamic=None, **kw):
        compile_dynamic.append(dynamic)
        return real_compile(fn, backend=counting_backend, dynamic=dynamic)

    monkeypatch.setattr(cuda_graph.torch, "compile", compile_counting)
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 3))
    loss = lambda logits, y: nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())  # noqa: E731
    widths = [16, 32, 40, 48, 64]
    with torch._dynamo.config.patch(recompile_limit=2):
        fn = cuda_graph.compiled_loss(model, loss, static_shapes=True)
        for width in widths:
            tokens, targets = torch.randint(0, 8, (4, width)), torch.randint(0, 3, (4, width))
            torch.testing.assert_close(fn(tokens, targets), loss(model(tokens), targets))
        fn(torch.randint(0, 8, (4, 32)), torch.randint(0, 3, (4, 32)))  # a width seen before: no new graph
    assert compile_dynamic == [False] and len(traced) == len(widths)
    for gm in traced:  # every size in the graphs is a plain int: specialized, not symbolic
        shapes = [n.meta["example_value"].shape for n in gm.graph.nodes if "example_value" in n.meta]
        assert all(isinstance(d, int) for shape in shapes for d in shape)
    torch._dynamo.reset()
