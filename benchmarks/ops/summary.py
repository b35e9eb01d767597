"""``python -m benchmarks.ops summary [RESULTS_DIR] [--baseline DIR]``: one table of every family's headline rows.

Per family, problem, dtype and direction: our fastest Triton row (``ours-triton...``, kernel-only
rows aside) against the fastest peer library measured in the same run, and their ratio; for the scan
also the forward's share of the ``torch.add`` bandwidth. Where every row of a problem was also timed
replayed from a CUDA graph (``--graph``: the training engine's view), the replay times are compared
(``timed``: ``replay``), else the eager calls' (``eager``). Reads ``<family>.json`` in ``RESULTS_DIR``
(default ``benchmarks/ops/results``).

``--baseline DIR``: instead, every row against the row of the same implementation, problem, dtype and
direction in ``DIR``'s ``<family>.json`` (the same benchmark run on other kernels, e.g. the last commit's
by ``gpu_check.sh``'s ``BASELINE``): both times and their ratio, replays where both rows have one.
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
#: a result row's fields that are not the problem's dimensions
_NOT_DIMS = ("family", "section", "impl", "direction", "dtype", "ms", "limit_ms", "max_rel_err", "note", "extra")


def _problem(r: dict) -> str:
    """The row's problem: its dimensions as ``dims_label`` writes them."""
    return dims_label({k: v for k, v in r.items() if k not in _NOT_DIMS})


def _run(data: dict) -> str:
    """A results file's device and date (to the minute)."""
    return f"{data['env'].get('device')} {data['env'].get('date', '')[:16]}"


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
        groups.setdefault((_problem(r), r["dtype"], r["direction"]), []).append(r)
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


def _key(r: dict) -> tuple:
    return r["family"], r.get("section", "main"), _problem(r), r["dtype"], r["direction"], r["impl"]


def against(rows: list[dict], base: list[dict]) -> pd.DataFrame:
    """Each row of ``rows`` with the row of ``base`` of the same family, section, problem, dtype, direction
    and implementation: ``ms`` and ``baseline ms`` (replays where both rows have one, ``timed``), and
    ``ms / baseline`` (below 1: faster than the baseline); rows without a match are left out."""
    by_key = {_key(r): r for r in base}
    out = []
    for r in rows:
        b = by_key.get(_key(r))
        if b is None:
            continue
        replay = math.isfinite(_ms(r, True)) and math.isfinite(_ms(b, True))
        here, there = _ms(r, replay), _ms(b, replay)
        family, section, problem, dtype, direction, impl = _key(r)
        out.append(
            {
                "family": family,
                "problem": problem if section == "main" else f"{problem} ({section})",
                "dtype": dtype,
                "dir": direction,
                "impl": impl,
                "timed": "replay" if replay else "eager",
                "ms": here,
                "baseline ms": there,
                "ms / baseline": f"{here / there:.3f}" if there > 0 else "-",
            }
        )
    return pd.DataFrame(out)


def _read(results: str, family: str) -> dict | None:
    path = Path(results, f"{family}.json")
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops summary", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default=str(RESULTS))
    p.add_argument("--baseline", help="a results folder of the same benchmarks on other kernels: compare to it")
    args = p.parse_args(argv)
    if args.baseline:
        pairs = [(_read(args.results, f), _read(args.baseline, f)) for f in FAMILIES]
        pairs = [(a, b) for a, b in pairs if a and b]
        if not pairs:
            raise SystemExit(f"error: no family has results in both {args.results} and {args.baseline}")
        table = pd.concat([against(a["rows"], b["rows"]) for a, b in pairs], ignore_index=True)
        print(table.to_markdown(index=False, floatfmt=".4g") if len(table) else "(no rows in common)")
        for name, runs in zip(("here", "baseline"), zip(*pairs)):
            print(f"{name}:", "; ".join(sorted({_run(d) for d in runs})))
        return
    rows, devices = [], set()
    for family in FAMILIES:
        data = _read(args.results, family)
        if data is None:
            rows.append({"family": family, "problem": "(no results)"})
            continue
        devices.add(_run(data))
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
