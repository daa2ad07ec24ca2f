"""The C2 family's analysis (c2_concentration, c2_threshold): what its experiments share.

Both read exponents in L of a gradient gap along a training run, on the mean over independent
seeds whose draws are shared along L (nested prompts) and along t (one run): every slope's SE is
cluster-robust over the seeds (:func:`~.fits.unit_slopes`), the plain OLS SE by name, and a table
says which in one line of its notes (:func:`se_note`).
"""
from __future__ import annotations

__all__ = ["se_note"]


def se_note(G: int, what: str, why: str, *, line: str = "pooled line", ols: bool = True) -> str:
    """The line of a table's notes that says what its SEs are over ``G`` units ``what`` (``"seeds"``),
    and ``why`` they are clustered; ``ols``: and what its ``SE OLS`` column is (the plain OLS SE of
    the ``line``)."""
    if G >= 2:
        return (f"SE: cluster-robust over the {G} {what} ({why}), Student-t with {G - 1} dof"
                + (f"; SE OLS: the plain OLS SE of the {line}, which ignores that sharing" if ols else ""))
    return (f"SE: plain OLS of the one {what[:-1]}'s line (one unit: no cluster-robust SE; {why})"
            + ("; SE OLS: the same" if ols else ""))
