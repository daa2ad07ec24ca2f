"""Bring your own head: how far is softmax attention from its limit at your prompt length?

Builds a small head in projection form (W_Q, W_K, W_V of shape (d_head, D), as PyTorch's
nn.Linear stores them) and a token file that is a sequence (a Gaussian AR(1) series standing in
for your embeddings in document order), saves them as .npy, and runs the experiment c1_own on
them: i.i.d. prompts and contiguous windows, the error to the tokens' own exact limit, its slope
and constant, and L*(eps). The same run from the shell:

    sfxlin run c1_own --set tokens=tokens.npy --set W_Q=wq.npy --set W_K=wk.npy --set W_V=wv.npy \\
        --set logit_scale='1/sqrt(d_head)' --set sampling=iid,window

Run: python analysis/examples/06_own_head.py [OUT_DIR]
"""
import sys
from pathlib import Path

import numpy as np

from sfxlin.engine.execution import compute
from sfxlin.engine.storage import save
from sfxlin.engine.sweep import build
from sfxlin.pipelines import c1_own


def ar1_tokens(n, D, rho, rng):
    """z_k = rho z_{k-1} + sqrt(1 - rho^2) eps_k: stationary N(0, I_D), correlated along the file."""
    from scipy.signal import lfilter

    eps = rng.standard_normal((n, D))
    eps[1:] *= np.sqrt(1 - rho**2)  # z_0 = eps_0 ~ N(0, I): stationary from the start
    return lfilter([1.0], [1.0, -rho], eps, axis=0)


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    D, d_head = 3, 2
    files = {"tokens": ar1_tokens(20_000, D, 0.5, rng),  # your embeddings, one token per row, in order
             "W_Q": 0.6 * rng.standard_normal((d_head, D)), "W_K": 0.6 * rng.standard_normal((d_head, D)),
             "W_V": rng.standard_normal((d_head, D))}
    for name, array in files.items():
        np.save(out / f"{name}.npy", array)

    settings = [f"{name}={out / name}.npy" for name in files] + [
        "logit_scale=1/sqrt(d_head)", "sampling=iid,window", "L=32,64,128,256", "n_prompts=48", "prompt_chunk=16", "eps=0.3,0.2"]
    config = c1_own.EXPERIMENT.configure("quick", settings)  # every file is read and checked here
    ds, wall, _ = compute(build(c1_own.EXPERIMENT, config), scheduler="synchronous", progress=False)
    path = save(ds, out / "c1_own.nc")
    print(f"saved {path} ({wall:.1f} s); U_eff = W_K^T W_Q / sqrt(d_head):\n{ds.U_eff.values.round(3)}")
    print(f"weight ratio {float(ds.weight_ratio):.3f}; influence function's integrated autocorrelation along the "
          f"file tau = {float(ds.tau):.2f} +- {float(ds.tau_se):.2f}")
    print(ds.sfx.fit_table())
    print(ds.sfx.verdict_table())
    ds.sfx.figure(out / "c1_own.png")


if __name__ == "__main__":
    main()
