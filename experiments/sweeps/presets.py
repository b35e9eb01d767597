"""Presets: named sweep configurations in ``experiments/presets/<name>.yaml``.

A preset file::

    description: one line
    defaults:                 # for every task (each key optional)
      mixers: [gru, lstm]
      seeds: [0, 1, 2]
      lrs: [5.0e-4]
      train: {max_steps: 10000, ...}          # experiments.trial.train.TrainConfig fields
      mixer_options: {flashgru: {clip_norm: 0.9}}
      layers: [1, 2]          # model depth, a grid axis (default 1)
      mixer_layers: {mlstm_exp+slstm: [2]}   # a mixer's own depths, in place of layers (a mixed stack's
                                             # depth is a multiple of its parts)
      precision: 32-true      # or bf16-mixed (Lightning's names)
      d_model: 64             # the model's width; this and every other field of
      conv_kernel: 4          # experiments.trial.shape.ModelShape (block, positional, ...) is a key
    tasks:                    # per task: the same keys, plus task_options and extrapolation;
      parity: {...}           # a task absent here is not part of the preset

A ``tasks:`` entry may name its task with ``task:`` (``khop2: {task: khop, task_options: {k: 2}}``),
so one preset can sweep a task in several configurations. ``priority: high`` marks a sweep whose trials
are expected to run longest: with ``--workers N --mps`` a quarter of the workers run at the MPS
server's normal client priority and take these trials first, the rest at below-normal priority
(``experiments.sweeps.workers.priority_classes``). It changes when trials run, never what they compute.
Top-level ``paper:`` and ``budget:`` hold the paper's numbers and the compute budget of reproduction presets (``experiments.reproduce``),
``quick:`` the overrides its ``--quick`` form adds to every sweep (``{task_options: {seq_len: 32, num_kv_pairs: 2}}``);
``budget: {engine: compiled}`` makes ``--engine auto`` (the default) run the preset's trials on CUDA with the compiled
engine (``experiments.trial.train.RunOptions.gpu_engine``; the CPU stays eager).

``extends: OTHER`` starts from preset ``OTHER`` and merges this file over it (dictionaries key by key,
so ``tasks: {parity: {train: {max_steps: 1000}}}`` changes one number of one sweep); ``only: [...]``
keeps just those sweeps of the result, in that order. Variants of a table (a subset, another reading,
another budget) so state only what differs, and share the cells that do not.

``resolve_sweep(task, preset)`` merges: the task's structural defaults (``TASK_DEFAULTS``: the
paper's block and positional encoding per task) < ``defaults`` < ``tasks[task]`` < CLI overrides, then
parses every task, training, extrapolation and mixer option to its declared type or refuses it in one
line (``experiments.sweeps.options``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from typing import Any

import yaml

from experiments.sweeps.options import dataclass_types, signature_types, typed_options
from experiments.trial.shape import ModelShape
from experiments.trial.train import TrainConfig, TrialSpec
from tasks import TASKS, ExtrapolationConfig

#: the YAML files, in ``experiments/presets/`` (beside the CLIs that name them)
PRESET_DIR = Path(__file__).parents[1] / "presets"

#: the paper's model per task (paper 000 App. C.2): † tasks use the bare mixer; Keep-nth needs positions
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "parity": {"block": "mixer", "positional": "none"},
    "keep_nth": {"block": "mixer", "positional": "sinusoidal"},
    "mqar": {"block": "full", "positional": "none"},
    "khop": {"block": "full", "positional": "none"},
}

#: the keys of a sweep besides the model's shape (every ``ModelShape`` field is a key too)
_PLAN_KEYS = {
    "mixers",
    "seeds",
    "lrs",
    "train",
    "task_options",
    "extrapolation",
    "description",
    "task",
    "priority",
    "mixer_layers",
}
SWEEP_KEYS = _PLAN_KEYS | set(ModelShape.field_names())
#: the shape's fields the grid sets per cell (``mixers``, per-mixer ``mixer_options``, ``layers``)
GRID_FIELDS = ("mixer", "mixer_options", "layers")
PRIORITIES = ("normal", "high")
#: top-level keys of a preset file (``paper``: the paper's numbers, read by ``experiments.reproduce``)
PRESET_KEYS = {"description", "defaults", "tasks", "paper", "budget", "extends", "only", "quick"}


@dataclasses.dataclass
class SweepPlan:
    """A resolved sweep for one task: the grid and the per-trial settings."""

    task: str
    preset: str
    mixers: list[str]
    seeds: list[int]
    lrs: list[float]
    train: TrainConfig
    task_options: dict[str, Any]
    #: per mixer, its options (``ModelShape.mixer_options`` of its cells)
    mixer_options: dict[str, dict[str, Any]]
    #: the shape every cell shares; its ``mixer``, ``mixer_options`` and ``layers`` are set per cell
    #: (``GRID_FIELDS``: from ``mixers``, ``mixer_options`` and ``layers`` / ``mixer_layers``)
    model: ModelShape
    extrapolation: dict[str, Any] | None
    description: str = ""
    #: the preset's name for this sweep (a key of ``tasks:``; differs from ``task`` when a preset
    #: sweeps one task twice, e.g. ``khop2: {task: khop, task_options: {k: 2}}``)
    entry: str = ""
    #: ``high``: its trials go first to the workers with the higher MPS client priority (scheduling only)
    priority: str = "normal"
    #: model depths swept (a grid axis, outside seeds and lrs)
    layers: list[int] = dataclasses.field(default_factory=lambda: [ModelShape().layers])
    #: per mixer, its depths in place of ``layers`` (e.g. a mixed stack ``mlstm_exp+slstm`` at 2)
    mixer_layers: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def depths(self, mixer: str) -> list[int]:
        """The depths ``mixer`` is swept at: its ``mixer_layers`` where it has them, else ``layers``."""
        return self.mixer_layers.get(mixer, self.layers)

    def shape(self, mixer: str, layers: int) -> ModelShape:
        """The model of the plan's cells of ``mixer`` at depth ``layers``."""
        return dataclasses.replace(
            self.model, mixer=mixer, mixer_options=self.mixer_options.get(mixer, {}), layers=layers
        )


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


