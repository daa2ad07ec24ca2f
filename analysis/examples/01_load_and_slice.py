"""Load a results file and slice it like any xarray Dataset.

Run: python analysis/examples/01_load_and_slice.py  (uses datasets/c1_limit.nc)
"""
import sfxlin

print("available results:", sfxlin.open_results())
ds = sfxlin.open_results("c1_limit")
print(ds.sfx)  # what the file is and where it came from

# label-based selection: Gaussian tokens, d = 5, every U_norm, averaged over seeds
err = ds.mse.sel(law="gaussian", d=5).mean("seed")
print(err.to_pandas().T.to_string(float_format="{:.3e}".format))

# position-based selection: the largest prompt length, every law
print(ds.mse.isel(L=-1).mean(["seed", "d", "U_norm"]).to_pandas())

# the sharp constant: measured / predicted error at the largest L
print((ds.mse.sel(law="gaussian") / ds.mse_asymptotic).isel(L=-1).mean("seed").round(3).to_pandas())
