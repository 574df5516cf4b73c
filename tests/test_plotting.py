"""The package's figures: many panels wrap to page width, PNGs are palette images that keep the picture."""

import numpy as np
import pytest
from PIL import Image

from kpca_attention.plotting import (
    PAGE_WIDTH,
    bar_style,
    new_figure,
    panel_grid,
    row_starts,
    save_figure,
    series_style,
)


@pytest.mark.parametrize("n,rows", [(1, 1), (4, 1), (5, 1), (6, 2), (15, 3)])
def test_panel_grid_wraps_rows_at_page_width(n, rows):
    fig, axes = panel_grid(n, panel=(3.0, 4.0))
    assert len(axes) == n and len(fig.axes) == n  # the unused cells of the last row are removed
    w, h = fig.get_size_inches()
    assert w <= PAGE_WIDTH and h == pytest.approx(4.0 * rows)
    assert len(row_starts(axes)) == rows
    assert all(ax.get_subplotspec().colspan.start == 0 for ax in row_starts(axes))


def test_panel_grid_wide_panels_get_one_per_row_and_no_panels_is_an_error():
    fig, axes = panel_grid(3, panel=(20.0, 3.0))
    assert fig.get_size_inches()[0] == 20.0 and len(row_starts(axes)) == 3
    with pytest.raises(ValueError, match="at least one panel"):
        panel_grid(0)


def test_png_is_a_palette_image_equal_to_the_render_where_colours_are_flat(tmp_path):
    fig, ax = new_figure(figsize=(4, 3))
    rng = np.random.default_rng(0)
    for i in range(8):
        ax.plot(rng.normal(size=50).cumsum(), color=f"C{i}", label=f"line {i}")
    ax.bar(range(8), rng.uniform(1, 5, 8), color=[f"C{i}" for i in range(8)], alpha=0.5)
    ax.legend(fontsize=6)
    ax.set_title("eight colours and their blends")
    png = save_figure(fig, tmp_path / "p.png", dpi=100)
    with Image.open(png) as im:
        assert im.mode == "P" and im.size == (400, 300)
        got = np.asarray(im.convert("RGB"), dtype=int)
    ref_path = tmp_path / "ref.png"
    fig.savefig(ref_path, dpi=100)  # matplotlib's own full-colour render of the same figure
    with Image.open(ref_path) as im:
        ref = np.asarray(im.convert("RGB"), dtype=int)
    err = np.abs(got - ref).max(axis=2)
    assert np.mean(err == 0) > 0.85  # flat colours (background, bars, lines) come back exactly
    assert np.percentile(err, 99) <= 24  # anti-aliased edges within a few levels


def test_series_styles_of_a_twelve_line_legend_are_all_different():
    styles = [tuple(sorted(series_style(i).items())) for i in range(30)]
    assert len(set(styles)) == 30
    assert series_style(10)["color"] == series_style(0)["color"]  # the colour repeats, the marker does not
    assert series_style(10)["marker"] != series_style(0)["marker"]


def test_bar_styles_of_a_twelve_bar_chart_are_all_different():
    styles = [tuple(sorted(bar_style(i).items())) for i in range(40)]
    assert len(set(styles)) == 40
    assert bar_style(10)["color"] == bar_style(0)["color"] and bar_style(10)["hatch"] != bar_style(0)["hatch"]


def test_bars_start_at_zero_and_say_their_means() -> None:
    # an axis cut just below the bars made a 2-point gap look like a doubling (user-journey review)
    from kpca_attention.tasks.base import bar_plot

    fig, ax = new_figure()
    bar_plot(ax, {"a": [88.0, 89.0], "b": [90.0]}, ["a", "b"], {"a": "A", "b": "B"}, rotation=0)
    assert ax.get_ylim()[0] == 0
    assert [t.get_text() for t in ax.texts] == ["88.5", "90.0"]
