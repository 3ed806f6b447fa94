"""interp.analyses.report.plots.plot_ci_bars: bars at the means, the CIs as error bars, highlights and a threshold."""
import math

import numpy as np
import pytest

from interp.analyses.report import plot_ci_bars
from interp.errors import BadInput


def bars(ax):
    """The bars' container (matplotlib also lists the error bars' container)."""
    from matplotlib.container import BarContainer

    (container,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    return container


def error_segments(ax) -> list[tuple[float, float]]:
    """(bottom, top) of each bar's error bar, in bar order."""
    (segments,) = bars(ax).errorbar.lines[2]
    return [(round(float(s[0][1]), 9), round(float(s[1][1]), 9)) for s in segments.get_segments()]


def test_bars_stand_at_the_means_with_their_cis_as_error_bars():
    fig = plot_ci_bars(["L0H0", "L0H1", "L1H0"], [0.2, 0.5, 0.9], [0.1, 0.45, 0.7], [0.3, 0.6, 0.95],
                       threshold=0.5, title="induction", ylabel="mean weight", highlight={"L1H0"})
    (ax,) = fig.axes
    drawn = bars(ax).patches
    assert [round(bar.get_height(), 6) for bar in drawn] == [0.2, 0.5, 0.9]
    assert error_segments(ax) == [(0.1, 0.3), (0.45, 0.6), (0.7, 0.95)]
    red, blue = (0.768627, 0.305882, 0.321569), (0.298039, 0.447059, 0.690196)
    assert [tuple(round(c, 6) for c in bar.get_facecolor()[:3]) for bar in drawn] == [blue, blue, red]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["L0H0", "L0H1", "L1H0"]
    (line,) = ax.lines[-1:]
    assert list(line.get_ydata()) == [0.5, 0.5] and line.get_linestyle() == "--"
    assert ax.get_title() == "induction" and ax.get_ylabel() == "mean weight"


def test_a_missing_or_one_sided_bound_draws_no_bar_on_that_side():
    """NaN bounds (no CI for that bar) and a bound beyond the mean (a BCa interval can exclude it) draw nothing
    on that side, never a bar pointing the wrong way."""
    fig = plot_ci_bars(["a", "b", "c"], [1.0, 2.0, -1.0], [math.nan, 2.5, -1.5], [math.nan, 3.0, -0.5])
    assert error_segments(fig.axes[0]) == [(1.0, 1.0), (2.0, 3.0), (-1.5, -0.5)]


def test_draws_into_a_given_axis_and_crowded_labels_turn():
    from matplotlib.figure import Figure

    fig = Figure()
    left, right = fig.subplots(1, 2)
    labels = [f"L{l}H{h}" for l in range(2) for h in range(8)]
    values = np.linspace(0, 1, len(labels))
    assert plot_ci_bars(labels, values, values - 0.1, values + 0.1, right) is fig
    assert not left.containers and len(bars(right).patches) == 16
    assert {t.get_rotation() for t in right.get_xticklabels()} == {90.0}


def test_lengths_that_disagree_are_refused():
    with pytest.raises(BadInput, match=r"2 labels, 3 means, 3 lower and 3 upper bounds"):
        plot_ci_bars(["a", "b"], [1, 2, 3], [0, 1, 2], [2, 3, 4])
