"""A paper's claims, checked on our results: accuracy per (setting, mixer, width) and the verdicts of a
reproduction preset's ``paper: claims:`` (Zoology's Figure 2: attention solves every setting; the
recurrent models need width, more as the setting grows; PD-SSM's groups table: one layer of PD-SSM
solves every automaton the paper says it solves).

A *setting* is a task configuration (the task and its options: ``mqar`` at sequence length 64 with 4
key-value pairs), a *width* the model's ``d_model``, both as the trials ran (the results' ``task_config``
and ``d_model`` columns, so a ``--quick`` run reports the sizes it trained). Each cell's number is the
report's (``experiments.paper.aggregate``: the paper's statistic over seeds at the chosen learning rate).

The preset declares the claims it makes::

    paper:
      claims:
        solves_every: [transformer]             # reaches the solved line in every setting at every width
        needs_width: [mamba, gru, ...]          # misses it at the smallest width of some setting, and
                                                # the smallest width reaching it grows with the setting
        solves_where_the_paper_does: [pd_ssm]   # reaches the solved line in every column of the table
                                                # where the paper's number for it does (a row of the
                                                # table: a mixer, or "<mixer>, <N> layers")

``claims_lines`` renders the verdicts as Markdown for the report; ``width_table`` is also what
``python -m analysis.width`` plots.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from experiments.paper import aggregate, load_reproduction, paper_solved

CLAIM_KINDS = ("solves_every", "needs_width", "solves_where_the_paper_does")


def _options(task_config: Any) -> dict[str, Any]:
    return json.loads(task_config) if isinstance(task_config, str) and task_config.strip() else {}


def setting_labels(configs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """``(task, task_config JSON)`` -> a label: the task and the options that differ between ``configs``
    (``mqar num_kv_pairs=4 seq_len=64``; the task alone when it has one configuration)."""
    labels = {}
    for task in dict.fromkeys(t for t, _ in configs):
        mine = {c: _options(c) for t, c in configs if t == task}
        keys = sorted({k for o in mine.values() for k in o})
        differ = [k for k in keys if len({json.dumps(o.get(k), sort_keys=True) for o in mine.values()}) > 1]
        for config, options in mine.items():
            labels[(task, config)] = " ".join([task, *(f"{k}={options.get(k)}" for k in differ)])
    return labels


def _order_key(task: str, config: str) -> tuple:
    """Settings in the order of their options' values (numbers as numbers: length 64 before 128)."""
    values = _options(config).values()
    return (task, *[(0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in values])


def width_table(
    results: pd.DataFrame, metric: str = "test/acc", how: str = "best", layers: int | None = None
) -> pd.DataFrame:
    """One row per (setting, mixer, width) of ``results`` (results.csv rows of any number of sweeps).

    Columns: ``setting`` (``setting_labels``), ``task``, ``task_config``, ``width`` (``d_model``), ``mixer``
    (``experiments.paper.model_label``: ``<mixer>, <N> layers`` away from the depth ``layers``, by default
    the results' most common one),
    ``value`` (``aggregate``'s ``how`` over seeds of ``metric``: ``best`` or ``mean_at_best_lr``), ``std``,
    ``seeds``, ``lr``, ``params``; settings ordered by their options' values, then mixers in order of
    appearance, then widths ascending. ``ValueError`` when the rows lack ``d_model`` or ``metric``.
    """
    missing = [c for c in ("task", "mixer", "d_model", "status") if c not in results]
    if missing:
        raise ValueError(f"the results lack the column(s) {', '.join(missing)} (results.csv rows of a sweep)")
    if metric not in results:
        found = ", ".join(c for c in results.columns if c.startswith(("test/", "len", "range"))) or "none"
        raise ValueError(f"the results have no {metric!r} column; metrics there: {found}")
    df = results.assign(task_config=results.get("task_config", "{}")).copy()
    df["task_config"] = df["task_config"].astype(object).fillna("{}").astype(str)
    if layers is None:
        layers = int(df["layers"].fillna(1).mode().iloc[0]) if "layers" in df and df["layers"].notna().any() else 1
    key = ["task", "task_config", "d_model"] + (["entry"] if "entry" in df else [])
    labels = setting_labels(list(dict.fromkeys(zip(df["task"].astype(str), df["task_config"]))))
    rows = []
    for (task, config, width, *_), group in df.groupby(key, sort=False):
        for r in aggregate(group, metric, how, layers).itertuples():
            rows.append(
                {
                    "setting": labels[(str(task), config)],
                    "task": str(task),
                    "task_config": config,
                    "width": int(width),
                    "mixer": r.mixer,
                    "value": r.value,
                    "std": r.std,
                    "seeds": r.seeds,
                    "lr": r.lr,
                    "params": r.params,
                }
            )
    table = pd.DataFrame(rows)
    if table.empty:
        raise ValueError("no trials in the results")
    # sweeps that ran the same cell (a --quick run shrinks several widths to one) keep their best
    table = table.sort_values("value", ascending=False, kind="stable", na_position="last")
    table = table.drop_duplicates(["setting", "mixer", "width"]).reset_index(drop=True)
    order = sorted(dict.fromkeys(zip(table["task"], table["task_config"])), key=lambda k: _order_key(*k))
    mixers = list(dict.fromkeys(df["mixer"]))
    table["_s"] = [order.index(k) for k in zip(table["task"], table["task_config"])]
    table["_m"] = [mixers.index(m.split(",")[0]) if m.split(",")[0] in mixers else len(mixers) for m in table["mixer"]]
    return table.sort_values(["_s", "_m", "width"]).drop(columns=["_s", "_m"]).reset_index(drop=True)


def preset_claims(name: str) -> dict[str, list[str]]:
    """The preset's ``paper: claims:`` (kind -> mixers); ``{}`` when it declares none."""
    claims = load_reproduction(name)["paper"].get("claims") or {}
    unknown = set(claims) - set(CLAIM_KINDS)
    if unknown:
        raise ValueError(
            f"preset {name!r}: unknown claim(s) {', '.join(sorted(unknown))}; valid: {', '.join(CLAIM_KINDS)}"
        )
    return {kind: [str(m) for m in claims[kind]] for kind in CLAIM_KINDS if claims.get(kind)}


def smallest_solving_width(table: pd.DataFrame, solved: float) -> pd.DataFrame:
    """Per (mixer, setting) of a ``width_table``: ``smallest`` (the smallest width whose value reaches
    ``solved``; ``inf`` when none does), ``first`` (the smallest width evaluated), ``largest`` (the
    largest evaluated)."""
    rows = []
    for (mixer, setting), g in table.groupby(["mixer", "setting"], sort=False):
        reached = g.loc[g["value"] >= solved, "width"]
        rows.append(
            {
                "mixer": mixer,
                "setting": setting,
                "smallest": float(reached.min()) if len(reached) else math.inf,
                "first": int(g["width"].min()),
                "largest": int(g["width"].max()),
            }
        )
    return pd.DataFrame(rows)


def _pct(x: float) -> str:
    return "–" if x != x else f"{100 * x:.1f}%"


def solves_every_lines(table: pd.DataFrame, mixers: list[str], solved: float) -> list[str]:
    """One line per mixer: does it reach ``solved`` in every (setting, width) cell of ``table``?"""
    lines = []
    for mixer in mixers:
        mine = table[table["mixer"] == mixer]
        if mine.empty:
            lines.append(f"- `{mixer}` solves every setting at every width: not run.")
            continue
        short = mine[~(mine["value"] >= solved)]
        verdict = "holds" if short.empty else "does not hold"
        detail = (
            f"all {len(mine)} cells ≥ {solved:.0%}"
            if short.empty
            else f"{len(mine) - len(short)} of {len(mine)} cells ≥ {solved:.0%}; below: "
            + ", ".join(f"{r.setting} d={r.width} {_pct(r.value)}" for r in short.itertuples())
        )
        lines.append(f"- `{mixer}` solves every setting at every width: **{verdict}** ({detail}).")
    return lines


def needs_width_lines(table: pd.DataFrame, mixers: list[str], solved: float) -> list[str]:
    """A Markdown table, mixers × settings, of the smallest width reaching ``solved``, with two verdicts per
    mixer: it needs width (✓: in some setting it reaches ``solved`` only at a width above the smallest;
    ✗: wherever it reaches it, it does at the smallest width; ``never``: it reaches it nowhere, so the run
    cannot tell) and the width it needs grows with the setting (never smaller for a later setting; none
    reached counts as more than any)."""
    widths = smallest_solving_width(table[table["mixer"].isin(mixers)], solved)
    if widths.empty:
        return [f"- The recurrent models need width: none of {', '.join(mixers)} was run."]
    settings = list(dict.fromkeys(table["setting"]))
    rows = []
    for mixer in [m for m in mixers if m in set(widths["mixer"])]:
        mine = widths[widths["mixer"] == mixer].set_index("setting")
        helped = (mine["smallest"] > mine["first"]) & (mine["smallest"] < math.inf)
        needs = "✓" if helped.any() else "never" if (mine["smallest"] == math.inf).all() else "✗"
        ordered = [mine.loc[s, "smallest"] for s in settings if s in mine.index]
        grows = all(a <= b for a, b in zip(ordered, ordered[1:]))
        cells = {
            s: (
                "–"
                if s not in mine.index
                else f"{mine.loc[s, 'smallest']:g}"
                if mine.loc[s, "smallest"] < math.inf
                else f"> {mine.loc[s, 'largest']}"
            )
            for s in settings
        }
        rows.append(
            {
                "model": mixer,
                **cells,
                "needs width": needs,
                "grows with the setting": "✓" if grows else "✗",
            }
        )
    frame = pd.DataFrame(rows)
    held, never = (int((frame["needs width"] == v).sum()) for v in ("✓", "never"))
    grew = int((frame["grows with the setting"] == "✓").sum())
    return [
        f"- The recurrent models need width: {held} of {len(frame)} reach {solved:.0%} in some setting only "
        f"above the smallest width ({never} reach it nowhere); for {grew} of {len(frame)} the smallest width "
        "reaching it never shrinks as the setting grows. The smallest width reaching it per setting (`> W`: "
        "none up to the largest width W run):",
        "",
        frame.to_markdown(index=False, disable_numparse=True),
    ]


def where_the_paper_solves_lines(name: str, results: pd.DataFrame, rows: list[str], solved: float) -> list[str]:
    """One line per table row of ``rows``: does ours reach ``solved`` in every column where the paper's
    number does (``experiments.paper.compare`` on ``results``, one results.csv row per trial with its
    ``entry``)? Columns not run are listed apart and leave the verdict open."""
    from experiments.paper import compare, paper_entries

    titles = {e.entry: e.title for e in paper_entries(name)}
    entries = results["entry"] if "entry" in results else pd.Series("", index=results.index)
    table = compare(name, {entry: results[entries == entry] for entry in titles})  # every column, run or not
    lines = []
    for row in rows:
        claimed = table[(table["mixer"] == row) & (table["paper"] >= solved)]
        ran = claimed[claimed["ours"].notna()]
        short = ran[~(ran["ours"] >= solved)]
        if claimed.empty:
            lines.append(f"- `{row}` solves every column the paper's row solves: the paper's row solves none.")
            continue
        verdict = "does not hold" if len(short) else "holds" if len(ran) == len(claimed) else "open"
        parts = [f"{len(ran) - len(short)} of {len(claimed)} columns ≥ {solved:.0%}"]
        if len(short):
            parts.append("below: " + ", ".join(f"{titles[r.entry]} {_pct(r.ours)}" for r in short.itertuples()))
        if len(ran) < len(claimed):
            missing = claimed[claimed["ours"].isna()]
            parts.append("not run: " + ", ".join(titles[e] for e in missing["entry"]))
        lines.append(f"- `{row}` solves every column the paper's row solves: **{verdict}** ({'; '.join(parts)}).")
    return lines


def claims_lines(name: str, results: pd.DataFrame) -> list[str]:
    """The report's section on ``name``'s ``paper: claims:`` from the results rows of its sweeps (empty when
    the preset declares no claims or no trial has finished)."""
    claims = preset_claims(name)
    if not claims or results.empty:
        return []
    from experiments.paper import paper_entries

    entries = paper_entries(name)
    solved = paper_solved(name)
    body = []
    if "solves_where_the_paper_does" in claims:
        body += where_the_paper_solves_lines(name, results, claims["solves_where_the_paper_does"], solved)
    if {"solves_every", "needs_width"} & set(claims) and "d_model" in results:
        table = width_table(results, entries[0].metric, entries[0].aggregate, entries[0].layers)
        if "solves_every" in claims:
            body += solves_every_lines(table, claims["solves_every"], solved)
        if "needs_width" in claims:
            body += needs_width_lines(table, claims["needs_width"], solved)
    return ["", f"Claims, from the cells above (solved: ≥ {solved:.0%}):", "", *body] if body else []
