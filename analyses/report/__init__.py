"""Per-head pattern reports: every analysis of the toolkit on one model, in one self-contained folder.

`build_report(model, out_dir)` is `compute` (every analysis into a `ReportData`, `.pipeline`) then
`render` (the files, `.build`); `head_metrics`, `mean_patterns`, `offset_profiles` and `select_heads`
(`.metrics`) are the analysis library the notebooks use, with the figures `plot_pattern`, `plot_offsets` and
`plot_ci_bars` (`.plots`); `highlights` (`.findings`) is the findings
table. The page and summary: `.html`; figures: `.plots`; formats and glossary: `.format`; viewer: `interp.viewer`.
"""
from interp.analyses.report.build import OutputDirError, build_report, render
from interp.analyses.report.findings import highlights
from interp.analyses.report.metrics import head_metrics, mean_patterns, offset_profiles, select_heads
from interp.analyses.report.pipeline import ReportData, ReportResult, ReportTooLarge, compute
from interp.analyses.report.plots import plot_ci_bars, plot_offsets, plot_pattern

# what a user calls: the report in one call or in its two stages, the analysis library and its figures
__all__ = [
    "build_report",
    "compute",
    "render",
    "ReportData",
    "ReportResult",
    "OutputDirError",
    "ReportTooLarge",
    "head_metrics",
    "mean_patterns",
    "offset_profiles",
    "select_heads",
    "plot_pattern",
    "plot_offsets",
    "plot_ci_bars",
    "highlights",
]

# importable from here too, but no part of the surface (`name as name`: an explicit re-export): the limits and the
# helpers the command line uses
from interp.analyses.report.build import MARKER as MARKER
from interp.analyses.report.build import RENDER_STAGES as RENDER_STAGES
from interp.analyses.report.build import check_out_dir as check_out_dir
from interp.analyses.report.build import is_report_dir as is_report_dir
from interp.analyses.report.context import default_prompt_spec as default_prompt_spec
from interp.analyses.report.context import model_name as model_name
from interp.analyses.report.context import model_prompt_spec as model_prompt_spec
from interp.analyses.report.context import model_summary as model_summary
from interp.analyses.report.context import prompt_warnings as prompt_warnings
from interp.analyses.report.methods import NO_LOSS_EVIDENCE as NO_LOSS_EVIDENCE
from interp.analyses.report.methods import behaviour_method as behaviour_method
from interp.analyses.report.pipeline import DEFAULT_N as DEFAULT_N
from interp.analyses.report.pipeline import LEAKAGE_LEN as LEAKAGE_LEN
from interp.analyses.report.pipeline import MAX_CARDS as MAX_CARDS
from interp.analyses.report.pipeline import check_cards_before_loading as check_cards_before_loading
from interp.analyses.report.pipeline import heads_before_loading as heads_before_loading
from interp.analyses.report.pipeline import report_behaviour as report_behaviour
