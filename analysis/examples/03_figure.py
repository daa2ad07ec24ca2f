"""Draw a figure: the experiment's standard one, and a custom one with matplotlib.

Run: python analysis/examples/03_figure.py [OUT_DIR]
"""
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import sfxlin  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
out.mkdir(parents=True, exist_ok=True)
ds = sfxlin.open_results("c1_limit")
print("standard figure:", ds.sfx.figure(out / "c1_standard.png"))

fig, ax = plt.subplots(figsize=(5, 4))
for law in ds.law.values:
    (ds.mse.sel(law=law, d=2, U_norm=0.5).mean("seed")).plot(ax=ax, xscale="log", yscale="log", marker="o", label=law)
ax.set_title("d = 2, ||U||_F = 0.5")
ax.legend()
fig.savefig(out / "c1_laws.png", dpi=100)
print("custom figure:", out / "c1_laws.png")
