"""What is concluded from a ``walk`` results file: the diffusion constant is the step variance."""
from sfxlin.analysis.verdicts import Criteria

CRITERIA = Criteria("W")


@CRITERIA("W-diffusion", "msd / scale^2, seed mean, every (scale, L)", "in", (0.7, 1.3), reference="1 exactly",
          reason="E (sum of L steps)^2 / L = scale^2; 200 walks give a relative SE of 0.1", profile="quick")
def _diffusion(ds):
    return ds.msd.mean("seed") / ds.scale**2


def fit_table(ds):
    ratio = (ds.msd.mean("seed") / ds.scale**2)
    return "msd / scale^2 by scale: " + ", ".join(f"{s:g}: {float(ratio.sel(scale=s).mean()):.3f}"
                                                 for s in ds.scale.values)


def figure(ds, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    for s in ds.scale.values:
        ax.plot(ds.L, ds.msd.sel(scale=s).mean("seed") / s**2, "o-", label=f"scale {s:g}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="L", ylabel="msd / scale^2")
    ax.legend()
    fig.savefig(path)
    plt.close(fig)
    return path
