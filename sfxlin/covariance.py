"""Named covariance matrices ``Sigma`` for the covariates, their summary figures and spec strings.

Generators (each returns a validated ``d x d`` float64 symmetric positive-definite matrix):

* :func:`isotropic` ``(d, scale)``: ``scale * I_d``;
* :func:`diagonal` ``(eigs)``: ``diag(eigs)``;
* :func:`power_law` ``(d, exponent)``: ``diag(lambda_k)``, ``lambda_k = k^-exponent`` (``k = 1..d``),
  normalised to trace ``d``;
* :func:`geometric` ``(d, top, bottom)``: ``diag(geomspace(top, bottom, d))``, eigenvalues in
  geometric progression from ``top`` to ``bottom`` (C2's anisotropic setting: ``geometric:2:0.5``,
  ``diag(2, 1, 0.5)`` at ``d = 3``);
* :func:`linear_spectrum` ``(d)``: ``diag(lambda_k)``, ``lambda_k = 2 (d + 1 - k) / (d + 1)``
  (equally spaced, decreasing), trace ``d``;
* :func:`kms` ``(d, rho)``: Kac-Murdock-Szego, ``Sigma_ij = rho^|i - j|``, ``-1 < rho < 1`` (the
  paper code's ``generate_covariance_matrix``); trace ``d``;
* :func:`rotated` ``(eigs, seed)``: ``Q diag(eigs) Q^T`` with ``Q`` Haar-distributed on the
  orthogonal group (QR of a Gaussian matrix, signs fixed so that ``R`` has a positive diagonal);
* :func:`inverse_wishart` ``(d, dof, seed)``: ``(dof - d - 1) W^-1``, ``W = G^T G``, ``G`` a
  ``dof x d`` standard Gaussian matrix, so ``E Sigma = I_d`` (needs ``dof > d + 1``);
* :func:`scaled` ``(Sigma, target)``: ``c Sigma`` with ``tr((c Sigma)^-2) = target``, i.e.
  ``c = (tr(Sigma^-2) / target)^(1/2)`` (threshold sweeps in ``tau = tr(Sigma^-2)``).

Seeded generators draw from ``np.random.default_rng(seed)`` only, so a seed gives the same matrix on
every machine (up to the last bits of the platform's LAPACK).

:func:`summary` gives the figures ``trace``, ``op_norm`` (largest eigenvalue), ``condition``
(largest / smallest eigenvalue) and ``tr_inv2 = tr(Sigma^-2)`` from the eigenvalues;
:func:`closed_form` gives those that have a closed form for a spec (every figure of a spectral
family; trace, ``tr_inv2`` and the determinant of KMS, whose inverse is tridiagonal,
:func:`kms_inverse`, :func:`kms_tr_inv2`).

Spec strings (command line: ``--set covariance=kms:0.5``; no ``,`` or ``;``, which separate list
items): a family name then ``:``-separated arguments, positional or ``key=value``::

    isotropic | isotropic:2 | diagonal:3/1/0.5 | power_law:1.0 | geometric:2:0.5 | linear | kms:0.5
    rotated:power_law:1.0:seed=3 | inverse_wishart:dof=10:seed=1

``rotated:<spec>:seed=N`` rotates the spectrum of any other spec. :func:`from_spec` builds the
matrix; a bad spec raises one ValueError naming the spec and what was expected.
:func:`spec_check` makes an :class:`sfxlin.engine.sweep.Experiment` check that validates spec parameters
when the configuration is built, before any cell runs.
"""
from __future__ import annotations

import math

import numpy as np

from .validation import numeric_array

__all__ = [
    "isotropic", "diagonal", "power_law", "geometric", "linear_spectrum", "kms", "rotated", "inverse_wishart", "scaled",
    "validate", "summary", "spectrum_summary", "kms_inverse", "kms_tr_inv2", "kms_logdet",
    "power_law_eigs", "linear_eigs", "from_spec", "parse_spec", "closed_form", "spec_check",
    "SUMMARY_KEYS", "FAMILIES",
]

