"""One kernel class per kernel, one registry: sfxlin.kernels.KERNELS, filled by subclassing Kernel
and read by sfxlin.kernels and sfxlin.models alike.

* Every registered kernel declares every attribute in its own class body (nothing inherited from
  the base, nothing taken by default), its declared smoothness is how Gauss-Hermite quadrature
  converges on its weight, and its JAX weight is its numpy weight.
* A kernel defined here (a normalised softplus, no closed form) is found by name, evaluated at
  finite L against a naive loop, has its moments and gain by quadrature against
  scipy.integrate.quad, and runs in a one-layer sfxlin.models model against a numpy forward pass.
* Classes that leave something undeclared are refused when defined, and register nothing.
* ``import sfxlin.kernels`` does not import JAX.
"""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy import integrate
from scipy.special import expit

from sfxlin import kernels
from sfxlin.kernels import KERNEL_NAMES, KERNELS, SMOOTHNESS, Kernel

BUILTIN = list(KERNELS)      # the registry as this module found it (before any kernel defined here)
SIGMA = np.diag([1.5, 1.0, 0.5])
I3 = np.eye(3)


def test_import_sfxlin_kernels_does_not_import_jax():
    code = ("import sys, numpy as np, sfxlin.kernels as k; "
            "k.kernel_gain(k.Kernel('sigmoid', bias=-1.3), np.eye(2), np.eye(2), np.ones(2)); "
            "assert 'jax' not in sys.modules and 'sfxlin.models' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_kernel_of_the_module_is_registered_once_under_its_name():
    concrete = [cls for cls in vars(kernels).values()
                if isinstance(cls, type) and issubclass(cls, Kernel) and "name" in cls.__dict__]
    assert sorted(cls.name for cls in concrete) == sorted(BUILTIN)
    assert all(KERNELS[cls.name] is cls for cls in concrete)
    assert KERNEL_NAMES == tuple(name for name in BUILTIN if name != "linear")   # the Stein study's kernels


@pytest.mark.parametrize("name", BUILTIN)
def test_every_registered_kernel_declares_every_attribute(name):
    cls = KERNELS[name]
    assert {"name", "normalised", "smoothness"} <= set(cls.__dict__), "declared in the class body itself"
    assert cls.name == name and isinstance(cls.normalised, bool) and cls.smoothness in SMOOTHNESS
    for method in ("weight", "jax_weight", "expectations"):
        assert not getattr(getattr(cls, method), "__isabstractmethod__", False), method
    k = cls()                                                # every parameter has a default
    assert k == cls() and hash(k) == hash(cls()) and k.name == name


def _gauss_hermite(k, r, n):
    """``E[kappa(s)(1 + s)]``, ``s ~ N(0, r^2)``, by an ``n``-node Gauss-Hermite rule (``L = 16``)."""
    x, w = hermegauss(n)
    s = r * x
    return np.sum(w / math.sqrt(2 * math.pi) * k.weight(s, 16) * (1 + s))


@pytest.mark.parametrize("name", BUILTIN)
def test_declared_smoothness_is_how_gauss_hermite_converges_on_the_weight(name):
    """At r = 0.7, 40 and 160 nodes agree to rounding (< 1e-12, measured <= 1.3e-15) for a smooth
    weight (geometric convergence) and differ by > 1e-8 for a kinked one (algebraic; measured
    1e-4 for ReLU^2, 4e-3 for ReLU). ``kappa (1 + s)``: an odd kink (``s |s|``) would cancel."""
    k = KERNELS[name]()
    a, b = _gauss_hermite(k, 0.7, 40), _gauss_hermite(k, 0.7, 160)
    if k.smoothness == "smooth":
        assert abs(a - b) < 1e-12 * abs(b)
    else:
        assert abs(a - b) > 1e-8 * abs(b)


@pytest.mark.parametrize("name", BUILTIN)
def test_the_jax_weight_is_the_numpy_weight(name):
    """Two implementations of one function: rounding (a few ulps) apart on s in [-30, 30]."""
    pytest.importorskip("sfxlin.models")
    k = KERNELS[name]()
    s = np.linspace(-30.0, 30.0, 121)
    np.testing.assert_allclose(np.asarray(k.jax_weight(s, 16)), k.weight(s, 16), rtol=1e-14, atol=1e-300)


def test_a_kernel_is_built_by_name_with_its_own_parameters():
    k = Kernel("sigmoid", bias=-1.3)
    assert type(k) is kernels.Sigmoid and k.bias == -1.3 and k == kernels.Sigmoid(bias=-1.3)
    assert Kernel("relu", temperature=1.0, bias=0.0) == kernels.ReLU()     # neutral values: every kernel
    assert kernels.as_kernel(k) is k and kernels.as_kernel("relu_norm") == kernels.ReLUNorm()
    with pytest.raises(ValueError, match="kernel name must be one of"):
        kernels.as_kernel("gelu")
    with pytest.raises(ValueError, match="kernel must be a sfxlin.kernels.Kernel or the name"):
        kernels.as_kernel(1.0)
    with pytest.raises(ValueError, match=r"power: kernel 'relu' has no parameter power \(its parameters: none\)"):
        Kernel("relu", power=3)


# ------------------------------------------------------------------ a kernel defined here
SHIFT = 1.0


@pytest.fixture
def toy(monkeypatch):
    """A normalised softplus kernel ``kappa(s) = log(1 + e^(s - c))`` (no closed-form moments),
    registered in a copy of the registry that is restored after the test."""
    monkeypatch.setattr(kernels, "KERNELS", dict(KERNELS))

    class SoftplusNorm(Kernel):
        name = "toy_softplus_norm"
        normalised = True
        smoothness = "smooth"
        shift: float = SHIFT

        def weight(self, s, L=None):
            return np.logaddexp(0.0, s - self.shift)

        def jax_weight(self, s, L=None):
            import jax

            return jax.nn.softplus(s - self.shift)

        def expectations(self, r, L=None):
            return kernels.quadrature_moments(self.weight, lambda s: expit(s - self.shift), r, [self.shift])

    return SoftplusNorm


def _softplus(s):
    return math.log1p(math.exp(s - SHIFT)) if s < SHIFT + 30 else s - SHIFT + math.log1p(math.exp(SHIFT - s))


def test_a_new_kernel_is_found_by_name(toy):
    assert kernels.KERNELS["toy_softplus_norm"] is toy and "toy_softplus_norm" not in KERNELS
    k = Kernel("toy_softplus_norm", shift=0.5)
    assert type(k) is toy and k.shift == 0.5 and kernels.as_kernel("toy_softplus_norm") == toy()


def test_a_new_kernel_at_finite_L_equals_a_naive_loop(toy):
    rng = np.random.default_rng(1)
    Z = rng.standard_normal((2, 30, 3)) @ np.linalg.cholesky(SIGMA).T
    U, V, q = rng.standard_normal((3, 3)), rng.standard_normal((2, 3)), 0.7 * rng.standard_normal((2, 3))
    Ls = [3, 12, 30]
    got = kernels.kernel_attention_prefix(Z, U, V, q, Ls, Kernel("toy_softplus_norm"))
    for p in range(2):
        a = U @ q[p]
        for j, L in enumerate(Ls):
            w = [_softplus(float(z @ a)) for z in Z[p, :L]]
            want = V @ (sum(wi * z for wi, z in zip(w, Z[p, :L])) / sum(w))
            np.testing.assert_allclose(got[p, j], want, rtol=1e-12, atol=1e-14)    # sums of 30 terms


def _quad_expectation(f, r):
    """``E f(s)``, ``s ~ N(0, r^2)``, by scipy.integrate.quad over ``|s| <= 40 r`` (the mass beyond is
    below 1e-340), split at the transition ``s = c``."""
    phi = lambda s: math.exp(-s * s / (2 * r * r)) / (math.sqrt(2 * math.pi) * r)  # noqa: E731
    cuts = sorted({-40 * r, 40 * r} | ({SHIFT} if abs(SHIFT) < 40 * r else set()))
    return sum(integrate.quad(lambda s: f(s) * phi(s), lo, hi, epsabs=0, epsrel=1e-13, limit=500)[0]
               for lo, hi in zip(cuts[:-1], cuts[1:]))


def test_a_new_kernel_has_its_moments_and_gain_by_quadrature(toy):
    """The graded rule behind quadrature_moments against adaptive quadrature: relative 1e-10 (both
    are at rounding level, ~1e-14); gain E kappa' / E kappa (normalised); kernel_limit along Sigma a."""
    r = np.array([0.3, 1.0, 3.0, 8.0])
    k = Kernel("toy_softplus_norm")
    got, gain = k.moments(r), k.gain(r)
    dk = lambda s: expit(s - SHIFT)  # noqa: E731
    for i, ri in enumerate(r):
        want = [_quad_expectation(f, ri) for f in (_softplus, dk, lambda s: _softplus(s) ** 2,
                                                    lambda s: _softplus(s) ** 2 * s, lambda s: (_softplus(s) * s) ** 2)]
        np.testing.assert_allclose([m[i] for m in got], want, rtol=1e-10)
        np.testing.assert_allclose(gain[i], want[1] / want[0], rtol=1e-10)
    a = np.array([0.4, -0.3, 0.2])
    Sa = SIGMA @ a
    ra = math.sqrt(a @ Sa)
    np.testing.assert_allclose(kernels.kernel_limit(k, SIGMA, I3, I3, a),
                               Sa * _quad_expectation(dk, ra) / _quad_expectation(_softplus, ra), rtol=1e-10)


def test_a_new_kernel_runs_in_a_one_layer_model(toy):
    """One layer, one head, residual, value matrix: pred = v . (z_q + V sum_k w_k z_k / sum_k w_k),
    w_k = softplus(z_k . U z_q - c), by a numpy loop; the kernel by name and by instance."""
    M = pytest.importorskip("sfxlin.models")
    from sfxlin import icl, laws

    tasks = icl.make_tasks(np.random.default_rng(2), 3, 1, 2, 10, laws.covariate_law("gaussian", np.eye(3)))
    model = M.Transformer(4, 1, 1)
    p = model.init(np.random.default_rng(3))
    U, V = p["U"][0, 0], p["V"][0, 0]
    want = np.empty((tasks.n_tasks, tasks.n_queries))
    for n in range(tasks.n_tasks):
        Z = tasks.Z[n]
        for j, zq in enumerate(tasks.z_q[n]):
            w = np.array([_softplus(float(z @ U @ zq)) for z in Z])
            want[n, j] = p["v"] @ (zq + V @ (w @ Z / w.sum()))
    for kern in ("toy_softplus_norm", toy()):
        got = M.predict(model, kern, p, tasks.Z, tasks.z_q)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ refusals
def _body(**declared):
    """The members of a complete kernel (kappa = 1 + s^2), with the class attributes ``declared``."""
    return {**declared,
            "weight": lambda self, s, L=None: 1 + s**2,
            "jax_weight": lambda self, s, L=None: 1 + s**2,
            "expectations": lambda self, r, L=None: (1 + r**2, 0 * r, 1 + 2 * r**2 + 3 * r**4, 0 * r,
                                                     r**2 + 6 * r**4 + 15 * r**6)}


COMPLETE = {"name": "quadratic", "normalised": False, "smoothness": "smooth"}


@pytest.mark.parametrize("change, match", [
    ({"name": None}, "must set a class attribute name"),
    ({"name": "sigmoid"}, "kernel name 'sigmoid' of .* is already taken by sfxlin.kernels.Sigmoid"),
    ({"normalised": None}, "must set a class attribute normalised"),
    ({"normalised": 1}, "must set a class attribute normalised"),
    ({"smoothness": None}, "must set a class attribute smoothness"),
    ({"smoothness": "wiggly"}, "must set a class attribute smoothness, one of"),
    ({"jax_weight": None}, r"does not implement \['jax_weight'\]"),
    ({"expectations": None}, r"does not implement \['expectations'\]"),
])
def test_a_kernel_with_something_undeclared_is_refused(change, match):
    body = _body(**COMPLETE)
    body.update(change)
    body = {key: value for key, value in body.items() if value is not None}
    before = dict(KERNELS)
    with pytest.raises(TypeError, match=match):
        type("Quadratic", (Kernel,), body)
    assert KERNELS == before


def test_inherited_declarations_do_not_count():
    """A subclass of a kernel names itself and declares normalised and smoothness again."""
    before = dict(KERNELS)
    with pytest.raises(TypeError, match="must set a class attribute normalised"):
        type("MySigmoid", (kernels.Sigmoid,), {"name": "my_sigmoid"})
    with pytest.raises(TypeError, match="must set a class attribute name"):
        type("MySigmoid", (kernels.Sigmoid,), {"normalised": False, "smoothness": "smooth"})
    assert KERNELS == before


def test_an_annotated_declaration_is_refused():
    """``normalised: bool = False`` would make it a constructor parameter."""
    before = dict(KERNELS)
    body = _body(name="quadratic", smoothness="smooth", normalised=False, __annotations__={"normalised": bool})
    with pytest.raises(TypeError, match=r"\['normalised'\] must be plain class attributes"):
        type("Quadratic", (Kernel,), body)
    assert KERNELS == before


def test_an_abstract_intermediate_class_is_not_registered():
    before = dict(KERNELS)
    Base = type("Base", (Kernel,), {}, abstract=True)
    assert KERNELS == before
    with pytest.raises(TypeError):      # abstract members: cannot be instantiated
        Base()
