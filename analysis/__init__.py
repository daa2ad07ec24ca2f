"""sfxlin.analysis: fits, verdicts and figures that read results files only.

The fits are re-exported here (``sfxlin.analysis.loglog_slope``,
``sfxlin.analysis.threshold_regression``, ...), loaded on first use so that ``import sfxlin``
does not import statsmodels.
"""
import importlib

_LAZY = {
    "loglog_slope": "fits", "power_law_fit": "fits", "paper_form_fit": "fits",
    "threshold_regression": "threshold", "ThresholdFit": "threshold",
    "evaluate": "verdicts", "format_table": "verdicts", "Criterion": "verdicts",
    "build_report": "report", "write_report": "report",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
