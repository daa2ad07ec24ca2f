"""Fit log-log slopes with standard errors (statsmodels OLS) through the ``.sfx`` accessor.

The prompts are nested (the length-L prompt starts the longer ones), so the seed-mean error's
residuals along L are correlated: ``units="seed"`` fits the seed mean with an SE clustered over
the seeds (the default with units); ``cov_type="nonrobust"`` is the plain OLS SE, by name.

Run: python analysis/examples/02_fit_slopes.py
"""
import sfxlin

ds = sfxlin.open_results("c1_limit")
fit = ds.mse.sel(law="gaussian").sfx.loglog_slope("L", units="seed", test_exponent=-1.0)
print(fit[["slope", "slope_se", "slope_ci_low", "slope_ci_high", "t_test_pvalue"]].reset_coords(drop=True).to_dataframe().round(4))
print("settings of the fit travel with it:", fit.cov_type.item(), fit.units.item(), fit.n_units.item())
plain = ds.mse.sel(law="gaussian").sfx.loglog_slope("L", units="seed", cov_type="nonrobust")
print("cluster SE / plain OLS SE:", (fit.slope_se / plain.slope_se).round(2).values.ravel())

# the non-Gaussian tokens plateau: their error stops falling
plateau = ds.mse.sel(law="rademacher", d=2, U_norm=0.5).mean("seed")
print("rademacher, d=2, |U|=0.5, last four L:", plateau.isel(L=slice(-4, None)).values)
print(ds.sfx.verdict_table())

# the fit tables of `sfxlin run` are data too: one labelled xr.Dataset per table
table = ds.sfx.fit_tables()["slopes"]
print(table.attrs["title"])
print(table[["slope", "slope_se", "sharp_ratio"]].to_dataframe().round(3))
