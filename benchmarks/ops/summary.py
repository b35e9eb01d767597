"""``python -m benchmarks.ops summary [RESULTS_DIR]``: one table of every family's headline rows.

Per family, problem, dtype and direction: our fastest Triton row (``ours-triton...``, kernel-only
rows aside) against the fastest peer library measured in the same run, and their ratio; for the scan
also the forward's share of the ``torch.add`` bandwidth. Where every row of a problem was also timed
replayed from a CUDA graph (``--graph``: the training engine's view), the replay times are compared
(``timed``: ``replay``), else the eager calls' (``eager``). Reads ``<family>.json`` in ``RESULTS_DIR``
(default ``benchmarks/ops/results``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

import pandas as pd

from benchmarks.ops.common import RESULTS, dims_label

FAMILIES = ("scan", "newton", "fused_rnn", "mlstm", "ssd", "delta")
NOT_PEERS = ("ours", "torch.add", "inter-", "cudnn")


def _ms(r: dict, replay: bool = False) -> float:
    ms = (r.get("extra") or {}).get("graph_ms") if replay else r.get("ms")
    return math.nan if ms is None else float(ms)


def headline(rows: list[dict]) -> list[tuple]:
    """``(problem, dtype, direction, timed, ours impl, ours ms, peer impl, peer ms, note)`` per main-section
    problem (``timed``: ``replay`` or ``eager``)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("section", "main") != "main" or not math.isfinite(_ms(r)):
            continue
        dims = {
            k: v
            for k, v in r.items()
            if k
            not in ("family", "section", "impl", "direction", "dtype", "ms", "limit_ms", "max_rel_err", "note", "extra")
        }
        groups.setdefault((dims_label(dims), r["dtype"], r["direction"]), []).append(r)
    out = []
    for (label, dtype, direction), rs in groups.items():
        ours = [
            r
            for r in rs
            if r["impl"].startswith("ours-triton") and "(kernel)" not in r["impl"] and "[" not in r["impl"]
        ]
        peers = [r for r in rs if not r["impl"].startswith(NOT_PEERS)]
        if not ours:
            continue
        replay = all(math.isfinite(_ms(r, True)) for r in ours + peers)
        ms = functools.partial(_ms, replay=replay)
        o = min(ours, key=ms)
        p = min(peers, key=ms) if peers else None
        note = ""
        add = [r for r in rs if r["impl"].startswith("torch.add")]
        if add and direction == "fwd":
            note = f"{_ms(add[0]) / _ms(o):.0%} of torch.add bandwidth"
        timed = "replay" if replay else "eager"
        out.append(
            (label, dtype, direction, timed, o["impl"], ms(o), p["impl"] if p else "-", ms(p) if p else math.nan, note)
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops summary", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default=str(RESULTS))
    args = p.parse_args(argv)
    rows, devices = [], set()
    for family in FAMILIES:
        path = Path(args.results, f"{family}.json")
        if not path.is_file():
            rows.append({"family": family, "problem": "(no results)"})
            continue
        data = json.loads(path.read_text())
        devices.add(f"{data['env'].get('device')} {data['env'].get('date', '')[:16]}")
        for label, dtype, direction, timed, oi, oms, pi, pms, note in headline(data["rows"]):
            rows.append(
                {
                    "family": family,
                    "problem": label,
                    "dtype": dtype,
                    "dir": direction,
                    "timed": timed,
                    "ours": oi,
                    "ms": oms,
                    "peer": pi,
                    "peer ms": pms,
                    "ours/peer": f"{oms / pms:.2f}x" if math.isfinite(pms) else "-",
                    "note": note,
                }
            )
    print(pd.DataFrame(rows).fillna("").to_markdown(index=False, floatfmt=".4g"))
    print("devices, dates:", "; ".join(sorted(devices)))


if __name__ == "__main__":
    main()
