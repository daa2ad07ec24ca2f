"""Fit log-log slopes with standard errors (statsmodels OLS) through the ``.sfx`` accessor.

Run: python analysis/examples/02_fit_slopes.py
"""
import sfxlin

ds = sfxlin.open_results("c1_limit")
fit = ds.mse.sel(law="gaussian").mean("seed").sfx.loglog_slope("L", cov_type="HC3", test_exponent=-1.0)
print(fit[["slope", "slope_se", "slope_ci_low", "slope_ci_high", "t_test_pvalue"]].to_dataframe().round(4))
print("settings of the fit travel with it:", fit.cov_type.item(), fit.method.item())

# the non-Gaussian tokens plateau: their error stops falling
plateau = ds.mse.sel(law="rademacher", d=2, U_norm=0.5).mean("seed")
print("rademacher, d=2, |U|=0.5, last four L:", plateau.isel(L=slice(-4, None)).values)
print(ds.sfx.verdict_table())

# the fit tables of `sfxlin run` are data too: one labelled xr.Dataset per table
table = ds.sfx.fit_tables()["slopes"]
print(table.attrs["title"])
print(table[["slope", "slope_se", "sharp_ratio"]].to_dataframe().round(3))
