"""Per-head pattern reports: every analysis of the toolkit on one model, in one self-contained folder.

`build_report(model, out_dir)` is `compute` (every analysis into a `ReportData`, `.pipeline`) then
`render` (the files, `.build`); `head_metrics`, `mean_patterns`, `offset_profiles` and `select_heads`
(`.metrics`) are the analysis library the notebooks use, with the figures `plot_pattern`, `plot_offsets` and
`plot_ci_bars` (`.plots`); `highlights` (`.findings`) is the findings
table. The page and summary: `.html`; figures: `.plots`; formats and glossary: `.format`; viewer: `interp.viewer`.
"""
from interp.analyses.report.build import (
    MARKER,
    RENDER_STAGES,
    OutputDirError,
    build_report,
    check_out_dir,
    is_report_dir,
    render,
)
from interp.analyses.report.context import (
    default_prompt_spec,
    model_name,
    model_prompt_spec,
    model_summary,
    prompt_warnings,
)
from interp.analyses.report.findings import highlights
from interp.analyses.report.methods import NO_LOSS_EVIDENCE, behaviour_method
from interp.analyses.report.metrics import head_metrics, mean_patterns, offset_profiles, select_heads
from interp.analyses.report.pipeline import (
    DEFAULT_N,
    LEAKAGE_LEN,
    MAX_CARDS,
    ReportData,
    ReportResult,
    ReportTooLarge,
    check_cards_before_loading,
    compute,
    heads_before_loading,
    report_behaviour,
)
from interp.analyses.report.plots import plot_ci_bars, plot_offsets, plot_pattern

__all__ = [
    "DEFAULT_N", "LEAKAGE_LEN", "MARKER", "MAX_CARDS", "NO_LOSS_EVIDENCE", "RENDER_STAGES", "OutputDirError",
    "ReportData", "ReportResult", "ReportTooLarge", "behaviour_method", "build_report", "check_cards_before_loading",
    "check_out_dir", "compute", "default_prompt_spec", "head_metrics", "heads_before_loading", "highlights",
    "is_report_dir", "mean_patterns", "model_name", "model_prompt_spec", "model_summary", "offset_profiles",
    "plot_ci_bars", "plot_offsets", "plot_pattern", "prompt_warnings", "render", "report_behaviour", "select_heads",
]