#: keys of :func:`summary` (the results files' coordinates carry them).
SUMMARY_KEYS = ("trace", "op_norm", "condition", "tr_inv2")

#: family name -> its arguments in positional order (``rotated`` takes an inner spec and ``seed``).
FAMILIES = {
    "isotropic": ("scale",),
    "diagonal": ("eigs",),
    "power_law": ("exponent",),
    "geometric": ("top", "bottom"),
    "linear": (),
    "kms": ("rho",),
    "rotated": ("spec", "seed"),
    "inverse_wishart": ("dof", "seed"),
}


# --------------------------------------------------------------------------- argument checks


def _dim(d):
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    return int(d)


def _finite(x, name):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be a finite number, got {x!r}")
    return float(x)


def _seed(seed):
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _eigs(eigs):
    lam = numeric_array(eigs, "eigs")
    if lam.ndim != 1 or lam.size == 0:
        raise ValueError(f"eigs must be a non-empty list of eigenvalues, got shape {lam.shape}")
    if not np.all(np.isfinite(lam)) or np.any(lam <= 0):
        raise ValueError(f"eigs must be finite and > 0 (a covariance with an inverse), got {lam.tolist()}")
    return lam


def validate(Sigma, d=None) -> np.ndarray:
    """``Sigma`` as a finite, symmetric, positive-definite ``d x d`` float64 matrix (exactly
    symmetrised); a ValueError saying which property fails otherwise."""
    S = numeric_array(Sigma, "Sigma")
    if S.ndim != 2 or S.shape[0] != S.shape[1] or S.size == 0 or (d is not None and S.shape[0] != d):
        want = f"{d} x {d}" if d is not None else "square"
        raise ValueError(f"Sigma must be a {want} matrix, got shape {S.shape}")
    if not np.all(np.isfinite(S)):
        raise ValueError("Sigma must be finite")
    if not np.allclose(S, S.T, rtol=0, atol=1e-12 * np.abs(S).max()):
        raise ValueError("Sigma must be symmetric")
    S = 0.5 * (S + S.T)
    lam_min = np.linalg.eigvalsh(S)[0]
    if not lam_min > 0:
        raise ValueError(f"Sigma must be positive definite, smallest eigenvalue {lam_min:g}")
    return S


# --------------------------------------------------------------------------- generators


def power_law_eigs(d, exponent) -> np.ndarray:
    """``lambda_k = d k^-exponent / sum_j j^-exponent``, ``k = 1..d`` (trace ``d``)."""
    d, a = _dim(d), _finite(exponent, "exponent")
    lam = np.arange(1, d + 1, dtype=float) ** -a
    return d * lam / lam.sum()


def linear_eigs(d) -> np.ndarray:
    """``lambda_k = 2 (d + 1 - k) / (d + 1)``, ``k = 1..d``: equally spaced, decreasing, trace ``d``."""
    d = _dim(d)
    return 2.0 * np.arange(d, 0, -1, dtype=float) / (d + 1)


def isotropic(d, scale=1.0) -> np.ndarray:
    """``scale * I_d`` (``scale > 0``)."""
    d, s = _dim(d), _finite(scale, "scale")
    if s <= 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    return s * np.eye(d)


def diagonal(eigs) -> np.ndarray:
    """``diag(eigs)``, every eigenvalue finite and > 0."""
    return np.diag(_eigs(eigs))


def power_law(d, exponent) -> np.ndarray:
    """``diag(power_law_eigs(d, exponent))``: eigenvalues ``∝ k^-exponent``, trace ``d``."""
    return np.diag(power_law_eigs(d, exponent))


def geometric(d, top, bottom) -> np.ndarray:
    """``diag(geomspace(top, bottom, d))``: eigenvalues in geometric progression from ``top`` to
    ``bottom`` (both > 0)."""
    d, hi, lo = _dim(d), _finite(top, "top"), _finite(bottom, "bottom")
    if hi <= 0 or lo <= 0:
        raise ValueError(f"top and bottom must be > 0, got {top!r} and {bottom!r}")
    return np.diag(np.geomspace(hi, lo, d))


