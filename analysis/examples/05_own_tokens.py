"""Bring your own tokens: the infinite-prompt limit of softmax attention on your embeddings.

Your tokens are an (n, D) array, saved as .npy or as a variable of a netCDF file. Here they are
stand-ins (the wine data set bundled with scikit-learn, standardised and whitened to D = 3), but
any file of that shape works the same way, e.g. `sfxlin run c1 --set tokens=emb.npy --set d=3`.
Run: python analysis/examples/05_own_tokens.py [OUT_DIR]
"""
import sys
from pathlib import Path

import numpy as np

from sfxlin.attention import asymptotic_mse, softmax_attention
from sfxlin.engine.execution import compute
from sfxlin.laws import Empirical, Gaussian
from sfxlin.pipelines import c1_limit
from sfxlin.realdata import token_set
from sfxlin.engine.storage import save
from sfxlin.engine.sweep import build


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
    out.mkdir(parents=True, exist_ok=True)
    tokens = out / "my_tokens.npy"
    np.save(tokens, token_set("wine", 3))  # your embeddings go here

    # 1. the law of your tokens, its exact limit, and the Gaussian picture (Lemma 2.1)
    mu = Empirical(str(tokens))
    rng = np.random.default_rng(0)
    U = 0.5 * rng.standard_normal((3, 3)) / 3
    q = mu.sample(rng, 4)  # four of your tokens as queries
    exact = mu.tilted_mean(q @ U.T)  # a softmax-weighted average over all n tokens
    gaussian = Gaussian(mu.mean, mu.cov).tilted_mean(q @ U.T)
    print(f"{mu}: ||exact limit - Gaussian picture|| per query: {np.linalg.norm(exact - gaussian, axis=1).round(4)}")

    # 2. softmax attention over L of your tokens approaches the exact limit like tr C / L
    for L in (64, 1024):
        f_L = softmax_attention(mu.sample(rng, (200, L)), U, np.eye(3), q[0])
        mse = np.mean(np.sum((f_L - exact[0]) ** 2, axis=-1))
        print(f"L = {L:5d}: mse = {mse:.3e}, predicted tr C / L = {asymptotic_mse(mu, U, np.eye(3), q[0], L):.3e}")

    # 3. the C1 experiment with your tokens as one more law (their sha256 goes into the file)
    config = c1_limit.EXPERIMENT.configure("quick", [f"tokens={tokens}", "d=3", "U_norm=0.1,0.3", "n_seeds=1",
                                                     "laws=gaussian,uniform"])
    ds, wall, label = compute(build(c1_limit.EXPERIMENT, config), scheduler="synchronous", progress=False)
    path = save(ds, out / "c1_own_tokens.nc")
    print(f"saved {path} ({wall:.1f} s); tokens file recorded as {ds.attrs['input_files']}")
    print("exact squared bias of your tokens' limit to the Gaussian one:",
          ds.bias_exact.sel(law="empirical").mean("seed").round(6).values)
    print(ds.sfx.verdict_table())


if __name__ == "__main__":
    main()
