"""Report helpers: matplotlib plots (PNG, Agg) and markdown tables shared by training and evaluation."""

from .plots import plot_grouped_bars, plot_lines, plot_training_curves
from .tables import fmt_num, fmt_pct, markdown_table

__all__ = ["plot_training_curves", "plot_grouped_bars", "plot_lines", "markdown_table", "fmt_pct", "fmt_num"]