def linear_spectrum(d) -> np.ndarray:
    """``diag(linear_eigs(d))``: equally spaced eigenvalues ``2 (d + 1 - k) / (d + 1)``, trace ``d``."""
    return np.diag(linear_eigs(d))


def _rho(rho):
    r = _finite(rho, "rho")
    if not -1.0 < r < 1.0:
        raise ValueError(f"rho must be in (-1, 1) (Sigma_ij = rho^|i-j| is then positive definite), got {rho!r}")
    return r


def kms(d, rho) -> np.ndarray:
    """Kac-Murdock-Szego matrix ``Sigma_ij = rho^|i - j|``, ``-1 < rho < 1``."""
    d, r = _dim(d), _rho(rho)
    k = np.abs(np.subtract.outer(np.arange(d), np.arange(d)))
    return np.power(r, k.astype(float))


def kms_inverse(d, rho) -> np.ndarray:
    """Closed-form inverse of :func:`kms`: tridiagonal, ``(1 - rho^2)^-1`` times diagonal
    ``(1, 1 + rho^2, ..., 1 + rho^2, 1)`` and off-diagonal ``-rho`` (``[[1]]`` for ``d = 1``)."""
    d, r = _dim(d), _rho(rho)
    if d == 1:
        return np.ones((1, 1))
    diag = np.full(d, 1.0 + r * r)
    diag[0] = diag[-1] = 1.0
    P = np.diag(diag) - r * (np.eye(d, k=1) + np.eye(d, k=-1))
    return P / (1.0 - r * r)


def kms_tr_inv2(d, rho) -> float:
    """``tr(Sigma^-2) = ||Sigma^-1||_F^2`` of :func:`kms` in closed form (sum of the squared
    entries of :func:`kms_inverse`): ``(2 + (d - 2)(1 + rho^2)^2 + 2 (d - 1) rho^2) / (1 - rho^2)^2``
    for ``d >= 2``, ``1`` for ``d = 1``."""
    d, r = _dim(d), _rho(rho)
    if d == 1:
        return 1.0
    r2 = r * r
    return (2.0 + (d - 2) * (1.0 + r2) ** 2 + 2.0 * (d - 1) * r2) / (1.0 - r2) ** 2


def kms_logdet(d, rho) -> float:
    """``log det`` of :func:`kms` in closed form: ``(d - 1) log(1 - rho^2)``."""
    d, r = _dim(d), _rho(rho)
    return (d - 1) * math.log1p(-r * r)


def _haar(rng, d):
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    return Q * np.where(np.diag(R) < 0, -1.0, 1.0)   # unique QR (R_ii > 0): Q is Haar


def rotated(eigs, seed) -> np.ndarray:
    """``Q diag(eigs) Q^T`` with ``Q`` Haar on ``O(d)`` drawn from ``default_rng(seed)``: the QR
    factor of a standard Gaussian ``d x d`` matrix with its columns' signs fixed (``R_ii > 0``)."""
    lam, seed = _eigs(eigs), _seed(seed)
    Q = _haar(np.random.default_rng(seed), lam.size)
    S = (Q * lam) @ Q.T
    return 0.5 * (S + S.T)


def inverse_wishart(d, dof, seed) -> np.ndarray:
    """``(dof - d - 1) W^-1`` with ``W = G^T G``, ``G`` a ``dof x d`` standard Gaussian matrix drawn
    from ``default_rng(seed)``: inverse-Wishart with ``E Sigma = I_d``. ``dof`` an integer > d + 1."""
    d, seed = _dim(d), _seed(seed)
    if isinstance(dof, (bool, np.bool_)) or not isinstance(dof, (int, np.integer)) or dof <= d + 1:
        raise ValueError(f"dof must be an integer > d + 1 = {d + 1} (so that E Sigma = I_d exists), got {dof!r}")
    G = np.random.default_rng(seed).standard_normal((int(dof), d))
    C = np.linalg.cholesky(G.T @ G)
    Cinv = np.linalg.solve(C, np.eye(d))           # W^-1 = C^-T C^-1
    S = (int(dof) - d - 1) * (Cinv.T @ Cinv)
    return validate(0.5 * (S + S.T))