@functools.lru_cache(maxsize=128)
def _parsed(text: str) -> dict[str, Any]:
    """A preset file's YAML, parsed once per text (libyaml's loader where PyYAML has it): listing the
    reproductions reads every preset, and a report lists them many times."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def load_preset(name: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The preset dict (``extends`` and ``only`` applied); ``ValueError`` listing the known presets if
    ``name`` is unknown."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(available_presets())}")
    data = copy.deepcopy(_parsed(path.read_text()))
    if "extends" in data:
        if data["extends"] in (*_seen, name):
            raise ValueError(
                f"preset {name!r}: 'extends' makes a cycle ({' -> '.join([*_seen, name, data['extends']])})"
            )
        base = load_preset(data["extends"], (*_seen, name))
        data = _merge(base, {k: v for k, v in data.items() if k != "extends"})
    if "only" in data:
        only, tasks = list(data.pop("only")), data.get("tasks", {})
        missing = [t for t in only if t not in tasks]
        if missing:
            raise ValueError(f"preset {name!r}: 'only' names sweep(s) it does not have: {', '.join(missing)}")
        data["tasks"] = {t: tasks[t] for t in only}
    unknown = set(data) - PRESET_KEYS
    if unknown:
        raise ValueError(
            f"preset {name!r}: unknown top-level key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(PRESET_KEYS))}"
        )
    for section in [data.get("defaults", {}), *data.get("tasks", {}).values()]:
        unknown = set(section) - SWEEP_KEYS
        if unknown:
            raise ValueError(
                f"preset {name!r}: unknown key(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(SWEEP_KEYS))}"
            )
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_options(preset: str, kind: str, options: dict[str, Any], config: type) -> None:
    """One clear error for keys of ``options`` that are not fields of the dataclass ``config``."""
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = set(options) - fields
    if unknown:
        raise ValueError(
            f"preset {preset!r}: unknown {kind} option(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(fields))}"
        )


def mixer_option_types(mixer: str) -> dict[str, Any]:
    """The declared type of each option of ``mixer`` (its factory's parameters; ``{}`` where the name does
    not resolve: the model check reports that)."""
    from mixers.build import resolve_mixer, split_options

    try:
        return signature_types(resolve_mixer(split_options(mixer)[0]))
    except (ValueError, ImportError, AttributeError):
        return {}


def _typed_mixer_options(mixers: list[str], options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every mixer's options (and those in its name, ``name[key=value]``) parsed to the factory's types."""
    from mixers.build import split_options

    typed = {}
    for mixer in mixers:
        declared = mixer_option_types(mixer)
        typed_options(split_options(mixer)[1], declared, f"mixer {mixer!r}")
        typed[mixer] = typed_options(options.get(mixer, {}), declared, f"mixer {mixer!r}")
    return {**options, **typed}


