"""``python -m benchmarks.fla_layers``: which layers of flash-linear-attention train as ``fla:<Layer>`` mixers
at d = 64 with 4 heads, and why the others do not.

For every class of ``fla.layers`` (or ``--layers A,B``), in its own process (``--procs`` at once on one GPU):
build ``SequenceModel`` with the mixer ``fla:<Layer>`` (``mixers.fla_layers``: ``hidden_size`` 64,
``num_heads`` 4, ``head_dim`` 16 where the layer takes them, bf16 autocast inside) on running parity
(lengths 40), then train ``--steps`` AdamW steps at batch 64 and lr 3e-3. A layer *trains* when every
step runs, the loss stays finite and its last 20 steps' mean is below the first 20 steps' mean; otherwise
the table gives the first line of the error (building, forward, backward) or the loss numbers.

Writes ``--out`` (Markdown, with device, versions and date) and prints it. Needs a CUDA GPU and fla.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import subprocess
import sys
import time

import pandas as pd


def try_layer(name: str, steps: int) -> dict:
    """Train ``fla:<name>`` for ``steps`` steps (in this process); a row of the table."""
    import torch
    import torch.nn.functional as F

    from experiments.trial.model import ModelConfig, SequenceModel, count_parameters
    from tasks import get_task

    row: dict = {
        "layer": name,
        "trains": False,
        "params": None,
        "loss_first": None,
        "loss_last": None,
        "steps_per_s": None,
        "error": "",
    }
    stage = "build"
    try:
        torch.manual_seed(0)
        task = get_task("parity", seq_len=40, running=True)
        model = SequenceModel(ModelConfig(task.vocab_size, task.num_classes, mixer=f"fla:{name}")).cuda()
        row["params"] = count_parameters(model)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        data = task.generate(64 * steps, seed=0)
        losses = []
        stage = "train"
        t0 = None
        for step in range(steps):
            if step == 5:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            x = data.inputs[step * 64 : (step + 1) * 64].cuda()
            y = data.targets[step * 64 : (step + 1) * 64].cuda()
            loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten(), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        torch.cuda.synchronize()
        row["steps_per_s"] = round((steps - 5) / (time.perf_counter() - t0), 1)
        first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
        row["loss_first"], row["loss_last"] = round(first, 4), round(last, 4)
        finite = all(v == v and abs(v) != float("inf") for v in losses)
        row["trains"] = finite and last < first
        if not finite:
            row["error"] = "the loss became NaN or inf"
        elif last >= first:
            row["error"] = "the loss did not decrease"
    except BaseException as err:  # noqa: BLE001 - the table records why a layer does not train
        text = str(err).strip().splitlines()
        row["error"] = f"{stage}: {type(err).__name__}: {text[0] if text else ''}"[:300]
    return row


def _child(name: str, steps: int, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.fla_layers", "--child", name, "--steps", str(steps)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"layer": name, "trains": False, "error": f"timeout after {timeout:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"layer": name, "trains": False, "error": f"process exited {out.returncode}: {tail}"[:300]}
    return json.loads(lines[-1])


def _autotune_note() -> str:
    """``"; Triton autotuners on their first configuration"`` under ``benchmarks/first_config`` (which marks
    ``Autotuner.first_config_only``), else ``""``."""
    from triton.runtime import autotuner

    first = getattr(autotuner.Autotuner, "first_config_only", False)
    return "; Triton autotuners on their first configuration (benchmarks/first_config)" if first else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fla_layers", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", help="comma-separated fla.layers classes (default: all of fla.layers.__all__)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per layer")
    p.add_argument("--out", default="fla-layers.md")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(try_layer(args.child, args.steps)))
        return 0
    import fla
    import fla.layers
    import torch
    import triton

    names = args.layers.split(",") if args.layers else [n for n in fla.layers.__all__ if n[0].isupper()]

    def one(name: str) -> dict:
        row = _child(name, args.steps, args.timeout)
        print(json.dumps(row), flush=True)  # as they finish: a run cut short keeps what it measured
        return row

    with concurrent.futures.ThreadPoolExecutor(args.procs) as pool:
        rows = list(pool.map(one, names))
    df = pd.DataFrame(rows).sort_values(["trains", "layer"], ascending=[False, True])
    header = (
        f"# fla layers as mixers at d = 64, 4 heads\n\nGenerated by `python -m benchmarks.fla_layers` on "
        f"{torch.cuda.get_device_name()}, {datetime.date.today()}; fla {getattr(fla, '__version__', '?')}, "
        f"torch {torch.__version__}, triton {triton.__version__}. Running parity (length 40), batch 64, "
        f"AdamW lr 3e-3, {args.steps} steps, bf16 autocast inside the layer. `trains`: every step ran and the "
        f"mean loss of the last 20 steps is below that of the first 20 (a smoke check, not an accuracy). "
        f"{args.procs} layers at a time on one GPU{_autotune_note()}: `steps_per_s` is not a timing.\n\n"
        f"{int(df['trains'].sum())} of {len(df)} layers train.\n\n"
    )
    text = header + df.to_markdown(index=False) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
