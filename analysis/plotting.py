"""Figure style and output shared by the analysis CLIs.

Every figure is written three times beside each other: ``<stem>.png`` (for the README),
``<stem>.pdf`` (for papers) and ``<stem>.csv`` (every plotted number, long form).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

log = logging.getLogger("analysis.plotting")

#: seaborn's colour-blind-safe qualitative palette; sequential data use viridis-like maps
PALETTE = "colorblind"
SEQUENTIAL = "viridis"


#: line markers, distinct shapes; with the palette's 10 colours a pair (colour, marker) per name
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "*", "d")


def name_styles(names: Iterable[str]) -> tuple[dict[str, tuple], dict[str, str]]:
    """A colour of ``PALETTE`` and a marker per name, in order: name ``i`` gets colour ``i % 10`` and
    marker ``i % 13``, so no two of up to 130 names share both (seaborn's own choice turns to a hue
    ramp past the palette's 10 colours and repeats markers)."""
    import seaborn as sns

    colours = sns.color_palette(PALETTE)
    names = list(dict.fromkeys(names))
    return (
        {n: colours[i % len(colours)] for i, n in enumerate(names)},
        {n: MARKERS[i % len(MARKERS)] for i, n in enumerate(names)},
    )


def setup_style() -> None:
    """Non-interactive backend, seaborn's whitegrid theme, colour-blind palette, readable fonts."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(
        context="paper",
        style="whitegrid",
        palette=PALETTE,
        font_scale=1.1,
        rc={"figure.dpi": 110, "savefig.dpi": 120, "savefig.bbox": "tight", "pdf.fonttype": 42},
    )


def as_categories(df: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """Cast ``columns`` to ordered categoricals in order of first appearance (seaborn keeps that order)."""
    out = df.copy()
    for col in columns:
        if col in out:
            out[col] = pd.Categorical(
                out[col].astype(str), categories=list(dict.fromkeys(out[col].astype(str))), ordered=True
            )
    return out


def mixer_lines(data: pd.DataFrame, x: str, panel: str, **kwargs):
    """``seaborn.relplot`` of ``value`` against ``x``, one line per ``mixer`` (its colour and marker from
    ``name_styles``), one panel per ``panel`` value (at most 3 across, a shared y axis, each panel its own
    x ticks); ``data``'s ``mixer`` and ``panel`` columns categorical (``as_categories``). ``kwargs`` go to
    ``relplot`` (``aspect``, ``errorbar`` ...). Returns the ``FacetGrid``."""
    import seaborn as sns

    colours, markers = name_styles(data["mixer"].cat.categories)
    return sns.relplot(
        data=data,
        x=x,
        y="value",
        hue="mixer",
        style="mixer",
        palette=colours,
        markers=markers,
        dashes=False,
        col=panel,
        col_wrap=min(3, len(data[panel].cat.categories)),
        kind="line",
        height=2.8,
        facet_kws={"sharey": True, "sharex": False},
        **kwargs,
    )


def save_figure(fig, stem: str | Path, data: pd.DataFrame, dpi: int | None = None) -> list[Path]:
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` and ``data`` as ``<stem>.csv``; close ``fig``.

    Returns the three paths. Parent folders are created. Floats in the CSV keep 7 significant digits.
    """
    import matplotlib.pyplot as plt

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_name(stem.name + ext) for ext in (".png", ".pdf", ".csv")]
    data.to_csv(paths[2], index=False, float_format="%.7g")  # the numbers first: they survive a plotting error
    fig.savefig(paths[0], dpi=dpi)
    fig.savefig(paths[1])
    plt.close(fig)
    log.info("wrote %s (.png, .pdf, .csv)", stem)
    return paths
