"""The soak campaign's timeline as a picture: retries, replays, UNKNOWN outcomes and reboots along the
run (``idemlink soak --plot FILE.png``).

Contract: ``check_plot_path(path)`` raises ``PlotUnavailable`` (a one-line reason) when the plot
could not be written — matplotlib missing (``PLOT_NEEDS_MATPLOTLIB`` says what to install; it is in
the ``bench`` extra), a format matplotlib does not know from the file's extension, or no such
directory — so the CLI refuses before running the campaign. ``plot_timeline(points, path,
caption)`` writes four stacked panels of running counts against the commands run (reboots also as
faint red lines across every panel), the caption (the campaign's conditions) under the title.
matplotlib is imported only here, lazily, with its non-interactive Agg canvas (no display, no
pyplot state).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from idemlink.campaign import TimelinePoint
from idemlink.protocol.outcome import IdemlinkError

#: (TimelinePoint field, panel label)
PANELS = (("retries", "retries"), ("replays", "replayed answers"), ("unknown", "UNKNOWN outcomes"),
          ("reboots", "device reboots"))


PLOT_NEEDS_MATPLOTLIB = ("--plot needs matplotlib: pip install matplotlib (in a checkout: "
                         "pip install -e '.[bench]')")
"""What to install: right for an installed package and for a checkout alike."""


class PlotUnavailable(IdemlinkError):
    """The plot cannot be written (one line: why)."""


def _figure_class() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(PLOT_NEEDS_MATPLOTLIB) from None
    return Figure, FigureCanvasAgg


def check_plot_path(path: str | Path) -> Path:
    """The path to write, or ``PlotUnavailable`` before any work is done."""
    figure, canvas = _figure_class()
    p = Path(path)
    formats = canvas(figure()).get_supported_filetypes()
    ext = p.suffix.lower().lstrip(".")
    if ext not in formats:
        raise PlotUnavailable(f"cannot plot to {p}: the extension must be one of "
                              f"{', '.join('.' + f for f in sorted(formats))}")
    if not p.parent.is_dir():
        raise PlotUnavailable(f"cannot plot to {p}: no such directory {p.parent}")
    return p


def plot_timeline(points: Sequence[TimelinePoint], path: str | Path, caption: str) -> Path:
    """Write the timeline of ``points`` to ``path``; returns the path."""
    p = check_plot_path(path)
    figure, canvas = _figure_class()
    fig = figure(figsize=(8, 8), layout="constrained")
    canvas(fig)
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    xs = [pt.commands for pt in points]
    reboots = [b.commands for a, b in pairwise(points) if b.reboots > a.reboots]
    for ax, (name, label) in zip(axes, PANELS, strict=True):
        for x in reboots:  # every panel: what happened around each reboot
            ax.axvline(x, color="tab:red", alpha=0.25, linewidth=0.8)
        ys = [getattr(pt, name) for pt in points]
        ax.step(xs, ys, where="post")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.text(0.01, 0.92, f"{ys[-1] if ys else 0} in all", transform=ax.transAxes, va="top")
    axes[-1].set_xlabel("commands run")
    fig.suptitle("idemlink soak: running counts along the campaign\n" + caption, fontsize=10)
    try:
        fig.savefig(p)
    except OSError as exc:
        raise PlotUnavailable(f"cannot write {p}: {exc.strerror or exc}") from None
    return p