def resolve_sweep(task: str, preset: str = "default", overrides: dict[str, Any] | None = None) -> SweepPlan:
    """Merge task defaults, the preset and CLI ``overrides`` into a ``SweepPlan``. ``overrides`` holds
    ``SweepPlan`` fields (``None``: keep the preset's) and ``every_mixer``: options for every mixer
    (``--mixer-option``), over the preset's per-mixer ones."""
    overrides = dict(overrides or {})
    every_mixer = overrides.pop("every_mixer", None) or {}
    data = load_preset(preset)
    tasks = data.get("tasks", {})
    if task not in tasks:
        raise ValueError(f"preset {preset!r} has no sweep for task {task!r}; it covers: {', '.join(tasks) or 'none'}")
    real_task = str((tasks[task] or {}).get("task", task))
    merged = _merge(_merge(TASK_DEFAULTS.get(real_task, {}), data.get("defaults", {})), tasks[task] or {})
    merged = _merge(merged, {k: v for k, v in overrides.items() if v is not None})
    _check_options(preset, "train", merged.get("train", {}), TrainConfig)
    train = typed_options(merged.get("train", {}), dataclass_types(TrainConfig), "train")
    extrapolation = merged.get("extrapolation")
    if extrapolation:
        _check_options(preset, "extrapolation", extrapolation, ExtrapolationConfig)
        extrapolation = typed_options(extrapolation, dataclass_types(ExtrapolationConfig), "extrapolation")
        ExtrapolationConfig(**extrapolation)  # ValueError naming the constraint (lengths out of order, ...)
    real_task = str(merged.get("task", task))
    task_options = dict(merged.get("task_options", {}))
    if real_task in TASKS:
        task_options = typed_options(task_options, dataclass_types(TASKS[real_task].Config), f"{real_task} task")
    priority = str(merged.get("priority", "normal"))
    if priority not in PRIORITIES:
        raise ValueError(
            f"preset {preset!r}: task {task!r}: priority must be one of {', '.join(PRIORITIES)}, got {priority!r}"
        )
    for key in ("mixers", "seeds", "lrs"):
        if not merged.get(key):
            raise ValueError(f"preset {preset!r}: task {task!r} needs a non-empty '{key}' list")
    layers = merged.get("layers", [ModelShape().layers])
    layers = layers if isinstance(layers, list) else [layers]
    if not layers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in layers):
        raise ValueError(
            f"preset {preset!r}: task {task!r}: layers must be an integer >= 1 or a list of them, "
            f"got {merged.get('layers')!r}"
        )
    mixer_layers = merged.get("mixer_layers") or {}
    if not isinstance(mixer_layers, dict) or not all(
        isinstance(v, list) and v and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in v)
        for v in mixer_layers.values()
    ):
        raise ValueError(
            f"preset {preset!r}: task {task!r}: mixer_layers maps a mixer to its depths, e.g. "
            f"{{mlstm_exp+slstm: [2]}}; got {mixer_layers!r}"
        )
    mixer_options = merged.get("mixer_options") or {}
    if not isinstance(mixer_options, dict) or not all(isinstance(v, dict) or v is None for v in mixer_options.values()):
        raise ValueError(
            f"preset {preset!r}: task {task!r}: mixer_options maps a mixer to its options, e.g. "
            f"{{slstm: {{num_heads: 1}}}}; got {mixer_options!r}"
        )
    mixers = [str(m) for m in merged["mixers"]]
    mixer_options = {k: dict(v or {}) for k, v in mixer_options.items()}
    if every_mixer:
        mixer_options = {m: {**mixer_options.get(m, {}), **every_mixer} for m in mixers}
    mixer_options = _typed_mixer_options(mixers, mixer_options)
    shared = {k: merged[k] for k in ModelShape.field_names() if k in merged and k not in GRID_FIELDS}
    try:
        model = ModelShape(**typed_options(shared, dataclass_types(ModelShape), "model"))
    except ValueError as err:
        raise ValueError(f"preset {preset!r}: task {task!r}: {err}") from None
    return SweepPlan(
        task=real_task,
        preset=preset,
        entry=task,
        mixers=mixers,
        seeds=[int(s) for s in merged["seeds"]],
        lrs=[float(x) for x in merged["lrs"]],
        train=TrainConfig(**train),
        task_options=task_options,
        mixer_options=mixer_options,
        model=model,
        extrapolation=extrapolation or merged.get("extrapolation"),
        description=data.get("description", ""),
        priority=priority,
        layers=list(dict.fromkeys(layers)),
        mixer_layers={str(k): list(dict.fromkeys(v)) for k, v in mixer_layers.items()},
    )


def build_specs(plan: SweepPlan, device: str = "auto") -> list[TrialSpec]:
    """The grid of ``plan``: one ``TrialSpec`` per (mixer, layers, seed, lr), in that nesting order (a
    mixer's depths: ``plan.mixer_layers`` where it has them, else ``plan.layers``)."""
    return [
        TrialSpec(
            task=plan.task,
            lr=lr,
            seed=seed,
            model=plan.shape(mixer, layers),
            task_options=plan.task_options,
            extrapolation=plan.extrapolation,
            train=plan.train,
            device=device,
        )
        for mixer in plan.mixers
        for layers in plan.depths(mixer)
        for seed in plan.seeds
        for lr in plan.lrs
    ]
