"""C1: softmax attention over i.i.d. tokens converges to the tilted-mean operator (Lemma 2.1), the C1 family's
reference variant. Main grid ``d x U_norm x seed``: every law of ``laws`` (covariance ``sigma^2 I_d``; ``ar1`` one
law per ``ar1_rho``; a ``tokens`` file's ``empirical``), each from its own substream, against the Gaussian limit
``sigma^2 U q``, and the ``sqrt(L)`` control; part ``quadrature``: the closed form against Gauss-Hermite
quadrature. The protocol: docs/protocols.md, "c1_limit"."""
from __future__ import annotations

import numpy as np

from sfxlin.attention import asymptotic_mse, softmax_attention
from sfxlin.engine import Cells, Out, Param, Profiles, Variable, substream
from sfxlin.laws import LAWS, Empirical, GaussianAR1
from sfxlin.quadrature import gaussian_tilted_mean_quadrature

from .families.c1 import C1, chunks, file_matrix, sq_errors

NAME = "c1_limit"


def _needs_gaussian(config):
    if "gaussian" not in config["laws"]:
        raise ValueError(f"laws: 'gaussian' is needed (the reference limit sigma^2 U q), got {list(config['laws'])}")


def _tokens_fit(config):
    """``tokens``: the file exists, holds finite (n, D) tokens, and D is every d of the grid."""
    if not config["tokens"]:
        return
    Z = file_matrix("tokens", config["tokens"], config.digests["tokens"], check=False)
    bad = [d for d in config["d"] if d != Z.shape[1]]
    if bad:
        raise ValueError(f"tokens: the file's tokens have dimension {Z.shape[1]} (shape {Z.shape}), but d = "
                         f"{list(config['d'])}; run with --set d={Z.shape[1]}")


def ar1_label(rho):
    """The law coordinate of the AR(1) law with coefficient ``rho``: ``"ar1:RHO"`` (the law's spec,
    ``RHO`` the float's shortest repr, so that it reads back exactly)."""
    return f"{GaussianAR1.name}:{float(rho)!r}"


def _law_specs(config):
    """``(label, name, options)`` of every law of ``config["laws"]``, ``ar1`` expanded over ``ar1_rho``."""
    for name in config["laws"]:
        if name == GaussianAR1.name:
            yield from ((ar1_label(rho), name, {"rho": rho}) for rho in config["ar1_rho"])
        else:
            yield name, name, ({"df": config["student_df"]} if name == "student_t" else {})


def law_names(config):
    """The law coordinate: the labels of ``config["laws"]`` (``ar1`` as ``"ar1:RHO"`` per ``ar1_rho``),
    then ``"empirical"`` when ``tokens`` names a file."""
    return [label for label, _, _ in _law_specs(config)] + ([Empirical.name] if config["tokens"] else [])


def token_laws(config, d):
    """The laws of ``config["laws"]`` on R^d by their labels, each with covariance sigma^2 I_d, then the
    token file's empirical law when ``config["tokens"]`` names one (``config``: a cell's inputs, which
    carry the file's ``tokens_sha256``)."""
    laws = {label: LAWS[name].isotropic(d, config["sigma"], **options) for label, name, options in _law_specs(config)}
    if config["tokens"]:
        laws[Empirical.name] = Empirical(file_matrix("tokens", config["tokens"], config["tokens_sha256"]), D=d)
    return laws


def kernel(cell, rng, config):
    d, U_norm = cell["d"], cell["U_norm"]
    Ls = np.asarray(config["L"])
    Q, P = config["n_queries"], config["n_prompts"]
    laws = token_laws(config, d)
    law_rng = {name: substream(rng, law=name) for name in laws}
    gauss = laws["gaussian"]
    V = np.eye(d)
    U = rng.standard_normal((d, d))
    U *= U_norm / np.linalg.norm(U)
    q = gauss.sample(rng, Q)  # (Q, d)
    f_inf = gauss.tilted_mean(q @ U.T)  # Lemma 2.1: sigma^2 U q
    sq_err = np.empty((len(laws), Q, P, len(Ls)))
    sq_err_scaled = np.empty((Q, P, len(Ls)))
    U_scale = np.sqrt(Ls / Ls[0])
    for qs in chunks(Q, config["query_chunk"]):
        for i, (name, law) in enumerate(laws.items()):
            Z = law.sample(law_rng[name], (qs.stop - qs.start, P, Ls[-1]))
            sq_err[i, qs], = sq_errors(Z, U, V, q[qs, None, :], Ls, f_inf[qs, None, None, :])
            if name == "gaussian":
                for j, (L, c) in enumerate(zip(Ls, U_scale)):
                    f_scaled = softmax_attention(Z[:, :, :L, :], c * U, V, q[qs, None, :])
                    lim = gauss.tilted_mean(q[qs] @ (c * U).T)
                    sq_err_scaled[qs, :, j] = np.sum((f_scaled - lim[:, None, :]) ** 2, axis=-1)
    bias = np.full(len(laws), np.nan)
    predicted = np.full((len(laws), len(Ls)), np.nan)
    for i, law in enumerate(laws.values()):
        if law.has_limit:  # no limit (Student-t): NaN by design
            bias[i] = np.mean(np.sum((law.tilted_mean(q @ U.T) - f_inf) ** 2, axis=-1))
            predicted[i] = bias[i] + asymptotic_mse(law, U, V, q[:, None, :], Ls).mean(axis=0)
    return {
        "mse_predicted": predicted, "mse": sq_err.mean(axis=(1, 2)),
        "mse_asymptotic": asymptotic_mse(gauss, U, V, q[:, None, :], Ls).mean(axis=0), "bias_exact": bias,
        "mse_query": Out(sq_err[list(laws).index("gaussian")].mean(axis=1), ("query", "L")),
        "Uq_sq": np.sum((q @ U.T) ** 2, axis=-1),
        "mse_scaled_U": sq_err_scaled.mean(axis=(0, 1)),
    }


