"""Test helpers, as ``xarray.testing`` ships them: for sfxlin's own suite and for anyone who
extends it (a new experiment's tests, a researcher's checks of a results file).

* :func:`assert_same_results`: two results Datasets carry the same data, coordinates and
  attributes, time stamps aside (``created``, ``history``, ``wall_seconds``, ``scheduler``,
  ``git_revision``): what a rerun, a resumed run or another grid must reproduce bit for bit;
* :func:`raise_if_dask_computes`: a context manager failing if dask computes inside it (a
  function that should stay lazy), after flox's test helper;
* :mod:`sfxlin.testing.reference_c3`: the plain per-L, per-step numpy reference of the C3
  training, the oracle of the fast trainer (and the slow arm of ``sfxlin bench c3``);
* :mod:`sfxlin.testing.calibration`: whether a reported standard error follows the design, from
  z-scores of estimates against exact values (the share inside the central 50%, the signs, and for
  normal z the mean of z^2, each in its binomial or chi-square band);
* :mod:`sfxlin.testing.generate`: the files generated from the experiments' declarations (the
  criteria pins, :mod:`.pins`; the tables of docs/criteria.md, :mod:`.criteria_doc`) and the
  command that checks and rewrites them.
"""
from __future__ import annotations

import contextlib

import dask
import numpy as np
import xarray as xr

__all__ = ["TIME_STAMPS", "DaskComputed", "assert_same_results", "raise_if_dask_computes"]

#: attrs that say when, where and how long a run took: the only ones two runs may differ in
TIME_STAMPS = ("created", "history", "wall_seconds", "scheduler", "git_revision", "cell_timeline", "cell_seconds")


def assert_same_results(a: xr.Dataset, b: xr.Dataset, ignore=TIME_STAMPS):
    """Assert ``a`` and ``b`` are identical (values bit for bit, NaN equal to NaN, coordinates,
    every variable's attrs and the Dataset's attrs) except the attrs named in ``ignore``."""
    strip = [k for k in ignore if k in a.attrs or k in b.attrs]
    xr.testing.assert_identical(a.drop_attrs(deep=False), b.drop_attrs(deep=False))
    for name in a.variables:
        assert np.array_equal(a[name].values, b[name].values, equal_nan=a[name].dtype.kind == "f"), name
    left = {k: v for k, v in a.attrs.items() if k not in strip}
    right = {k: v for k, v in b.attrs.items() if k not in strip}
    assert left.keys() == right.keys(), f"attrs differ: {sorted(left.keys() ^ right.keys())}"
    for key in left:
        assert np.array_equal(left[key], right[key]), f"attr {key!r}: {left[key]!r} != {right[key]!r}"


class DaskComputed(AssertionError):
    """Raised by :func:`raise_if_dask_computes` when something computes."""


@contextlib.contextmanager
def raise_if_dask_computes(max_computes=0):
    """Fail if dask computes more than ``max_computes`` times inside the block (as in flox)."""
    total = {"n": 0}

    def scheduler(dsk, keys, **kwargs):
        total["n"] += 1
        if total["n"] > max_computes:
            raise DaskComputed(f"dask computed {total['n']} time(s), {max_computes} allowed")
        return dask.get(dsk, keys, **kwargs)

    with dask.config.set(scheduler=scheduler):
        yield total