def scaled(Sigma, target) -> np.ndarray:
    """``c Sigma`` with ``tr((c Sigma)^-2) = target``: ``c = (tr(Sigma^-2) / target)^(1/2)``."""
    S = validate(Sigma)
    t = _finite(target, "target")
    if t <= 0:
        raise ValueError(f"target (the wanted tr(Sigma^-2)) must be > 0, got {target!r}")
    return math.sqrt(summary(S)["tr_inv2"] / t) * S


# --------------------------------------------------------------------------- summary figures


def spectrum_summary(eigs) -> dict:
    """The :func:`summary` figures of any matrix with eigenvalues ``eigs`` (closed form for the
    spectral families): ``sum``, ``max``, ``max / min`` and ``sum lambda^-2``."""
    lam = _eigs(eigs)
    return {"trace": float(lam.sum()), "op_norm": float(lam.max()), "condition": float(lam.max() / lam.min()),
            "tr_inv2": float(np.sum(lam ** -2.0))}


def summary(Sigma) -> dict:
    """Summary figures of ``Sigma`` (validated): ``trace``, ``op_norm`` (largest eigenvalue),
    ``condition`` (largest / smallest eigenvalue) and ``tr_inv2 = tr(Sigma^-2)``, as floats."""
    return spectrum_summary(np.linalg.eigvalsh(validate(Sigma)))


# --------------------------------------------------------------------------- spec strings


def _bad(spec, what):
    return ValueError(f"covariance spec {spec!r}: {what}")


def _number(spec, key, text, kind=float):
    try:
        if kind is int:
            value = int(text)
        else:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
    except ValueError:
        raise _bad(spec, f"{key} must be {'an integer' if kind is int else 'a finite number'}, got {text!r}") from None
    return value


def parse_spec(spec) -> tuple:
    """``(family, arguments)`` of a spec string, arguments typed (``eigs`` a tuple of floats,
    ``spec`` the inner spec of ``rotated``, parsed too); a ValueError naming the spec otherwise.
    Checks the syntax and each argument's type; ranges that need ``d`` are checked by :func:`from_spec`."""
    if not isinstance(spec, str):
        raise ValueError(f"covariance spec must be a string, got {spec!r}")
    if "," in spec or ";" in spec or spec != spec.strip() or not spec:
        raise _bad(spec, "expected NAME[:ARG...] without spaces, ',' or ';' (those separate list items)")
    name, *tokens = spec.split(":")
    if name not in FAMILIES:
        raise _bad(spec, f"unknown covariance family {name!r}; known: {', '.join(FAMILIES)}")
    names = FAMILIES[name]
    args = {}
    if name == "rotated":
        if len(tokens) < 2 or not tokens[-1].startswith("seed="):
            raise _bad(spec, "expected rotated:<spec>:seed=N (e.g. rotated:power_law:1.0:seed=3)")
        inner = ":".join(tokens[:-1])
        if inner.split(":")[0] == "rotated":
            raise _bad(spec, "rotated takes the spectrum of a non-rotated spec")
        try:
            parse_spec(inner)
        except ValueError as exc:
            raise _bad(spec, f"its spectrum: {exc}") from None
        return name, {"spec": inner, "seed": _number(spec, "seed", tokens[-1][len("seed="):], int)}
    positional = iter(names)
    for tok in tokens:
        key, sep, text = tok.partition("=")
        if not sep:
            key, text = next(positional, None), tok
            if key is None:
                raise _bad(spec, f"{name} takes {len(names)} argument(s) ({', '.join(names) or 'none'}), "
                                 f"got {len(tokens)}")
        elif key not in names:
            raise _bad(spec, f"{name} has no argument {key!r}; its arguments: {', '.join(names) or 'none'}")
        if key in args:
            raise _bad(spec, f"argument {key!r} given twice")
        if key == "eigs":
            args[key] = tuple(_number(spec, "an eigenvalue", t) for t in text.split("/"))
        else:
            args[key] = _number(spec, key, text, int if key in ("dof", "seed") else float)
    missing = [k for k in names if k not in args and not (name == "isotropic" and k == "scale")]
    if missing:
        raise _bad(spec, f"{name} needs {', '.join(missing)} (e.g. {_EXAMPLES[name]})")
    return name, args


