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
