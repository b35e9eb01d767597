"""``python -m benchmarks.mixer_steps --mixers a,b [--backends fast,reference]``: each mixer's forward +
backward at the state-tracking shape, eager and as a CUDA-graph replay, per backend.

Per mixer and backend (d = 64, 4 heads, input ``(--batch, --length, 64)``, default 256 x 40: the
state-tracking preset's training batch): three eager forward+backward passes on a side stream
(compilation, autotuning), the capture of one in a CUDA graph, a replay on fresh inputs compared with an
eager call on the same inputs (relative norm error of the output and the input gradient), then the
median time of eager passes and of replays (``benchmarks.ops.common.time_ms``: ``do_bench``). A capture
that fails is reported with its error. Prints each row as JSON when measured, then a Markdown table
(pandas); ``--json PATH`` writes ``{env, rows}`` (device, date, versions, commit: ``environment``), by
default ``benchmarks/ops/results/mixer_steps.json``. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd
import torch

from benchmarks.ops.common import RESULTS, environment, rel_error, time_ms, warm_up_for_capture


def measure(name: str, backend: str | None, batch: int, length: int) -> dict:
    from mixers import build_mixer

    row: dict = {"mixer": name, "backend": backend or "-"}
    options = {"num_heads": 4} | ({"backend": backend} if backend else {})
    torch.manual_seed(0)
    mixer = build_mixer(name, 64, **options).cuda()
    x = torch.randn(batch, length, 64, device="cuda", requires_grad=True)

    def step() -> torch.Tensor:
        x.grad = None
        for p in mixer.parameters():
            p.grad = None
        y = mixer(x)
        y.square().mean().backward()
        return y

    warm_up_for_capture(step)
    row["eager_ms"] = round(time_ms(step), 3)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            y_static = step()
    except Exception as err:  # noqa: BLE001 - the report is the error
        row["capture"] = f"fails: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:160]}"
        return row
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    got_y, got_dx = y_static.detach().clone(), x.grad.detach().clone()
    want_y = step().detach()
    errors = rel_error(got_y, want_y), rel_error(got_dx, x.grad)
    row["capture"] = f"ok (replay vs eager: output {errors[0]:.1e}, input grad {errors[1]:.1e})"
    row["replay_ms"] = round(time_ms(graph.replay), 3)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mixer_steps", description=__doc__.split("\n\n")[0])
    p.add_argument("--mixers", required=True)
    p.add_argument("--backends", default="", help="comma-separated backends to compare (fla:<Layer> mixers: ignored)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--json", default=str(RESULTS / "mixer_steps.json"), help="where to write {env, rows}")
    args = p.parse_args(argv)
    rows = []
    for name in args.mixers.split(","):
        backends = [None] if name.startswith("fla:") or not args.backends else args.backends.split(",")
        for backend in backends:
            try:
                rows.append(measure(name, backend, args.batch, args.length))
            except Exception as err:  # noqa: BLE001
                rows.append(
                    {
                        "mixer": name,
                        "backend": backend,
                        "capture": f"error: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:160]}",
                    }
                )
            print(json.dumps(rows[-1]), flush=True)
    table = pd.DataFrame(rows)
    print(
        f"\n{torch.cuda.get_device_name()}, input ({args.batch}, {args.length}, 64), forward + backward, median ms:\n"
    )
    print(table.to_markdown(index=False))
    env = environment("cuda") | {"input": [args.batch, args.length, 64]}
    payload = {"env": env, "rows": table.to_dict(orient="records")}
    with open(args.json, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
