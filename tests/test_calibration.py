"""sfxlin.testing.calibration: the z-score checks that an SE follows the design, against simulated z's of
a known distribution and the binomial and chi-square laws computed independently."""
import numpy as np
import pytest
from scipy import stats

from sfxlin.testing.calibration import assert_se_follows_design, z_calibration


def test_the_bands_and_pass_probability_are_the_binomial_and_chi_square_quantiles():
    c = z_calibration(np.random.default_rng(1).standard_normal(200))
    low, high = c["band"]
    assert low + high == 200
    assert stats.binom.cdf(low - 1, 200, 0.5) <= 0.001 < stats.binom.cdf(low, 200, 0.5)
    inside = sum(stats.binom.pmf(k, 200, 0.5) for k in range(low, high + 1))
    assert c["p_pass"] == pytest.approx(1 - 2 * (1 - inside) - 0.002, abs=1e-12)
    assert c["z2_band"] == pytest.approx(tuple(stats.chi2.ppf([0.001, 0.999], 200) / 200), rel=1e-12)
    t = z_calibration(np.random.default_rng(1).standard_normal(200), 7)
    assert "mean_z2" not in t and t["p_pass"] == pytest.approx(1 - 2 * (1 - inside), abs=1e-12)


def test_a_right_se_passes_at_least_as_often_as_stated():
    """1000 sets of K = 60 z's, normal and Student-t with 3 dof: the pass rate is at least p_pass less
    4 binomial SDs of the rate (about 0.009)."""
    rng = np.random.default_rng(2)
    for dof, draw in ((None, lambda: rng.standard_normal(60)), (3, lambda: rng.standard_t(3, 60))):
        runs = [z_calibration(draw(), dof) for _ in range(1000)]
        rate, p = np.mean([r["ok"] for r in runs]), runs[0]["p_pass"]
        assert rate >= p - 4 * np.sqrt(p * (1 - p) / 1000), (dof, rate, p)


@pytest.mark.parametrize("factor", [0.5, 2.0])
@pytest.mark.parametrize("dof", [None, 5])
def test_an_se_wrong_by_a_factor_2_fails(factor, dof):
    """z / factor: the SE factor times the right one (too large at 2, too small at 0.5), K = 200."""
    rng = np.random.default_rng(3)
    z = rng.standard_normal(200) if dof is None else rng.standard_t(dof, 200)
    assert z_calibration(z, dof)["ok"]
    assert not z_calibration(z / factor, dof)["ok"]
    with pytest.raises(AssertionError, match="z inside the central 50%"):
        assert_se_follows_design(z / factor, dof, "broken")


def test_a_shifted_centre_fails_by_the_signs_and_only_normal_z_read_the_variance():
    z = np.random.default_rng(4).standard_t(4, 400)
    shifted = z_calibration(z + 0.5, 4)
    assert shifted["positive"] > shifted["band"][1] and not shifted["ok"]
    wide = z_calibration(np.random.default_rng(5).standard_normal(1000) * 1.15)   # an SE 13% too small
    assert wide["mean_z2"] > wide["z2_band"][1] and not wide["ok"]
    assert "mean_z2" not in z_calibration(np.random.default_rng(5).standard_normal(1000) * 1.15, 1000)


def test_bad_z_are_refused():
    with pytest.raises(ValueError, match="at least 20"):
        z_calibration(np.zeros(19))
    with pytest.raises(ValueError, match="1 of 30 z-scores are not finite"):
        z_calibration(np.r_[np.ones(29), np.inf])
