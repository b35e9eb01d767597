"""``python -m experiments.probe module.path:MyCell [--quick]``: a report card for a new cell.

1. The rules a cell must follow for Newton-parallel training: shapes (``check_shapes``), a
   position-wise step (``verify_position_wise``) and the declared Jacobian structure and closed
   form (``verify_jacobian``) at random states and random moves of the parameters -- the full check,
   with more states and parameter draws than the one at every mixer construction.
2. Newton-parallel vs sequential: forward outputs and gradients (input and parameters) of the
   multi-head mixer, in float64 and float32, with Newton run to convergence, against tolerances
   (``TOLERANCES``); plus the run-time Jacobian check (``CellMixer.check_jacobian``) at the states
   the sequence visits.
3. Newton iterations needed vs sequence length: max residual per iteration of freshly initialized
   cells (``mixers.cells.convergence.newton_residuals``), and the first iteration below tolerance.
4. The four tasks' sweeps (Parity, Keep-nth, MQAR, k-hop) for the cell next to reference mixers,
   as one study (``--workers N`` spreads them over worker processes; re-running resumes).

The verdict (first lines of the report card, ``probe.json["verdict"]``) fails the cell if it breaks
a rule or if parallel and sequential disagree, and names the rule: ``shapes``, ``position-wise
rule``, ``declared Jacobian structure``, ``closed-form Jacobian`` (``jacobian_fn``), ``non-finite``,
or ``Newton-parallel vs sequential`` (disagreement with every rule followed: Newton did not
converge). The command then exits with status 1. A failed cell is still swept, in sequential mode.

Writes ``<out>/probe-report.md`` (the report card), ``probe.json`` (the numbers), and per task
``<out>/<task>/results.csv`` / ``table.md``. ``--quick`` (a few minutes on a CPU): short sequences,
small data, 600 steps, one seed; the full version uses the ``default`` preset (the paper's sizes).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from experiments.cli import (
    Parser,
    check_device,
    check_output_folder,
    int_list,
    nonnegative_int,
    positive_int,
    run_cli,
    str_list,
)
from experiments.sweeps.runner import SweepOptions

log = logging.getLogger("experiments.probe")

#: the paper tasks (sweeps of the default or, with --quick, the smoke preset) ...
PAPER_TASKS = ("parity", "keep_nth", "mqar", "khop")
#: ... and the state-tracking entries (sweeps of the state-tracking preset: trained on short sequences,
#: scored beyond them): counting mod 3 and 5, the S3, A5 and S5 word problems
STATE_TASKS = ("z3", "z5", "s3", "a5", "s5")
TASKS = (*PAPER_TASKS, "z3", "s3")  # the default: a5, s5 and z5 take longer (--tasks)
REFERENCES = ("gru", "flashgru", "transformer")
QUICK_REFERENCES = ("gru", "transformer")
QUICK_TRAIN = {
    "max_steps": 600,
    "batch_size": 32,
    "train_size": 1000,
    "val_size": 200,
    "test_size": 500,
    "eval_every": 50,
}
QUICK_TASK_OPTIONS = {
    "parity": {"seq_len": 16},
    "keep_nth": {"seq_len": 16, "vocab_size": 16, "n": 3},
    "mqar": {"seq_len": 24, "vocab_size": 32, "num_kv_pairs": 2},
    "khop": {"seq_len": 24, "k": 1},
}
QUICK_EXTRAPOLATION = {"min_len": 3, "max_len": 16, "eval_lengths": [16, 32]}
#: test accuracy at or above which a task counts as solved
SOLVED = 0.98


def load_cell(spec: str) -> type:
    """``module.path:Class`` -> the ``RNNCell`` subclass; one-line ``ValueError`` otherwise."""
    from mixers.cells import RNNCell
    from mixers.registry import import_attr

    if ":" not in spec:
        raise ValueError(f"expected 'module.path:CellClass', got {spec!r}")
    obj = import_attr(spec)
    if not (isinstance(obj, type) and issubclass(obj, RNNCell)):
        raise ValueError(
            f"{spec!r} is not an RNNCell subclass (got {obj!r}); write `class MyCell(RNNCell)` with recurrence_step"
        )
    return obj


#: max relative error (max |parallel - sequential| / max |sequential|) of forward and gradients per dtype
TOLERANCES = {"float64": 1e-8, "float32": 1e-3}
#: the full check: random states per draw and random parameter draws (a mixer's construction uses 8 and 2)
RULE_PROBES, RULE_PARAM_DRAWS = 32, 8


def check_rules(cell_cls: type, d_in: int = 16, d_state: int = 16) -> dict[str, dict[str, Any]]:
    """Shapes, the position-wise rule and the declared Jacobian at random states and parameters (float64)."""
    torch.manual_seed(0)
    cell = cell_cls(d_in, d_state)
    rules: dict[str, dict[str, Any]] = {}
    try:
        cell.check_shapes()
        rules["shapes"] = {"ok": True, "message": "shapes of the step, projection, Jacobian and output are consistent"}
    except (ValueError, TypeError) as err:
        rules["shapes"] = {"ok": False, "message": f"shape check: {err}"}
        return rules
    pw = cell.verify_position_wise(raise_on_error=False, param_draws=RULE_PARAM_DRAWS)
    rules["position_wise"] = {"ok": pw.ok, "error": pw.error, "message": pw.message}
    jac = cell.verify_jacobian(probes=RULE_PROBES, param_draws=RULE_PARAM_DRAWS, raise_on_error=False)
    rules["jacobian"] = {
        "ok": jac.ok,
        "structure": jac.structure,
        "fits": jac.fits,
        "off_structure": jac.off_structure,
        "closed_form_error": jac.closed_form_error,
        "param_draws": jac.param_draws,
        "message": jac.message,
    }
    return rules


def _rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _nan_max(values) -> float:
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)


def _finite(*tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def agreement(
    cell_cls: type,
    d_model: int = 32,
    num_heads: int = 4,
    length: int = 64,
    batch: int = 4,
    iters: int = 100,
    tol: float = 1e-12,
) -> dict[str, Any]:
    """Max errors of Newton-parallel vs sequential (forward, input gradient, parameter gradients).

    Newton runs until the residual is below ``tol`` (at most ``iters`` iterations), without the
    residual check or the run-time Jacobian check (so what the solve does shows instead of a
    fallback). Per dtype: the errors, ``finite`` (sequential and parallel results and gradients),
    ``within`` (every error within ``TOLERANCES``) and Newton's iterations and final residual;
    ``jacobian_at_states``: the run-time Jacobian check's message at the float64 sequence's states,
    or ``None``.
    """
    from mixers.cells import cell_mixer

    out: dict[str, Any] = {"length": length, "batch": batch, "d_model": d_model}
    for dtype in (torch.float64, torch.float32):
        torch.manual_seed(0)
        seq = cell_mixer(cell_cls, d_model, num_heads, mode="sequential", verify=False).to(dtype)
        par = copy.deepcopy(seq)
        par.mode, par.iters, par.tol, par.check = "parallel", iters, tol if dtype == torch.float64 else 1e-6, False
        par.jacobian_check_every = 0
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(batch, length, d_model, generator=gen, dtype=dtype)
        w = torch.randn(batch, length, d_model, generator=gen, dtype=dtype)
        grads = []
        for mixer in (seq, par):
            xi = x.clone().requires_grad_(True)
            y = mixer(xi)
            (y * w).sum().backward()
            grads.append(
                (y.detach(), xi.grad, {n: p.grad.clone() for n, p in mixer.named_parameters() if p.grad is not None})
            )
        (ys, gxs, gps), (yp, gxp, gpp) = grads
        name = str(dtype).replace("torch.", "")
        row = {
            "forward": _rel_max(yp, ys),
            "grad_input": _rel_max(gxp, gxs),
            "grad_params": _nan_max(_rel_max(gpp[n], gps[n]) for n in gps if n in gpp),
            "sequential_finite": _finite(ys, gxs, *gps.values()),
            "parallel_finite": _finite(yp, gxp, *gpp.values()),
            "newton_iters": len(par.last_newton_stats.residuals) - 1 if par.last_newton_stats else None,
            "final_residual": par.last_newton_stats.final_residual if par.last_newton_stats else None,
        }
        errors = [row["forward"], row["grad_input"], row["grad_params"]]
        row["within"] = (
            row["sequential_finite"] and row["parallel_finite"] and all(e <= TOLERANCES[name] for e in errors)
        )
        out[name] = row
        if dtype == torch.float64:
            out["jacobian_at_states"] = seq.check_jacobian(x)
    return out


#: how the verdict line says that a rule is broken
_BROKEN = {
    "shapes": "wrong shapes",
    "position-wise rule": "breaks the position-wise rule",
    "declared Jacobian structure": "breaks its declared Jacobian structure",
    "closed-form Jacobian": "its closed-form Jacobian (jacobian_fn) differs from autograd",
    "non-finite": "non-finite states or gradients",
}


def verdict(rules: dict[str, dict[str, Any]], agree: dict[str, Any] | None) -> dict[str, Any]:
    """PASS, or FAIL with the rules broken (most basic first) and one reason per rule."""
    from mixers.cells.base import JACOBIAN_RTOL

    broken: dict[str, str] = {}  # rule -> the first reason found

    jac = rules.get("jacobian")
    closed_form = jac is not None and jac.get("closed_form_error") is not None  # the cell defines jacobian_fn

    def jacobian_rule(message: str, off: float) -> str:
        if "one position at a time" in message:
            return "position-wise rule"
        return "closed-form Jacobian" if closed_form and not off > JACOBIAN_RTOL else "declared Jacobian structure"

    if not rules["shapes"]["ok"]:
        broken["shapes"] = rules["shapes"]["message"]
    if "position_wise" in rules and not rules["position_wise"]["ok"]:
        broken["position-wise rule"] = rules["position_wise"]["message"]
    if jac is not None and not jac["ok"]:
        broken.setdefault(jacobian_rule(jac["message"], jac["off_structure"]), jac["message"])
    if agree is not None and "error" in agree:
        broken.setdefault("Newton-parallel vs sequential", f"the comparison failed: {agree['error']}")
    elif agree is not None:
        mismatch = agree.get("jacobian_at_states")
        if mismatch:
            broken.setdefault(jacobian_rule(mismatch, math.inf if "declares jacobian" in mismatch else 0.0), mismatch)
        if not all(agree[d]["sequential_finite"] for d in TOLERANCES):  # no ground truth to compare with
            broken.setdefault(
                "non-finite",
                "the sequential loop itself gives non-finite states or gradients on standard normal inputs",
            )
        else:
            off = [
                f"{d} {what.replace('_', ' ')} {agree[d][what]:.1e} > {TOLERANCES[d]:g}"
                for d in TOLERANCES
                for what in ("forward", "grad_input", "grad_params")
                if not agree[d][what] <= TOLERANCES[d]
            ]
            if not all(agree[d]["parallel_finite"] for d in TOLERANCES):
                off.insert(0, "Newton-parallel results or gradients are non-finite")
            if off and broken:
                broken["Newton-parallel vs sequential"] = "; ".join(off) + " (a consequence of the rule broken above)"
            elif off:
                res = ", ".join(
                    f"{d} {agree[d]['final_residual']:.1e} after {agree[d]['newton_iters']} iterations"
                    for d in TOLERANCES
                )
                broken["Newton-parallel vs sequential"] = (
                    "; ".join(off) + f" (the rules hold; Newton's final residual: {res})"
                )
    if not broken:
        return {
            "ok": True,
            "rules": [],
            "reasons": [],
            "line": "PASS: follows the position-wise rule and its declared Jacobian at random states and "
            "parameters; Newton-parallel matches sequential (forward and gradients) within "
            + " / ".join(f"{t:g} ({d})" for d, t in TOLERANCES.items()),
        }
    rules_broken = list(broken)
    named = [_BROKEN[r] for r in rules_broken if r in _BROKEN]
    if "Newton-parallel vs sequential" in rules_broken:
        named.append(
            "Newton-parallel and sequential disagree" + ("" if named else " although the cell follows the rules")
        )
    line = "FAIL: " + "; ".join(named)
    return {"ok": False, "rules": rules_broken, "reasons": [f"{r}: {m}" for r, m in broken.items()], "line": line}


def iterations_vs_length(
    cell_cls: type,
    lengths: list[int],
    d_model: int = 32,
    num_heads: int = 4,
    batch: int = 4,
    iters: int = 12,
    tol: float = 1e-6,
    dtype=torch.float64,
) -> list[dict[str, Any]]:
    """Per length: residual per Newton iteration and the first iteration with residual <= ``tol``."""
    from mixers.cells import cell_mixer
    from mixers.cells.convergence import newton_residuals

    torch.manual_seed(0)
    mixer = cell_mixer(cell_cls, d_model, num_heads, mode="parallel", verify=False).to(dtype)
    rows = []
    for length in lengths:
        gen = torch.Generator().manual_seed(length)
        x = torch.randn(batch, length, d_model, generator=gen, dtype=dtype)
        t0 = time.perf_counter()
        res = newton_residuals(mixer, x, iters)
        needed = next((k for k, r in enumerate(res) if r <= tol), None)
        rows.append({"length": length, "residuals": res, "iters_to_tol": needed, "seconds": time.perf_counter() - t0})
    return rows


def trained_convergence(
    out: Path, cell: str, results: dict[str, pd.DataFrame], iters: int = 12, tol: float = 1e-6, batch: int = 8
) -> list[dict[str, Any]]:
    """Per task whose sweep trained the cell in a parallel mode: the Newton fallback share of its training
    forwards and, at its best trial's best checkpoint, the residual per Newton iteration (float64) on
    fresh task inputs at the longest training length (the mixer's own inputs, captured by a hook)."""
    from experiments.sweeps.results import best_over_lrs
    from experiments.trial.lit import LitSequenceModel
    from experiments.trial.model import mixer_input
    from experiments.trial.train import BEST_CHECKPOINT, CHECKPOINT_DIR
    from mixers.cells.convergence import newton_residuals
    from mixers.cells.mixer import CellMixer
    from tasks import get_task

    rows = []
    for task, df in results.items():
        mine = df[(df["mixer"] == cell) & (df["status"] == "ok")] if len(df) else df
        if mine.empty or "newton/newton_forwards" not in mine or "trial_dir" not in mine:
            continue
        forwards = float(mine["newton/newton_forwards"].fillna(0).sum())
        fallback = float(mine["newton/fallback_count"].fillna(0).sum()) / forwards if forwards else math.nan
        best = best_over_lrs(mine).sort_values("best_val_acc", ascending=False).iloc[0]
        ckpt = out / best["trial_dir"] / CHECKPOINT_DIR / BEST_CHECKPOINT
        if not ckpt.is_file():
            continue
        model = LitSequenceModel.load_from_checkpoint(ckpt, map_location="cpu").model.double().eval()
        if not isinstance(model.mixer, CellMixer):
            continue
        extrapolation = (
            json.loads(best["extrapolation"])
            if isinstance(best["extrapolation"], str) and best["extrapolation"]
            else {}
        )
        options = json.loads(best["task_config"])
        if extrapolation:
            options["seq_len"] = extrapolation["max_len"]
        tokens = get_task(best["task"], **options).generate(batch, seed=12345).inputs
        res = newton_residuals(model.mixer, mixer_input(model, tokens), iters)
        rows.append(
            {
                "task": task,
                "fallback": fallback,
                "residuals": res,
                "length": tokens.shape[1],
                "iters_to_tol": next((k for k, r in enumerate(res) if r <= tol), None),
            }
        )
    return rows


def sweep_plans(
    cell: str,
    tasks: list[str],
    references: list[str],
    quick: bool,
    max_steps: int | None,
    seeds: list[int] | None,
    mixer_options: dict[str, Any],
) -> list:
    from experiments.sweeps.presets import resolve_sweep

    plans = []
    for task in tasks:
        over: dict[str, Any] = {"mixers": [cell, *references]}
        if task in STATE_TASKS:
            over.update({"preset": "state-tracking", "layers": [1]})  # the probe asks what one layer of the cell does
            if quick:
                over.update(
                    {"seeds": [0], "train": dict(QUICK_TRAIN), "lrs": [3e-3], "extrapolation": QUICK_EXTRAPOLATION}
                )
        elif quick:
            over.update(
                {
                    "preset": "smoke",
                    "seeds": [0],
                    "train": dict(QUICK_TRAIN),
                    "task_options": QUICK_TASK_OPTIONS.get(task, {}),
                    "lrs": [3e-3],
                }
            )
            if task == "parity":
                over["extrapolation"] = QUICK_EXTRAPOLATION
        if max_steps:
            over["train"] = {**over.get("train", {}), "max_steps": max_steps}
        if seeds:
            over["seeds"] = seeds
        if mixer_options:
            over["mixer_options"] = {cell: mixer_options}
        preset = over.pop("preset", "default")
        plans.append(resolve_sweep(task, preset, over))
    return plans


def report_markdown(
    cell: str,
    rules: dict,
    agree: dict | None,
    conv: list[dict] | None,
    sweeps: dict[str, Any] | None,
    meta: dict[str, Any],
    verdict_: dict[str, Any],
) -> str:
    """The report card."""
    header = (
        f"{meta.get('mode', '')}; device {meta.get('device', 'cpu')}; {meta.get('date', '')}; "
        f"{meta.get('versions', '')}"
    )
    lines = [f"# Probe report: `{cell}`", "", header, "", f"**Verdict: {verdict_['line']}**"]
    lines += [f"- {reason}" for reason in verdict_["reasons"]]
    lines += ["", "## 1. Rules", ""]

    def ok(rule: dict[str, Any]) -> str:
        return "**OK**" if rule["ok"] else "**BROKEN**"

    lines.append(f"- shapes: {ok(rules['shapes'])} — {rules['shapes']['message']}")
    if "position_wise" in rules:
        lines.append(f"- position-wise step: {ok(rules['position_wise'])} — {rules['position_wise']['message']}")
    jac = rules.get("jacobian")
    if jac is not None:
        lines.append(
            f"- declared Jacobian `{jac['structure']}`: {'**OK**' if jac['ok'] else '**WRONG**'} — {jac['message']}"
        )
        if jac.get("off_structure") is not None and jac["off_structure"] == jac["off_structure"]:
            lines.append(
                f"- largest entry outside the declared structure: {jac['off_structure']:.2g} of the largest entry "
                f"(the structure that fits: `{jac['fits']}`)"
            )
    if agree and "error" not in agree:
        lines += [
            "",
            "## 2. Newton-parallel vs sequential",
            "",
            f"B={agree['batch']}, L={agree['length']}, d={agree['d_model']}; relative max errors "
            "(max |parallel − sequential| / max |sequential|), Newton run to convergence without fallback; "
            "tolerance " + ", ".join(f"{t:g} ({d})" for d, t in TOLERANCES.items()) + ".",
            "",
            pd.DataFrame(
                [
                    {
                        "dtype": name,
                        "forward": f"{a['forward']:.1e}",
                        "grad input": f"{a['grad_input']:.1e}",
                        "grad params": f"{a['grad_params']:.1e}",
                        "within tolerance": "yes" if a["within"] else "**no**",
                        "Newton iterations": a["newton_iters"],
                        "final residual": f"{a['final_residual']:.1e}",
                    }
                    for name, a in ((n, agree[n]) for n in TOLERANCES)
                ]
            ).to_markdown(index=False, disable_numparse=True),
        ]
        lines += [
            "",
            "Run-time Jacobian check at the states of the float64 sequence: "
            + (
                agree["jacobian_at_states"]
                or "no mismatch (the Jacobian the solve uses matches autograd's where finite)"
            ),
        ]
    if conv:
        width = max(len(r["residuals"]) for r in conv)
        lines += [
            "",
            "## 3. Newton iterations vs sequence length",
            "",
            f"Max residual per iteration (float64, a fresh initialization, standard normal inputs); `to tol`: first iteration ≤ {meta.get('tol', 1e-6):g} "
            "(the default training setting is 3 iterations, then a residual check at 1e-4 that falls back to the sequential loop).",
            "",
            pd.DataFrame(
                [
                    {
                        "L": r["length"],
                        "to tol": r["iters_to_tol"] if r["iters_to_tol"] is not None else f"> {width - 1}",
                        **{f"it{k}": f"{x:.0e}" for k, x in enumerate(r["residuals"])},
                    }
                    for r in conv
                ]
            )
            .fillna("")
            .to_markdown(index=False, disable_numparse=True),
        ]
    trained = (sweeps or {}).get("trained") or []
    if conv and trained:
        width = max(len(r["residuals"]) for r in trained)
        lines += [
            "",
            "At the trained parameters (the best checkpoint of each task's sweep in section 4, fresh task "
            "inputs at the longest training length) the same solve can need more iterations than at a fresh "
            "initialization; `fallback`: share of the training forwards whose Newton solve missed the residual "
            "check and fell back to the sequential loop (exact results, sequential speed).",
            "",
            pd.DataFrame(
                [
                    {
                        "task": r["task"],
                        "L": r["length"],
                        "to tol": r["iters_to_tol"] if r["iters_to_tol"] is not None else f"> {width - 1}",
                        "fallback": "–" if r["fallback"] != r["fallback"] else f"{100 * r['fallback']:.0f}%",
                        **{f"it{k}": f"{x:.0e}" for k, x in enumerate(r["residuals"])},
                    }
                    for r in trained
                ]
            )
            .fillna("")
            .to_markdown(index=False, disable_numparse=True),
        ]
    if sweeps:
        tasks, table, params = sweeps["tasks"], sweeps["acc"], sweeps["params"]
        state = [t for t in tasks if t in STATE_TASKS]
        metric = "Test accuracy" + (f"; {', '.join(state)}: mean accuracy beyond the training lengths" if state else "")
        lines += [
            "",
            "## 4. Tasks",
            "",
            f"{metric} (best over seeds; {sweeps['budget']}); **bold**: solved (≥ {SOLVED:.0%}).",
            "",
        ]
        card = []
        for mixer, accs in table.items():
            cells = []
            for t in tasks:
                a = accs.get(t, float("nan"))
                p = params.get(mixer, {}).get(t)
                text = "–" if a != a else f"{100 * a:.1f}%"
                text = f"**{text}**" if a == a and a >= SOLVED else text
                cells.append(text + (f" ({p / 1000:.1f}k)" if p else ""))
            solved = [t for t in tasks if accs.get(t, 0) == accs.get(t, 0) and accs.get(t, 0) >= SOLVED]
            card.append({"mixer": mixer, **dict(zip(tasks, cells)), "solved": ", ".join(solved) or "none"})
        lines.append(pd.DataFrame(card).to_markdown(index=False, disable_numparse=True))
        lines += ["", f"Per-task results: `<task>/results.csv`, `<task>/table.md`; failed trials: {sweeps['failed']}."]
    return "\n".join(lines) + "\n"


def probe(
    cell: str,
    out: Path,
    options: SweepOptions = SweepOptions(),
    *,
    quick: bool = False,
    tasks: list[str] | None = None,
    references: list[str] | None = None,
    max_steps: int | None = None,
    seeds: list[int] | None = None,
    lengths: list[int] | None = None,
    run_sweeps: bool = True,
) -> dict[str, Any]:
    """Run every check and the sweeps (run as ``options`` says); write the report card; returns the
    numbers (also ``probe.json``).

    ``numbers["verdict"]``: ``ok``, the ``rules`` broken, one reason per rule and the verdict ``line``.
    """
    from experiments.sweeps.results import atomic_write_text, best_over_lrs, versions

    cell_cls = load_cell(cell)
    tasks = list(tasks or TASKS)
    references = list(QUICK_REFERENCES if quick else REFERENCES) if references is None else references
    lengths = lengths or ([16, 64, 256] if quick else [64, 256, 1024, 4096])
    out.mkdir(parents=True, exist_ok=True)
    numbers: dict[str, Any] = {"cell": cell}
    log.info("1/4 rules: shapes, position-wise step, Jacobian structure")
    numbers["rules"] = rules = check_rules(cell_cls)
    agree = conv = None
    if rules["shapes"]["ok"]:
        log.info("2/4 Newton-parallel vs sequential")
        try:
            agree = agreement(cell_cls, length=32 if quick else 128)
        except Exception as err:  # noqa: BLE001 -- the user's cell: report it on the card
            agree = {"error": f"{type(err).__name__}: {err}"}
        numbers["agreement"] = agree
    numbers["verdict"] = verdict_ = verdict(rules, agree)
    log.info("verdict: %s", verdict_["line"])
    if verdict_["ok"]:
        log.info("3/4 Newton iterations vs length")
        numbers["convergence"] = conv = iterations_vs_length(cell_cls, lengths)
    sweeps = None
    if run_sweeps:
        from experiments.sweeps.runner import run_plans

        log.info("4/4 sweeps: %s × %s", ", ".join(tasks), ", ".join([cell, *references]))
        cell_options = {} if verdict_["ok"] else {"mode": "sequential", "verify": False}
        plans = sweep_plans(cell, tasks, references, quick, max_steps, seeds, cell_options)
        results, info = run_plans(
            plans,
            out,
            "probe" + ("-quick" if quick else ""),
            options,
            label=f"probe {cell_cls.__name__}",
        )
        acc: dict[str, dict[str, float]] = {}
        params: dict[str, dict[str, int]] = {}
        failed = 0
        for task, df in results.items():
            if df.empty:
                continue
            failed += int((df["status"] != "ok").sum())
            best = best_over_lrs(df)
            metric = (
                "extrap/mean_acc" if task in STATE_TASKS else "test/acc"
            )  # state tracking: beyond the training lengths
            for mixer in dict.fromkeys(df["mixer"]):
                sel = best[best["mixer"] == mixer] if len(best) else best
                acc.setdefault(mixer, {})[task] = (
                    float(sel[metric].max()) if len(sel) and metric in sel else float("nan")
                )
                if len(sel):
                    params.setdefault(mixer, {})[task] = int(sel["n_params"].iloc[0])
        train = plans[0].train
        sweeps = numbers["sweeps"] = {
            "tasks": tasks,
            "acc": acc,
            "params": params,
            "failed": failed,
            "budget": f"{train.max_steps} steps, {len(plans[0].seeds)} seed(s), lr {plans[0].lrs}",
            "cells_done": info["done"],
            "cells": info["cells"],
        }
        if verdict_["ok"]:
            log.info("Newton iterations at the trained parameters")
            numbers["trained_convergence"] = trained = trained_convergence(out, cell, results)
            sweeps["trained"] = trained
    meta = {
        "mode": "quick (CPU smoke sizes)" if quick else "full (default preset)",
        "date": time.strftime("%Y-%m-%d"),
        "device": options.device if options.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"),
        "versions": ", ".join(f"{k} {v}" for k, v in versions().items()),
        "tol": 1e-6,
    }
    text = report_markdown(cell, rules, agree, conv, sweeps, meta, verdict_)
    atomic_write_text(out / "probe-report.md", text)
    atomic_write_text(out / "probe.json", json.dumps(numbers, indent=1, default=lambda x: None if x != x else x))
    return numbers


def main(argv: list[str] | None = None) -> int:
    from experiments.trial.train import quiet_lightning

    p = Parser(
        prog="python -m experiments.probe",
        description="Report card for a new recurrent cell: its rules (position-wise step, declared Jacobian at "
        "random states and parameters), Newton-parallel vs sequential agreement (forward and gradients), "
        "Newton iterations vs length, and sweeps of the paper tasks and the state-tracking tasks next to "
        "reference mixers. The verdict names the rule a failing cell breaks; the exit status is then 1.",
        epilog="CELL is 'module.path:ClassName' of an RNNCell subclass (mixers.cells.RNNCell) importable from the "
        f"current directory. Tasks: {', '.join(PAPER_TASKS)} (accuracy on the test set) and {', '.join(STATE_TASKS)} "
        "(the state-tracking preset's entries: mean accuracy beyond the training lengths). "
        "Example: python -m experiments.probe mycells:MinGRU --quick",
    )
    p.add_argument("cell", help="module.path:CellClass")
    p.add_argument("--quick", action="store_true", help="a few minutes on a CPU: small tasks, 600 steps, one seed")
    p.add_argument("--out", type=Path, help="output folder (default: runs/probe/<CellClass>[-quick])")
    p.add_argument(
        "--tasks", type=str_list, default=list(TASKS), help=f"comma-separated tasks (default: {','.join(TASKS)})"
    )
    p.add_argument(
        "--references",
        help=f"comma-separated reference mixers (default: {','.join(REFERENCES)}; "
        f"--quick: {','.join(QUICK_REFERENCES)}); '' for none",
    )
    p.add_argument(
        "--workers",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="worker processes for the sweeps (default: in this process)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--max-steps", type=positive_int, help="override the step budget per trial")
    p.add_argument("--seeds", type=int_list, help="override the seeds, e.g. 0,1,2")
    p.add_argument(
        "--lengths", type=int_list, help="sequence lengths for the Newton convergence check, e.g. 64,256,1024"
    )
    p.add_argument("--no-sweeps", action="store_true", help="only the Jacobian and Newton checks")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_lightning()
    sys.path.insert(0, "")  # cells in the current directory

    def run() -> None:
        tasks = args.tasks
        bad = [t for t in tasks if t not in (*PAPER_TASKS, *STATE_TASKS)]
        if bad:
            raise ValueError(f"--tasks: unknown {', '.join(bad)}; valid: {', '.join((*PAPER_TASKS, *STATE_TASKS))}")
        if any(n < 2 for n in args.lengths or []):
            raise ValueError(f"--lengths: every length must be >= 2, got {args.lengths}")
        references = None if args.references is None else [m for m in args.references.split(",") if m]
        check_device(args.device)
        cell_cls = load_cell(args.cell)
        out = check_output_folder(
            args.out or Path("runs") / "probe" / (cell_cls.__name__ + ("-quick" if args.quick else ""))
        )
        numbers = probe(
            args.cell,
            out,
            SweepOptions(workers=args.workers, device=args.device, progress=not args.no_progress),
            quick=args.quick,
            tasks=tasks,
            references=references,
            max_steps=args.max_steps,
            seeds=args.seeds,
            lengths=args.lengths,
            run_sweeps=not args.no_sweeps,
        )
        print((out / "probe-report.md").read_text())
        print(f"report: {out / 'probe-report.md'} (numbers: {out / 'probe.json'})")
        passed.append(numbers["verdict"]["ok"])

    passed: list[bool] = []
    code = run_cli(run, "re-run the same command to resume the sweeps")
    return code or (0 if passed and passed[0] else 1)


if __name__ == "__main__":
    sys.exit(main())
