"""Exact expectations of polynomials in quadratic forms of a standard Gaussian vector ``w ~ N(0, I_d)``
(the exact variance of a held-out risk, :func:`sfxlin.icl.linear_inf_pair_variance`, is one).

A polynomial is a dict ``{key: coefficient}``: ``key`` a sorted tuple of atom indices, the monomial
``prod_{i in key} w^T M_i w`` of the atoms ``M_i`` (symmetric ``(..., d, d)`` arrays), ``()`` the constant;
coefficients are arrays broadcast with the atoms' leading axes. Its expectation (:func:`expect`) sums over
the set partitions of each monomial the products of the joint cumulants of quadratic forms,
``kappa(M_1, ..., M_k) = 2^(k-1) sum_sigma tr(M_1 M_sigma(2) ... M_sigma(k))`` over the orderings
``sigma`` of ``2..k`` (``k = 1``: ``tr M``; ``k = 2``: ``2 tr(M_1 M_2)``): exact, any degree.

Pure numpy, float64.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["constant", "form", "mul", "add", "expect", "joint_cumulant"]


def constant(c):
    """The constant polynomial ``c``."""
    return {(): np.asarray(c, dtype=float)}


def form(i, c=1.0):
    """``c w^T M_i w``, atom ``i``."""
    return {(i,): np.asarray(c, dtype=float)}


def add(*polys):
    """The sum of polynomials."""
    out = {}
    for p in polys:
        for k, c in p.items():
            out[k] = out[k] + c if k in out else c
    return out


def mul(p, q):
    """The product of two polynomials."""
    out = {}
    for (kp, cp), (kq, cq) in itertools.product(p.items(), q.items()):
        k = tuple(sorted(kp + kq))
        out[k] = out[k] + cp * cq if k in out else cp * cq
    return out


def _set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        yield [(first,), *part]
        for j in range(len(part)):
            yield [*part[:j], (first, *part[j]), *part[j + 1:]]


def joint_cumulant(mats):
    """Joint cumulant of the quadratic forms ``w^T M w`` of the matrices ``mats`` (``(..., d, d)`` each,
    symmetric), ``w ~ N(0, I)``."""
    first, rest = mats[0], mats[1:]
    total = 0.0
    for order in itertools.permutations(range(len(rest))):
        prod = first
        for j in order:
            prod = prod @ rest[j]
        total = total + np.trace(prod, axis1=-2, axis2=-1)
    return 2.0 ** (len(mats) - 1) * total


def expect(poly, atoms):
    """``E poly(w)``, ``w ~ N(0, I_d)``: each monomial's moment by the moment-cumulant formula over its set
    partitions, cumulants of repeated blocks computed once."""
    atoms = [np.asarray(a, dtype=float) for a in atoms]
    cache = {}

    def cumulant(key):
        if key not in cache:
            cache[key] = joint_cumulant([atoms[i] for i in key])
        return cache[key]

    total = 0.0
    for key, c in poly.items():
        moment = 0.0
        for part in _set_partitions(list(key)):
            moment = moment + math.prod((cumulant(tuple(sorted(block))) for block in part), start=1.0)
        total = total + c * moment
    return np.asarray(total, dtype=float)
