"""Whether a reported standard error follows the design: z-scores of estimates against exact values.

An experiment's analysis reports an estimate with its SE (a seed-mean ratio, a cluster-robust slope, a
Monte Carlo mean, a binomial count). When the estimate's exact value is known, ``z = (estimate - exact)
/ SE`` over ``K`` independent replicates is distributed as Student-t with the SE's degrees of freedom
(normal for a large sample) if, and only if, the SE measures the spread the design gives: too small an
SE (units that are not independent, a missing cluster) widens the z's, too large an SE narrows them.

:func:`z_calibration` checks the spread by the share of ``|z|`` inside the t distribution's central 50%
interval (``|z| <= t_{0.75}``): a right SE puts each z inside with probability 1/2, so their count is
Binomial(K, 1/2) whatever the tails, and the check's pass probability is exact; it also checks the centre
by the signs (Binomial(K, 1/2) positive). Each band holds the central ``1 - alpha`` of its binomial. An SE
wrong by a factor 2 moves the inside share to 0.26 (SE too small) or 0.82 (too large) for normal z:
outside the band from K = 60 on; a factor 1.5 (0.35 or 0.69) from K = 200 on. For normal z (an SE of
many degrees of freedom: ``dof=None``) it also checks the variance, far more sensitive: ``sum z^2`` is
chi-square with K degrees of freedom, and the mean of ``z^2`` must lie in the central ``1 - alpha`` of
``chi2(K) / K`` (an SE 15% too small gives 1.32: outside from K of about 500 on). A right SE passes every
check with probability at least ``1 - alpha`` times the number of checks (``p_pass``, computed from the
bands: the union bound).
"""
from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = ["z_calibration", "assert_se_follows_design"]


def _band(K: int, alpha: float) -> tuple[int, int, float]:
    """``(low, high, P(low <= X <= high))`` for ``X ~ Binomial(K, 1/2)``: the central ``1 - alpha``."""
    low = int(stats.binom.ppf(alpha / 2, K, 0.5))
    high = K - low
    return low, high, float(stats.binom.cdf(high, K, 0.5) - stats.binom.cdf(low - 1, K, 0.5))


def z_calibration(z, dof=None, *, alpha: float = 0.002) -> dict:
    """The 50% coverage and sign checks of the z-scores ``z`` (independent replicates), each a Student-t
    with ``dof`` degrees of freedom (scalar or one per z; None: normal) when the SE is right.

    Returns ``K``, ``inside`` (z's with ``|z| <= t_{0.75, dof}``), ``positive``, the band ``(low, high)``
    both counts must lie in, with normal z ``mean_z2`` and its band ``z2_band``, ``p_pass`` (a lower bound
    of the probability that a right SE passes every check: one minus the sum of the bands' outside
    probabilities), ``share`` (inside / K) and ``ok``. ValueError for fewer than 20 z's or a z that is not
    finite (an SE of 0 or NaN is a failure to report, not a z)."""
    z = np.asarray(z, dtype=float).ravel()
    if z.size < 20:
        raise ValueError(f"z: a calibration check needs at least 20 independent z-scores, got {z.size}")
    if not np.all(np.isfinite(z)):
        raise ValueError(f"z: {int(np.sum(~np.isfinite(z)))} of {z.size} z-scores are not finite")
    q = stats.norm.ppf(0.75) if dof is None else stats.t.ppf(0.75, np.broadcast_to(dof, z.shape))
    K = z.size
    inside, positive = int(np.sum(np.abs(z) <= q)), int(np.sum(z > 0))
    low, high, p_band = _band(K, alpha)
    out = {"K": K, "inside": inside, "positive": positive, "band": (low, high), "share": inside / K,
           "p_pass": 1.0 - 2.0 * (1.0 - p_band), "ok": low <= inside <= high and low <= positive <= high}
    if dof is None:
        z2_band = tuple(float(v) for v in stats.chi2.ppf([alpha / 2, 1 - alpha / 2], K) / K)
        mean_z2 = float(np.mean(z**2))
        out.update(mean_z2=mean_z2, z2_band=z2_band, p_pass=out["p_pass"] - alpha,
                   ok=out["ok"] and z2_band[0] <= mean_z2 <= z2_band[1])
    return out


def assert_se_follows_design(z, dof=None, what: str = "", *, alpha: float = 0.002) -> dict:
    """:func:`z_calibration`, asserted, with a line saying what was checked (printed: ``pytest -s``)."""
    c = z_calibration(z, dof, alpha=alpha)
    variance = (f", mean z^2 {c['mean_z2']:.3f} (band {c['z2_band'][0]:.3f}..{c['z2_band'][1]:.3f})"
                if "mean_z2" in c else "")
    line = (f"{what}: {c['inside']}/{c['K']} z inside the central 50% (band {c['band'][0]}..{c['band'][1]}), "
            f"{c['positive']} positive{variance}; a right SE passes with probability >= {c['p_pass']:.4f}")
    print(line)
    assert c["ok"], line
    return c
