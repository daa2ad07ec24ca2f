"""The C1 family's analysis (c1_limit, c1_kernels, c1_own, c1_real): what its experiments share.

Every C1 experiment measures an error to an exact limit along the prompt length and reads its
log-log slope in L on the mean over independent units (seeds, queries, prompts): the prompts are
nested along L (the prompt of length 2L extends that of length L), so a unit's errors at
different L share draws, and the SE of the slope is cluster-robust over the units
(:func:`~.fits.unit_slopes`). With one unit there is no spread to read: the plain OLS fit of its curve,
whose table says so (:func:`se_note`).
"""
from __future__ import annotations

import xarray as xr

__all__ = ["se_note"]


def se_note(fit: xr.Dataset) -> str:
    """How a fit's SE was taken, for a table title: ``"SE cluster-robust over 4 units (seed)"``, or
    ``"SE nonrobust OLS, 1 unit (seed)"``."""
    units, n = str(fit.units.item()).replace(",", " x "), int(fit.n_units)
    kind = "cluster-robust over" if fit.cov_type.item() == "cluster" else f"{fit.cov_type.item()} OLS,"
    return f"SE {kind} {n} unit{'s' if n != 1 else ''} ({units})"