_EXAMPLES = {"isotropic": "isotropic:2", "diagonal": "diagonal:3/1/0.5", "power_law": "power_law:1.0",
             "geometric": "geometric:2:0.5", "linear": "linear", "kms": "kms:0.5", "rotated": "rotated:power_law:1.0:seed=3",
             "inverse_wishart": "inverse_wishart:dof=10:seed=1"}


def _spectrum(name, args, d):
    """Eigenvalues of a spectral family (None for KMS and inverse-Wishart)."""
    if name == "isotropic":
        return np.diag(isotropic(d, args.get("scale", 1.0))).copy()
    if name == "diagonal":
        lam = _eigs(args["eigs"])
        if lam.size != d:
            raise ValueError(f"diagonal gives {lam.size} eigenvalues, expected d = {d}")
        return lam
    if name == "power_law":
        return power_law_eigs(d, args["exponent"])
    if name == "geometric":
        return np.diag(geometric(d, args["top"], args["bottom"])).copy()
    if name == "linear":
        return linear_eigs(d)
    if name == "rotated":
        return _inner_eigs(args["spec"], d)
    return None


def _inner_eigs(inner, d):
    name, args = parse_spec(inner)
    lam = _spectrum(name, args, d)
    return np.linalg.eigvalsh(_build(name, args, d)) if lam is None else lam


def _build(name, args, d):
    if name == "kms":
        return kms(d, args["rho"])
    if name == "inverse_wishart":
        return inverse_wishart(d, args["dof"], args["seed"])
    if name == "rotated":
        return rotated(_spectrum(name, args, d), args["seed"])
    return np.diag(_spectrum(name, args, d))


def from_spec(spec, d) -> np.ndarray:
    """The ``d x d`` covariance named by ``spec`` (see the module docstring), validated; one
    ValueError naming the spec and what was expected otherwise (unknown family, an argument out of
    range such as ``rho`` outside (-1, 1) or a non-positive eigenvalue, a ``d`` mismatch)."""
    name, args = parse_spec(spec)
    try:
        return validate(_build(name, args, _dim(d)), d)
    except ValueError as exc:
        raise _bad(spec, str(exc)) from None


def closed_form(spec, d) -> dict:
    """The :data:`SUMMARY_KEYS` figures of ``from_spec(spec, d)`` that have a closed form (plus
    ``logdet`` for KMS), computed without forming or decomposing the matrix: every figure of a
    spectral family (isotropic, diagonal, power_law, linear and any rotation of them, from the
    spectrum); ``trace = d``, ``tr_inv2`` (:func:`kms_tr_inv2`) and ``logdet`` for KMS; ``{}``
    for inverse-Wishart (random)."""
    name, args = parse_spec(spec)
    try:
        d = _dim(d)
        if name == "kms":
            return {"trace": float(d), "tr_inv2": kms_tr_inv2(d, args["rho"]), "logdet": kms_logdet(d, args["rho"])}
        if name == "rotated" and parse_spec(args["spec"])[0] in ("kms", "inverse_wishart"):
            return {}
        lam = _spectrum(name, args, d)
        return {} if lam is None else spectrum_summary(lam)
    except ValueError as exc:
        raise _bad(spec, str(exc)) from None


def spec_check(param, d_param="d"):
    """A check for :class:`sfxlin.engine.sweep.Experiment` ``checks``: every spec in the ``param`` value
    of a configuration (a ``str`` or ``str_list`` parameter) must build a covariance for every
    dimension in ``config[d_param]`` (an int or a list of ints); ValueError ``"<param>: ..."``."""
    def check(config):
        specs = config[param]
        specs = (specs,) if isinstance(specs, str) else tuple(specs)
        dims = config[d_param]
        dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
        for spec in specs:
            for d in dims:
                try:
                    from_spec(spec, d)
                except ValueError as exc:
                    raise ValueError(f"{param}: {exc} (d = {d})") from None
    check.__name__ = f"check_{param}_specs"
    return check
