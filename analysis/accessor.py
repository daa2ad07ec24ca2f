"""``.sfx`` accessors: the fits, verdicts and figures of sfxlin, one attribute away in IPython.

    ds = sfxlin.open_results("c1_limit")
    ds.mse.sel(law="gaussian").mean("seed").sfx.loglog_slope("L")
    ds.sfx.verdicts()            # PASS / FAIL / INCONCLUSIVE / NOT JUDGED, robustness, class: a DataFrame
    ds.sfx.verdict_table()       # the same as text, with the file's calibration note
    ds.sfx.multiplicity()        # criteria judged, tests at a stated level, chance FAILs, Holm
    ds.sfx.fit_tables()          # {name: xr.Dataset}, the fit tables as data (ds.sfx.fit_table(): text)
    ds.sfx.figure("c1.png")

Registered when ``sfxlin`` is imported. Statsmodels and matplotlib load on first use only.
"""
from __future__ import annotations

import json

import xarray as xr

__all__ = ["SfxDataArrayAccessor", "SfxDatasetAccessor"]


@xr.register_dataarray_accessor("sfx")
class SfxDataArrayAccessor:
    """Fits of one variable along a dim (see :mod:`sfxlin.analysis.fits`)."""

    def __init__(self, da):
        self._da = da

    def loglog_slope(self, dim="L", **kwargs):
        """OLS slope of log(value) on log(coordinate ``dim``), with SE and CI, per other coordinate."""
        from .fits import loglog_slope

        return loglog_slope(self._da, dim, **kwargs)

    def power_law(self, dim="L", **kwargs):
        """Fit ``value = c * dim^p``: ``c``, ``p`` with standard errors."""
        from .fits import power_law_fit

        return power_law_fit(self._da, dim, **kwargs)


@xr.register_dataset_accessor("sfx")
class SfxDatasetAccessor:
    """The analysis of a results file: verdicts, fit table, figure, provenance."""

    def __init__(self, ds):
        self._ds = ds

    @property
    def experiment(self):
        return self._ds.attrs.get("experiment")

    @property
    def config(self) -> dict:
        """Every parameter the file was computed with."""
        return json.loads(self._ds.attrs.get("config", "{}"))

    @property
    def provenance(self) -> dict:
        keys = ("experiment", "profile", "created", "wall_seconds", "scheduler", "git_revision", "sfxlin_version")
        return {k: self._ds.attrs.get(k) for k in keys}

    def verdict_rows(self, resamples=None) -> list:
        """The verdicts of the predeclared criteria as :class:`~sfxlin.analysis.verdicts.VerdictRow` s,
        each with its robustness over ``resamples`` resamples of the file's independent units
        (default: :data:`~sfxlin.analysis.verdicts.RESAMPLES`; 0: none, much faster)."""
        from .report import verdicts

        return verdicts(self._ds, resamples=resamples)

    def verdicts(self, resamples=None):
        """The verdicts of the predeclared criteria as a DataFrame indexed by criterion id: claim,
        description, measured, threshold, reference, verdict, note, robustness (the fraction of
        resamples of the independent units giving the same verdict), fragile, and for a non-PASS
        verdict the class and reason its criterion declares (``class``, ``class_reason``). The
        text rendering is :meth:`verdict_table`; ``resamples`` as in :meth:`verdict_rows`."""
        from .verdicts import to_frame

        return to_frame(self.verdict_rows(resamples))

    def verdict_table(self, resamples=None) -> str:
        """The verdict table as text, with a note when the criteria are calibrated for another profile."""
        from .verdicts import calibration_note, format_table

        note = calibration_note(self._ds)
        return format_table(self.verdict_rows(resamples)) + (f"\n{note}" if note else "")

    def multiplicity(self) -> dict:
        """What judging many criteria at once means (:func:`~sfxlin.analysis.verdicts.multiplicity`):
        ``judged``, ``tests`` (criteria that are tests at a stated level), ``chance_fails`` (the FAILs
        chance alone gives among them), ``fails``, ``holm_fails`` and ``holm`` (Holm-adjusted
        p-values), plus ``line``, the sentence of :func:`~sfxlin.analysis.verdicts.multiplicity_line`.
        Computed without robustness (it does not depend on it)."""
        from .verdicts import multiplicity, multiplicity_line

        rows = self.verdict_rows(resamples=0)
        return {**multiplicity(rows), "line": multiplicity_line(rows)}

    def fit_tables(self) -> dict:
        """The fit tables as data: ``{name: xr.Dataset}`` (see :mod:`sfxlin.analysis.tables`)."""
        from .report import fit_tables

        return fit_tables(self._ds)

    def fit_table(self) -> str:
        """The fit tables as terminal text."""
        from .report import fit_table

        return fit_table(self._ds)

    def figure(self, path):
        """Draw the experiment's standard figure into ``path`` (a file name or a binary buffer)."""
        from .report import analysis_for

        return analysis_for(self._ds).figure(self._ds, path)

    def __repr__(self):
        p = self.provenance
        return (f"<sfx {p['experiment']} ({p['profile']} profile, {p['created']}, {p['wall_seconds']} s on "
                f"{p['scheduler']}): .verdicts() .verdict_table() .multiplicity() "
                ".fit_tables() .fit_table() .figure(path) .config .provenance>")