def quadrature_check(cell, rng, config):
    """Closed form vs tensor Gauss-Hermite quadrature for random N(m, Sigma), a, D = 1..4."""
    errors = []
    for D in range(1, 5):
        A = rng.standard_normal((D, D))
        cov = A @ A.T / D
        mean = rng.standard_normal(D)
        a = 0.5 * rng.standard_normal((8, D))
        closed = LAWS["gaussian"](mean, cov).tilted_mean(a)
        errors.append(np.max(np.abs(closed - gaussian_tilted_mean_quadrature(mean, cov, a))))
    return {"quadrature_error": np.array(errors)}


def counts(config, part, cell):
    """A main cell reads, per query and prompt, ``L_max`` tokens of every law and every prefix ``L`` of the
    Gaussian one again (the scaled-U control); the quadrature check is one cell."""
    if part:
        return {"cell": 1}
    Ls = config["L"]
    return {"visit": config["n_queries"] * config["n_prompts"] * (len(law_names(config)) * max(Ls) + sum(Ls)),
            "cell": 1}


_NAN = "NaN by design for a law without a limit (student_t)."
OWN = (
    Variable("mse_predicted", ("law", "L"), "predicted mean squared error",
           "bias_exact + mean over queries of tr C_law(Uq)/L, C_law the law's exact SNIS (delta-method) covariance of "
           "its own limit (for ar1:RHO the dependent constant, a sum over lags); " + _NAN, allow_nonfinite=True),
    Variable("bias_exact", ("law",), "exact squared bias of the law's own limit",
             "mean over queries of ||grad K_law(Uq) - sigma^2 U q||^2; " + _NAN, allow_nonfinite=True),
    Variable("Uq_sq", ("query",), "squared logit norm ||U q||^2", "||U q||^2 of each query; the paper-form fit uses "
             "sigma^2 ||U q||^2."),
    Variable("mse_scaled_U", ("L",), "mean squared error with U scaled by sqrt(L/L_min)", "negative control: "
             "Gaussian tokens, U_L = sqrt(L/L_min) U, error to that U_L's own limit."),
)

EXPERIMENT = C1.variant(
    NAME, short="c1", analysis="sfxlin.analysis.c1", sweep=("d", "U_norm"),
    values=dict(d=Profiles(quick=[2, 3], paper=[2, 5, 10]), U_norm=Profiles(quick=[0.1, 0.5], paper=[0.1, 0.3, 0.5]),
                L=Profiles(quick=[2**k for k in range(4, 11)], paper=[2**k for k in range(4, 15)]),
                n_seeds=Profiles(quick=2, paper=4), tokens="", n_queries=Profiles(quick=6, paper=32),
                n_prompts=Profiles(quick=8, paper=16), root_seed=20251211, query_chunk=Profiles(quick=3, paper=4)),
    changes={"tokens": {"doc": "a token file, 'path.npy' or 'path.nc:variable' (one token of dimension d per row), "
                               "whose empirical law joins the laws as 'empirical' (tokens as given); '' for none"}},
    params=(
        Param("laws", "str_list", "token laws, each with covariance sigma^2 I_d (LAWS of sfxlin.laws with an isotropic "
              "member); 'gaussian' is needed (its limit sigma^2 U q is the reference of every law); 'ar1' is one law "
              "per ar1_rho, labelled 'ar1:RHO'", ["gaussian", "rademacher", "uniform", "student_t", GaussianAR1.name],
              choices=tuple(name for name in LAWS if name != Empirical.name)),
        Param("ar1_rho", "float_list", "AR(1) coefficients of the 'ar1' laws (tokens dependent along the prompt, "
              "lag-h correlation rho^h)", Profiles(quick=[0.8], paper=[0.0, 0.5, 0.8]), low=-1, high=1, low_open=True,
              high_open=True, order="increasing"),
        Param("sigma", "float", "token standard deviation (covariance sigma^2 I)", 1.0, low=0, low_open=True),
        Param("student_df", "float", "degrees of freedom of the Student-t control (finite covariance)", 3.0,
              low=2, low_open=True)),
    cells=(Cells({"d": "d", "U_norm": "U_norm", "seed": "n_seeds"}, kernel,
                 (*OWN[:3], C1.output("mse", over=("law",)), "mse_asymptotic", "mse_query", OWN[3])),
           # the error of tilted means of order one (means N(0, 1), a of size 0.5, covariances A A^T / D): its scale
           Cells({}, quadrature_check, (Variable("quadrature_error", ("D_quad",), "closed form vs quadrature",
                                              "max |Gaussian tilted mean (Lemma 2.1) - tensor Gauss-Hermite quadrature| "
                                              "over 8 random a, random mean and covariance, token dimension D_quad.",
                                              yardstick=1.0),),
                 name="quadrature", inputs=lambda config, cell: {"root_seed": config["root_seed"]})),
    coords={"law": law_names, "D_quad": lambda c: [1, 2, 3, 4]}, order=("law", "d", "U_norm", "L", "seed", "query"),
    checks=(_needs_gaussian, _tokens_fit), cost=C1.cost.counting(counts),
    title="C1: softmax attention -> linear operator on the token measure",
    description="C1: softmax attention -> tilted-mean (linear) operator as L grows")
