"""Predeclared criteria as data, and their verdicts: PASS / FAIL / INCONCLUSIVE / NOT JUDGED.

A :class:`Criterion` states one check of a claim (``"C1-slopes"``: every log-log slope in
[-1.1, -0.9]) together with the reference reproduction's figure. :func:`evaluate` turns
measured figures into :class:`VerdictRow` s; :func:`format_table` and :func:`to_markdown`
print them with the measured figure beside each verdict.

Rules:

* measured value missing (``None``), empty or with any non-finite entry: INCONCLUSIVE;
* measured value an :class:`Inconclusive` (a measure that could not be taken, e.g. a fit with too
  few points): INCONCLUSIVE, its reason as the note;
* an explicit ``inconclusive`` flag for a criterion: INCONCLUSIVE (with its reason);
* otherwise PASS iff every measured value satisfies the comparison (for an array of values,
  all of them; the measured figure then shows ``min .. max (k/n in range)``), else FAIL;
* a criterion that a profile cannot judge (``quick=NotJudged("too few L ...")``: too few prompt
  lengths, too short a run) is NOT JUDGED at that profile, with the reason; a profile may also
  judge it by a threshold calibrated for it (``quick=(low, high)``).

Each PASS / FAIL carries its **robustness** (:meth:`Criteria.verdicts`): the fraction of
resamples of the file's independent units (seeds; ``Criteria(units=...)``) under which the
verdict stays the same; the resamples are a dimension, every measure called once on them all.
Below :data:`FRAGILE_BELOW` the verdict is *fragile*, whatever it is. :meth:`Criteria.seeds_needed` estimates how many units
would make it robust. A non-PASS verdict carries the class its criterion declares for it
(:data:`CLASSES`: a finding, pre-asymptotic, or a colloquial reading of the paper) and a
one-line reason. Criteria that are statistical tests declare their ``level`` and a ``pvalue``
measure: :func:`multiplicity` says how many FAILs chance alone would give and the Holm view.

The criteria themselves live with their experiments' analysis modules; this module holds the
machinery only and imports nothing but numpy (xarray where it resamples).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

__all__ = ["calibration_note", "criteria_from_attrs", "Criteria", "FAIL", "CLASSES", "UNCLASSIFIED", "FRAGILE_BELOW",
           "INCONCLUSIVE", "count_classes", "KINDS", "NOT_JUDGED", "NotJudged", "PASS", "multiplicity", "RESAMPLE",
           "resample_indices", "resampled", "Criterion", "Inconclusive", "Shared", "VerdictRow", "count_verdicts",
           "to_frame", "evaluate", "format_table", "judged_where", "measure_unless", "multiplicity_line", "to_markdown"]

PASS = "PASS"
FAIL = "FAIL"
INCONCLUSIVE = "INCONCLUSIVE"
NOT_JUDGED = "NOT JUDGED"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, NOT_JUDGED)

#: the classes of a non-PASS verdict: a result that contradicts the reading (``finding``), a rate
#: or constant not yet reached at the sizes run (``pre-asymptotic``), a criterion testing a
#: stronger reading than the paper's theorem states (``colloquial reading``).
CLASSES = ("finding", "pre-asymptotic", "colloquial reading")

#: what a FAIL or INCONCLUSIVE shows whose criterion declares no class (``fails_as``): said, not hidden
UNCLASSIFIED = "unclassified"

#: a verdict kept in fewer than this fraction of resamples of its independent units is fragile.
FRAGILE_BELOW = 0.8

#: resamples of the independent units behind each verdict's robustness (Monte Carlo SE of the
#: fraction <= 0.05).
RESAMPLES = 100


@dataclass(frozen=True)
class NotJudged:
    """A profile's declaration that it cannot judge a criterion, with the reason (``"4 prompt
    lengths: the slope's pre-asymptotic curvature is larger than the band"``)."""

    reason: str

#: comparison kinds: ``measured <kind> threshold``; ``"in"``: ``low <= measured <= high``.
KINDS = ("<", "<=", ">", ">=", "in")

_OPS = {
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


@dataclass(frozen=True, kw_only=True)
class Criterion:
    """One predeclared check of a claim.

    Attributes
    ----------
    id : unique key, e.g. ``"C1-slopes"``; the key of its measured value in :func:`evaluate`.
    claim : the claim it belongs to, e.g. ``"C1"``.
    description : one line saying what is measured, e.g. ``"log-log slope of E||f_L - f_inf||^2 in L"``.
    kind : one of :data:`KINDS`; the check is ``measured <kind> threshold``, or for ``"in"``
        ``threshold[0] <= measured <= threshold[1]`` (both ends included).
    threshold : a finite float, or a ``(low, high)`` pair for ``"in"``.
    reference : the independent reproduction's figure, e.g. ``"-0.982 .. -1.027"`` (free text;
        ``""`` when there is none).
    reason : one line saying why the threshold is set where it is.
    profile : the profile the threshold is calibrated for (``"paper"``; ``"any"``: every
        profile): a run of another profile is judged by it unless ``quick`` says otherwise.
    fmt : format spec of numbers in the measured figure (default ``".3g"``).
    quick : how the quick profile judges it: ``None`` (by ``threshold``, for criteria whose
        figure does not depend on the profile's size), a threshold of the same kind calibrated
        for the quick grid, or a :class:`NotJudged` (or its reason as a string): NOT JUDGED there.
    """

    id: str
    claim: str
    description: str
    kind: str
    threshold: float | tuple[float, float]
    reference: str = ""
    reason: str = ""
    profile: str = "paper"
    fmt: str = ".3g"
    quick: object = None

    def __post_init__(self) -> None:
        if not self.id or not isinstance(self.id, str):
            raise ValueError(f"Criterion id must be a non-empty string, got {self.id!r}")
        if self.kind not in KINDS:
            raise ValueError(f"Criterion {self.id!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "in":
            try:
                low, high = (float(t) for t in self.threshold)  # type: ignore[union-attr]
            except (TypeError, ValueError):
                raise ValueError(
                    f"Criterion {self.id!r}: kind 'in' needs a (low, high) threshold, got {self.threshold!r}"
                ) from None
            if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                raise ValueError(f"Criterion {self.id!r}: need finite low <= high, got {self.threshold!r}")
            object.__setattr__(self, "threshold", (low, high))
        else:
            try:
                thr = float(self.threshold)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(
                    f"Criterion {self.id!r}: kind {self.kind!r} needs one number as threshold, got {self.threshold!r}"
                ) from None
            if not math.isfinite(thr):
                raise ValueError(f"Criterion {self.id!r}: threshold must be finite, got {self.threshold!r}")
            object.__setattr__(self, "threshold", thr)
        format(1.0, self.fmt)  # fail early on a bad format spec
        if isinstance(self.quick, str):
            object.__setattr__(self, "quick", NotJudged(self.quick))
        if self.quick is not None and not isinstance(self.quick, NotJudged):
            self.at_threshold(self.quick)  # validated like the threshold

    def at_threshold(self, threshold) -> "Criterion":
        """The same criterion judged by another threshold (of the same kind)."""
        return replace(self, threshold=threshold, quick=None)

    def for_profile(self, profile: str) -> "Criterion | NotJudged":
        """How a run of ``profile`` is judged: this criterion, its quick calibration, or NotJudged."""
        if profile != "quick" or self.quick is None:
            return self
        return self.quick if isinstance(self.quick, NotJudged) else self.at_threshold(self.quick)

    @property
    def threshold_str(self) -> str:
        """``"< 1e-08"``, ``"in [-1.1, -0.9]"``."""
        if self.kind == "in":
            low, high = self.threshold  # type: ignore[misc]
            return f"in [{low:g}, {high:g}]"
        return f"{self.kind} {self.threshold:g}"

    def to_dict(self) -> dict:
        """The criterion as JSON data (a results file's ``criteria`` attr holds a list of these)."""
        return {"id": self.id, "claim": self.claim, "description": self.description, "kind": self.kind,
                "threshold": list(self.threshold) if self.kind == "in" else self.threshold,
                "reference": self.reference, "reason": self.reason, "profile": self.profile, "fmt": self.fmt,
                **({} if self.quick is None else {"quick": {"not_judged": self.quick.reason}
                                                  if isinstance(self.quick, NotJudged) else
                                                  list(self.quick) if self.kind == "in" else self.quick})}

    def holds(self, values) -> np.ndarray:
        """Boolean array: which of the (finite) ``values`` satisfy the comparison."""
        v = np.asarray(values, dtype=np.float64)
        if self.kind == "in":
            low, high = self.threshold  # type: ignore[misc]
            return (v >= low) & (v <= high)
        return _OPS[self.kind](v, self.threshold)


class Criteria:
    """The criteria of one claim, each declared next to the measure it reads::

        CRITERIA = Criteria("C1", units="seed")

        @CRITERIA("C1-slopes", "log-log slope of the Gaussian error in L, every (d, U_norm)",
                  "in", (-1.1, -0.9), reference="-0.982 .. -1.027", reason="the error is O(1/L)",
                  quick=(-1.3, -0.7), fails_as=("pre-asymptotic", "curvature at small L"))
        def _slopes(ds):
            return slopes(ds).slope

    A measure returns labelled values: it reduces over named dims and keeps the others, so that on
    the resamples of the units (a ``resample`` dim) it gives every resample's values at once.
    Iterating gives the :class:`Criterion` s in declaration order (what ``build()`` stores in a
    results file); :meth:`measures` calls every measure on a results Dataset, or on what
    ``prepare(ds)`` returns (e.g. ``prepare=Shared``, when the measures share a computation);
    :meth:`verdicts` judges them. ``inconclusive(data)`` (optional, given what ``prepare``
    returns) says which criteria the data cannot decide whatever their value, ``{id: reason}`` (on
    resampled data a reason may be a boolean over the resamples: those it flags).
    ``units``: the dims of a results file's independent units (seeds, independent replicates),
    resampled for each verdict's robustness.

    Declared with a criterion, beside its threshold, and read by every verdict of it (so a file
    judged anywhere shows them): ``fails_as=(class, reason)``, the class (:data:`CLASSES`) and the
    one-line reason shown beside a non-PASS verdict; ``level`` and ``pvalue(data)`` for a
    criterion that is a statistical test: the probability that it FAILs by chance alone when the
    claim holds, and the p-value of its statistic (for the Holm view of :func:`multiplicity`).
    """

    def __init__(self, claim, prepare=None, inconclusive=None, units=("seed",)):
        self.claim = claim
        self.prepare = prepare
        self.inconclusive = inconclusive
        self.units = (units,) if isinstance(units, str) else tuple(units)
        self._items: list = []
        self._declared: dict = {}

    def __call__(self, id, description, kind, threshold, *, reference="", reason="", profile="paper", fmt=".3g",
                 quick=None, fails_as=None, level=None, pvalue=None):
        criterion = Criterion(id=id, claim=self.claim, description=description, kind=kind, threshold=threshold,
                              reference=reference, reason=reason, profile=profile, fmt=fmt, quick=quick)
        if any(c.id == id for c, _ in self._items):
            raise ValueError(f"criterion {id!r} is declared twice")
        if fails_as is not None:
            cls, why = fails_as
            if cls not in CLASSES:
                raise ValueError(f"criterion {id!r}: fails_as class must be one of {CLASSES}, got {cls!r}")
        if (level is None) != (pvalue is None):
            raise ValueError(f"criterion {id!r}: a test declares both its level and its pvalue measure")
        if level is not None and not 0.0 < float(level) < 1.0:
            raise ValueError(f"criterion {id!r}: level must be in (0, 1), got {level!r}")

        def register(measure):
            self._items.append((criterion, measure))
            self._declared[id] = {"fails_as": fails_as, "level": None if level is None else float(level),
                                  "pvalue": pvalue}
            return measure

        return register

    def __iter__(self):
        return (c for c, _ in self._items)

    def __len__(self):
        return len(self._items)

    def _measure(self, data, ids=None) -> dict:
        return {c.id: measure(data) for c, measure in self._items if ids is None or c.id in ids}

    def measures(self, ds, ids=None) -> dict:
        """``{criterion id: measured value}`` of every declared measure (or of those in ``ids``) on ``ds``."""
        return self._measure(self.prepare(ds) if self.prepare is not None else ds, ids)

    def _judge(self, ds, stored, inconclusive, with_pvalues=False) -> list:
        """The verdict rows of the ``stored`` criteria on ``ds`` (before robustness)."""
        profile = ds.attrs.get("profile", "custom")
        judged = [c.for_profile(profile) for c in stored]
        not_judged = {c.id: j.reason for c, j in zip(stored, judged) if isinstance(j, NotJudged)}
        live = [j for j in judged if not isinstance(j, NotJudged)]
        ids = {c.id for c in live}
        data = self.prepare(ds) if self.prepare is not None else ds
        flags = {} if self.inconclusive is None else {k: v for k, v in self.inconclusive(data).items() if k in ids}
        rows = {r.id: r for r in evaluate(live, self._measure(data, ids), {**flags, **_flag_reasons(inconclusive)})}
        out = []
        for c in stored:
            row = rows.get(c.id) or VerdictRow(c, None, "n/a", NOT_JUDGED, f"not judged at the {profile} profile: "
                                                                                f"{not_judged[c.id]}")
            declared = self._declared.get(c.id, {})
            if with_pvalues and declared.get("pvalue") is not None and row.verdict in (PASS, FAIL):
                row = replace(row, pvalue=float(declared["pvalue"](data)))
            out.append(replace(row, fails_as=declared.get("fails_as") if row.verdict in (FAIL, INCONCLUSIVE) else None,
                               level=declared.get("level")))
        return out

    def verdicts(self, ds, inconclusive=None, *, resamples: int = RESAMPLES) -> list:
        """The verdict rows of the criteria stored in the results file ``ds`` (predeclared when it
        was made), each measured by the measure declared here under its id; a stored criterion
        with no measure here is INCONCLUSIVE. Flagged INCONCLUSIVE whatever their value: the
        stored criteria that ``self.inconclusive`` names, and ``inconclusive`` (as in :func:`evaluate`).
        A quick file is judged by each criterion's quick calibration (NOT JUDGED where it has none).

        Every PASS / FAIL carries its robustness: the fraction of ``resamples`` resamples (with
        replacement) of the units ``self.units`` present in ``ds`` under which the verdict is the
        same (0: none computed). The resamples are a dimension (:func:`resample_indices`,
        :func:`resampled`): each measure is called once on every resample at once. When the units
        have at most ``resamples`` distinct resamples (2 seeds: 4), every one is judged: the exact
        bootstrap fraction. Otherwise they are drawn from a generator keyed by the claim, so the
        fraction is the same at every call."""
        stored = criteria_from_attrs(ds)
        rows = self._judge(ds, stored, inconclusive, with_pvalues=True)
        return self._with_robustness(ds, stored, rows, inconclusive, resamples)

    def _with_robustness(self, ds, stored, rows, inconclusive, resamples, size=None) -> list:
        """``rows`` with the robustness of each PASS / FAIL over ``resamples`` resamples of the units
        (``size[u]`` draws of unit dim ``u``, default as many as there are)."""
        units = [u for u in self.units if u in ds.dims]
        if resamples <= 0:
            return rows
        if not units or max(ds.sizes[u] for u in units) < 2:
            why = "one independent unit: no resample" if units else "no independent units in the file"
            return [replace(r, robustness_note=why) if r.verdict in (PASS, FAIL) else r for r in rows]
        idx = resample_indices({u: ds.sizes[u] for u in units}, resamples, self.claim, size)
        grow = {u: (size or {}).get(u, ds.sizes[u]) / ds.sizes[u] for u in units}
        per = sum(v.nbytes * math.prod(grow[u] for u in units if u in v.dims) for v in ds.variables.values()
                  if set(v.dims) & set(units))
        R = idx[units[0]].sizes[RESAMPLE]
        step = max(1, int(_RESAMPLED_BYTES // max(per, 1)))
        sizes = {r.id: np.size(r.measured) if not isinstance(r.measured, Inconclusive) else 0 for r in rows}
        parts = [self._judge_resamples(resampled(ds, {u: i[start:start + step] for u, i in idx.items()}), stored,
                                       inconclusive, sizes) for start in range(0, R, step)]
        again = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return [replace(r, robustness=float(np.mean(again[r.id] == r.verdict))) if r.verdict in (PASS, FAIL) else r
                for r in rows]

    def _judge_resamples(self, data, stored, inconclusive, sizes) -> dict:
        """``{id: verdicts (resample,)}`` of the criteria judged on ``data`` (resamples of a file's
        units along :data:`RESAMPLE`): each measure called once on every resample, each resample's
        values judged as :func:`evaluate` judges a file's; ``sizes``: ``{id: number of values}`` the
        measures gave on the file."""
        import xarray as xr

        R = data.sizes[RESAMPLE]
        live = [j for j in (c.for_profile(data.attrs.get("profile", "custom")) for c in stored)
                if not isinstance(j, NotJudged)]
        shared = self.prepare(data) if self.prepare is not None else data
        flags = dict(_flag_reasons(inconclusive))
        if self.inconclusive is not None:
            flags.update(self.inconclusive(shared))
        measures = dict((c.id, m) for c, m in self._items)
        out = {}
        for crit in live:
            value = measures[crit.id](shared) if crit.id in measures else None
            verdict = _resample_verdicts(crit, value, R, sizes.get(crit.id, 0))
            flag = flags.get(crit.id)
            if flag is not None:
                flagged = flag.values if isinstance(flag, xr.DataArray) else np.ones(R, dtype=bool)
                verdict = np.where(flagged, INCONCLUSIVE, verdict)
            out[crit.id] = verdict
        return out

    def seeds_needed(self, ds, ids=None, *, target: float = FRAGILE_BELOW, factors=(2, 4, 8, 16),
                     resamples: int = RESAMPLES) -> dict:
        """How many independent units would make each verdict robust, measured: for each factor
        ``k``, ``k G`` units are drawn with replacement from the ``G`` stored ones (``G`` per unit
        dim) and every measure rerun; the answer is the smallest ``k G`` whose verdicts agree with
        the stored one in at least ``target`` of the resamples (``None``: not within
        ``factors[-1] G``). A power estimate from the stored per-unit spread: it cannot see
        a spread the stored units do not show. ``{id: {unit dim: units needed} or None}``, for
        ``ids`` (default: every fragile PASS / FAIL); every unit dim grows by the same factor."""
        stored = criteria_from_attrs(ds)
        rows = self.verdicts(ds, resamples=resamples)
        if ids is None:
            ids = [r.id for r in rows if r.fragile]
        units = [u for u in self.units if u in ds.dims]
        out = {i: None for i in ids}
        left = set(ids)
        for k in factors:
            if not left:
                break
            size = {u: k * ds.sizes[u] for u in units}
            grown = self._with_robustness(ds, stored, rows, None, resamples, size=size)
            for r in grown:
                if r.id in left and r.robustness is not None and r.robustness >= target:
                    out[r.id] = dict(size)
                    left.discard(r.id)
        return out


def _resample_verdicts(crit: Criterion, value, R: int, alone: int) -> np.ndarray:
    """The verdict of ``crit`` in each of ``R`` resamples from its measured ``value``: an
    :class:`Inconclusive` or None (INCONCLUSIVE in all), values with a :data:`RESAMPLE` dim (one set
    per resample), or values without one (a measure that reads no unit: the same in every resample);
    each set judged as :func:`evaluate` judges a file's (INCONCLUSIVE when empty or not all finite).
    ``alone``: the number of values the measure gives on the file; values without a resample dim
    that are more than that are the resamples' values unlabelled: a ValueError naming the criterion."""
    import xarray as xr

    if value is None or isinstance(value, Inconclusive):
        return np.full(R, INCONCLUSIVE, dtype=object)
    if isinstance(value, xr.DataArray) and RESAMPLE in value.dims:
        v = np.asarray(value.transpose(RESAMPLE, ...).values, dtype=np.float64).reshape(R, -1)
    else:
        flat = _as_values(crit, value)
        if flat.size > max(alone, 1):
            raise ValueError(f"the measure of {crit.id!r} returned {flat.size} values without a {RESAMPLE!r} dim on "
                             f"resampled data ({alone} on the file): a measure keeps the dims it does not reduce "
                             f"(xarray reductions over named dims, not .values.ravel())")
        v = np.broadcast_to(flat, (R, flat.size))
    if v.shape[1] == 0:
        return np.full(R, INCONCLUSIVE, dtype=object)
    ok = crit.holds(v).all(axis=1)
    return np.where(~np.isfinite(v).all(axis=1), INCONCLUSIVE, np.where(ok, PASS, FAIL)).astype(object)


#: the dimension of the resamples of a file's units (the robustness judges them all at once)
RESAMPLE = "resample"

#: resamples judged at once at most, such that the resampled variables hold at most this many bytes
_RESAMPLED_BYTES = 1 << 30


def substream_key(text: str) -> int:
    """A stable integer key of ``text`` (the resamples of a claim's robustness draw from it)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def resample_indices(sizes: Mapping[str, int], resamples: int, key: str,
                     size: Mapping[str, int] | None = None) -> dict:
    """The resamples with replacement of the units, as indices: ``{unit dim: DataArray (resample,
    unit dim)}``, row ``r`` the positions drawn in resample ``r`` (``size[u]`` of them, default as
    many as there are). Every equally likely resample when there are at most ``resamples`` of
    them and ``size`` keeps the sizes (2 seeds: 4; 3 seeds: 27): the exact bootstrap. Otherwise
    ``resamples`` draws of a generator keyed by ``key`` (:func:`substream_key`), one unit dim after
    the other within a resample, so the same key gives the same resamples."""
    import itertools

    import xarray as xr

    sizes = dict(sizes)
    grown = {u: (size or {}).get(u, n) for u, n in sizes.items()}
    if grown == sizes and math.prod(n**n for n in sizes.values()) <= resamples:
        per_dim = [list(itertools.product(range(n), repeat=n)) for n in sizes.values()]
        rows = list(itertools.product(*per_dim))
        draws = {u: np.array([r[k] for r in rows], dtype=np.int64).reshape(len(rows), n)
                 for k, (u, n) in enumerate(sizes.items())}
    else:
        rng = np.random.default_rng(substream_key(key))
        picked = [[rng.integers(0, n, grown[u]) for u, n in sizes.items()] for _ in range(resamples)]
        draws = {u: np.stack([p[k] for p in picked]) for k, u in enumerate(sizes)}
    return {u: xr.DataArray(a, dims=(RESAMPLE, u)) for u, a in draws.items()}


def resampled(ds, indices: Mapping):
    """``ds`` with each unit dim of ``indices`` (:func:`resample_indices`) resampled: the variables
    with a unit dim gain a :data:`RESAMPLE` dim (``ds.isel(seed=idx)``, the xskillscore pattern), the
    others are as they are. The units' own coordinates are dropped (a resample repeats labels, and a
    measure must not select units by label)."""
    return ds.drop_vars([u for u in indices if u in ds.coords]).isel(dict(indices))


class Shared:
    """A results Dataset with the computations that several measures (or tables) read, each made
    at most once: ``sh(f, *args)`` is ``f(sh.ds, *args)``, computed on the first call and kept
    (keyed by ``f`` and ``args``, which must be hashable). ``Criteria(claim, prepare=Shared)`` gives
    every measure of one file the same ``Shared``, so a fit read by several of them is done once."""

    def __init__(self, ds):
        self.ds = ds
        self._kept: dict = {}

    def __call__(self, f, *args):
        key = (f, args)
        if key not in self._kept:
            self._kept[key] = f(self.ds, *args)
        return self._kept[key]


@dataclass(frozen=True)
class Inconclusive:
    """A measured value that could not be taken, with the reason, e.g.
    ``Inconclusive("needs >= 3 prompt lengths for a log-log slope, got 1")``: :func:`evaluate`
    reports its criterion INCONCLUSIVE with ``reason`` as the note."""

    reason: str


def judged_where(values, keep, dims, empty: str):
    """The values of a measure at the cells ``keep`` selects (both DataArrays over ``dims``), or
    ``Inconclusive(empty)`` when it selects none. On a file: the kept values. On resampled data (a
    :data:`RESAMPLE` dim, where the kept cells may differ between resamples): per resample the
    smallest and the largest kept value, which every comparison judges as it judges all of them
    (NaN where a kept value is not finite or none is kept: INCONCLUSIVE, as on a file)."""
    import xarray as xr

    values, keep = xr.broadcast(values, keep)
    if RESAMPLE not in values.dims:
        kept = values.values[keep.values]
        return Inconclusive(empty) if kept.size == 0 else kept
    inside = values.where(keep)
    bad = (keep & ~np.isfinite(values)).any(dims) | ~keep.any(dims)
    ends = xr.concat([inside.min(dims), inside.max(dims)], dim="end")
    return ends.where(~bad)


def measure_unless(reason: str | None, compute):
    """``compute()``, or ``Inconclusive(reason)`` (without calling it) when ``reason`` is given."""
    return compute() if reason is None else Inconclusive(reason)


@dataclass(frozen=True, eq=False)
class VerdictRow:
    """One line of a verdict table.

    Attributes
    ----------
    criterion : the :class:`Criterion` evaluated.
    measured : the measured value as given (float, array, None or :class:`Inconclusive`).
    measured_str : the measured figure as printed (``"-0.99"``, ``"-1.03 .. -0.97 (9/9 in range)"``, ``"n/a"``).
    verdict : ``"PASS"``, ``"FAIL"``, ``"INCONCLUSIVE"`` or ``"NOT JUDGED"``.
    note : why INCONCLUSIVE or NOT JUDGED (missing, non-finite, not measurable, flagged, not
        judged at this profile, with the reason); for a FAIL of a labelled measure, where it fails
        (the coordinates of its failing values); else ``""``.
    robustness : the fraction of resamples of the independent units that give the same verdict
        (PASS / FAIL only; None when not computed, ``robustness_note`` then says why).
    fails_as : ``(class, reason)`` declared for a non-PASS verdict of this criterion, or None.
    level, pvalue : for a criterion that is a statistical test: its level and the p-value of its
        statistic in this file (None otherwise).
    """

    criterion: Criterion
    measured: object
    measured_str: str
    verdict: str
    note: str = ""
    robustness: float | None = None
    robustness_note: str = ""
    fails_as: tuple | None = None
    level: float | None = None
    pvalue: float | None = None

    @property
    def fragile(self) -> bool:
        """True when the verdict holds in fewer than :data:`FRAGILE_BELOW` of the resamples."""
        return self.robustness is not None and self.robustness < FRAGILE_BELOW

    @property
    def robustness_str(self) -> str:
        """``"0.97"``, ``"0.62 fragile"``, or ``""`` (not computed)."""
        if self.robustness is None:
            return ""
        return f"{self.robustness:.2f}" + (" fragile" if self.fragile else "")

    @property
    def class_name(self) -> str:
        """The declared class of a FAIL or INCONCLUSIVE (:data:`CLASSES`), :data:`UNCLASSIFIED` where its
        criterion declares none, ``""`` for another verdict without one."""
        if self.fails_as is not None:
            return self.fails_as[0]
        return UNCLASSIFIED if self.verdict in (FAIL, INCONCLUSIVE) else ""

    @property
    def class_str(self) -> str:
        """``"pre-asymptotic: curvature at small L"``, :data:`UNCLASSIFIED` (a FAIL or INCONCLUSIVE whose
        criterion declares no class), or ``""``."""
        return self.class_name if self.fails_as is None else f"{self.fails_as[0]}: {self.fails_as[1]}"

    @property
    def id(self) -> str:
        return self.criterion.id

    @property
    def claim(self) -> str:
        return self.criterion.claim

    @property
    def threshold_str(self) -> str:
        return self.criterion.threshold_str

    @property
    def reference(self) -> str:
        return self.criterion.reference

    def to_dict(self) -> dict:
        """Plain strings, for JSON or a netCDF attribute."""
        return {
            "criterion": self.id,
            "claim": self.claim,
            "description": self.criterion.description,
            "measured": self.measured_str,
            "threshold": self.threshold_str,
            "reference": self.reference,
            "verdict": self.verdict,
            "note": self.note,
            "robustness": "" if self.robustness is None else f"{self.robustness:.2f}",
            "fragile": "yes" if self.fragile else "",
            "class": self.class_name,
            "class_reason": "" if self.fails_as is None else self.fails_as[1],
        }


def _measured_str(crit: Criterion, values: np.ndarray, ok: np.ndarray | None) -> str:
    """Printed measured figure; ``ok`` is None when some values are non-finite."""
    f = crit.fmt
    if values.size == 1:
        return format(float(values.ravel()[0]), f)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return f"all {values.size} non-finite"
    span = f"{format(float(finite.min()), f)} .. {format(float(finite.max()), f)}"
    if ok is None:
        return f"{span} ({values.size - finite.size}/{values.size} non-finite)"
    cond = "in range" if crit.kind == "in" else f"{crit.kind} {crit.threshold:g}"
    return f"{span} ({int(ok.sum())}/{ok.size} {cond})"


def _as_values(crit: Criterion, value) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise TypeError(f"measured value for {crit.id!r} must be a number, an array of numbers or None, got {value!r}")
    if hasattr(value, "values") and not isinstance(value, np.ndarray):  # xarray / pandas
        value = value.values
    try:
        return np.asarray(value, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise TypeError(
            f"measured value for {crit.id!r} must be a number, an array of numbers or None, got {value!r}"
        ) from None


def evaluate(
    criteria: Sequence[Criterion],
    measured: Mapping[str, object],
    inconclusive: Mapping[str, str] | Iterable[str] | None = None,
) -> list[VerdictRow]:
    """Verdict of every criterion, in the order given.

    Parameters
    ----------
    criteria : the predeclared criteria (ids unique).
    measured : ``{criterion id: float | array of floats | None | Inconclusive}``. A criterion absent
        from ``measured`` or measured as None, empty, non-finite or :class:`Inconclusive` (note: its
        reason) is INCONCLUSIVE. Keys that name no
        criterion are an error (a typo must not turn a verdict into INCONCLUSIVE silently).
    inconclusive : criteria to report INCONCLUSIVE whatever their value: ``{id: reason}`` or
        an iterable of ids (e.g. a bound that was vacuous in this run).

    Returns
    -------
    list of :class:`VerdictRow`: PASS iff every measured value satisfies the comparison.
    """
    ids = [c.id for c in criteria]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"duplicate criterion ids: {dup}")
    unknown = sorted(set(measured) - set(ids))
    if unknown:
        raise ValueError(f"measured values for unknown criteria {unknown}; known: {ids}")
    flags = _flag_reasons(inconclusive)
    unknown = sorted(set(flags) - set(ids))
    if unknown:
        raise ValueError(f"inconclusive flags for unknown criteria {unknown}; known: {ids}")

    rows = []
    for crit in criteria:
        raw = measured.get(crit.id)
        row = _row(crit, raw)
        if crit.id in flags:
            reason = flags[crit.id]
            note = "flagged inconclusive" + (f": {reason}" if reason else "")
            row = VerdictRow(crit, raw, row.measured_str, INCONCLUSIVE, note)
        rows.append(row)
    return rows


def _flag_reasons(inconclusive) -> dict[str, str]:
    """``{id: reason}`` of ``inconclusive`` given as a mapping, an iterable of ids or None."""
    if inconclusive is None:
        return {}
    if isinstance(inconclusive, Mapping):
        return {k: str(v) for k, v in inconclusive.items()}
    return {k: "" for k in inconclusive}


def _row(crit: Criterion, raw) -> VerdictRow:
    """The verdict of one criterion from its measured value (before any flag)."""
    if isinstance(raw, Inconclusive):
        return VerdictRow(crit, raw, "n/a", INCONCLUSIVE, raw.reason)
    values = _as_values(crit, raw)
    if values is None:
        return VerdictRow(crit, raw, "n/a", INCONCLUSIVE, "not measured")
    if values.size == 0:
        return VerdictRow(crit, raw, "n/a", INCONCLUSIVE, "no measured values")
    if not np.all(np.isfinite(values)):
        bad = int(np.count_nonzero(~np.isfinite(values)))
        return VerdictRow(crit, raw, _measured_str(crit, values, None), INCONCLUSIVE, f"{bad}/{values.size} non-finite")
    ok = crit.holds(values)
    if ok.all():
        return VerdictRow(crit, raw, _measured_str(crit, values, ok), PASS)
    return VerdictRow(crit, raw, _measured_str(crit, values, ok), FAIL, _where_fails(raw, ok))


#: the failing cells a FAIL's note names at most
NAMED_FAILS = 3


def _where_fails(raw, ok: np.ndarray) -> str:
    """For a labelled measure (an xarray DataArray with dims): ``"fails at d = 16, seed = 1; ..."``, the
    coordinates of its first :data:`NAMED_FAILS` failing values (``and k more``); ``""`` otherwise."""
    dims = getattr(raw, "dims", ())
    if not dims or int(np.prod(raw.shape)) != ok.size:
        return ""
    bad = np.argwhere(~ok.reshape(raw.shape))

    def name(dim, i):
        value = raw[dim].values[i] if dim in raw.coords else i
        return f"{dim} = {value.item() if hasattr(value, 'item') else value}"

    cells = "; ".join(", ".join(name(dim, i) for dim, i in zip(dims, index)) for index in bad[:NAMED_FAILS])
    more = f" and {len(bad) - NAMED_FAILS} more" if len(bad) > NAMED_FAILS else ""
    return f"fails at {cells}{more}"


def to_frame(rows: Sequence[VerdictRow]):
    """The verdict rows as a ``pandas.DataFrame`` indexed by criterion id (columns: claim,
    description, measured, threshold, reference, verdict, note, robustness, fragile, class,
    class_reason): the data behind the tables."""
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in rows]).set_index("criterion")


def count_classes(rows: Iterable[VerdictRow], verdict: str = FAIL) -> dict[str, int]:
    """``{class: k}`` over the rows of ``verdict`` (FAIL by default): every class of :data:`CLASSES`
    (0 included) and :data:`UNCLASSIFIED` (where no class is declared)."""
    out = {c: 0 for c in (*CLASSES, UNCLASSIFIED)}
    for r in rows:
        if r.verdict == verdict:
            out[r.class_name] += 1
    return out


def count_verdicts(rows: Iterable[VerdictRow]) -> dict[str, int]:
    """``{"PASS": k, "FAIL": m, "INCONCLUSIVE": j, "NOT JUDGED": i, "fragile": f}``."""
    out = {v: 0 for v in VERDICTS}
    out["fragile"] = 0
    for r in rows:
        out[r.verdict] += 1
        out["fragile"] += r.fragile
    return out


def multiplicity(rows: Sequence[VerdictRow]) -> dict:
    """What many criteria judged at once mean: ``judged`` (PASS or FAIL), ``tests`` (of those, the
    criteria that are statistical tests at a stated level), ``chance_fails`` (the FAILs chance
    alone would give among them if every claim held: the sum of their levels), ``fails`` (their
    FAILs) and ``holm_fails`` (their FAILs once the p-values are Holm-adjusted over the tests,
    each against its level: ``statsmodels.stats.multitest.multipletests(method="holm")``),
    ``holm`` ``{id: adjusted p-value}``, and for every criterion (tests or bounds on a point
    estimate) ``flips``: the number of verdicts a new draw of the independent units would change,
    expected from their robustness (the sum of ``1 - robustness`` over the rows that have one),
    with ``with_robustness`` the number of those rows; ``all_fails``: every FAIL, tests or not."""
    judged = [r for r in rows if r.verdict in (PASS, FAIL)]
    tests = [r for r in judged if r.level is not None and r.pvalue is not None]
    out = {"judged": len(judged), "all_fails": sum(r.verdict == FAIL for r in judged), "tests": len(tests),
           "chance_fails": float(sum(r.level for r in tests)),
           "fails": sum(r.verdict == FAIL for r in tests), "holm_fails": 0, "holm": {},
           "flips": float(sum(1.0 - r.robustness for r in judged if r.robustness is not None)),
           "with_robustness": sum(r.robustness is not None for r in judged)}
    if tests:
        from statsmodels.stats.multitest import multipletests

        adjusted = multipletests([r.pvalue for r in tests], method="holm")[1]
        out["holm"] = {r.id: float(p) for r, p in zip(tests, adjusted)}
        out["holm_fails"] = int(sum(p < r.level for r, p in zip(tests, adjusted)))
    return out


def multiplicity_line(rows: Sequence[VerdictRow]) -> str:
    """``"9 criteria judged, 3 FAIL; of the 9, 2 are statistical tests at a stated level (the other 7
    compare an estimate with a band): if every claim held, chance alone would give 0.0063 FAILs among
    the 2 tests (the sum of their levels); they give 0 (0 after Holm); a new draw of the independent
    units would change about 0.4 of the 9 verdicts with a robustness (the sum of 1 - robustness)"``:
    every FAIL is counted first, so that the tests' FAILs cannot be read as the FAIL count."""
    m = multiplicity(rows)
    line = f"{m['judged']} criteria judged, {m['all_fails']} FAIL"
    if m["tests"]:
        one = m["tests"] == 1
        line += (f"; of the {m['judged']}, {m['tests']} {'is a statistical test' if one else 'are statistical tests'}"
                 f" at a stated level ({_others(m['judged'] - m['tests'])} an estimate with a band): if "
                 f"every claim held, chance alone would give {m['chance_fails']:.2g} FAILs among the "
                 f"{'test (its level)' if one else str(m['tests']) + ' tests (the sum of their levels)'}; "
                 f"{'it gives' if one else 'they give'} {m['fails']} ({m['holm_fails']} after Holm)")
    if m["with_robustness"]:
        line += (f"; a new draw of the independent units would change about {m['flips']:.1f} of the "
                 f"{m['with_robustness']} verdicts with a robustness (the sum of 1 - robustness)")
    return line


def _others(n: int) -> str:
    return "the other one compares" if n == 1 else f"the other {n} compare"


_HEADER = ("criterion", "measured", "threshold", "reference", "verdict", "robust")


def _cells(rows: Sequence[VerdictRow]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    with_note = any(r.note or r.fails_as for r in rows)
    header = _HEADER + (("note",) if with_note else ())
    body = []
    for r in rows:
        cells = (r.id, r.measured_str, r.threshold_str, r.reference, r.verdict, r.robustness_str)
        note = "; ".join(x for x in (r.class_str, r.note) if x)
        body.append(cells + ((note,) if with_note else ()))
    return header, body


def format_table(rows: Sequence[VerdictRow]) -> str:
    """Aligned plain-text table: criterion, measured, threshold, reference, verdict (and note if any)."""
    header, body = _cells(rows)
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(c) for c in body)])


def to_markdown(rows: Sequence[VerdictRow]) -> str:
    """GitHub-flavoured markdown table with the columns of :func:`format_table`."""
    header, body = _cells(rows)

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *(line(c) for c in body)])


def criteria_from_attrs(ds) -> list[Criterion]:
    """The predeclared criteria stored with a results file (JSON list in ``attrs['criteria']``)."""
    import json

    raw = ds.attrs.get("criteria")
    if raw is None:
        raise ValueError("results file carries no 'criteria' attribute")
    return [Criterion(**{**c, "threshold": _threshold(c["threshold"]), "quick": _quick(c.get("quick"))})
            for c in json.loads(raw)]


def _threshold(raw):
    return tuple(raw) if isinstance(raw, list) else raw


def _quick(raw):
    """A stored quick calibration: None, a threshold, or ``{"not_judged": reason}``."""
    if isinstance(raw, dict):
        return NotJudged(raw["not_judged"])
    return None if raw is None else _threshold(raw)


def calibration_note(ds) -> str:
    """The banner of a file that is not a paper run (or ``""``): a quick run is a smoke test of the
    install, judged by the criteria's quick calibration; a run with ``--set`` overrides, or of a
    profile no criterion is calibrated for, is judged by criteria calibrated for another profile."""
    import json

    profiles = sorted({c.profile for c in criteria_from_attrs(ds)} - {"any"})
    overrides = json.loads(ds.attrs.get("overrides", "[]") or "[]")
    profile = ds.attrs.get("profile", "custom")
    if profile == "quick" and not overrides:
        return ("note: quick profile, a smoke test of the install: judged by thresholds calibrated for the quick grid "
                "(NOT JUDGED where it is too small to judge); the claims are judged at the paper profile")
    if profile == "quick":   # judged as a quick run (Criterion.for_profile), on a grid the calibration did not see
        return (f"note: custom run: quick profile with --set {' '.join(overrides)}: judged by thresholds calibrated for "
                "the quick grid, which these overrides change, so its verdicts are indicative, not findings; the claims "
                "are judged at the paper profile")
    if not profiles or (profiles == [profile] and not overrides):
        return ""
    run = f"profile {profile!r}" + (f" with --set {' '.join(overrides)}" if overrides else "")
    return (f"note: custom run: these criteria are calibrated for the {', '.join(profiles)} profile; this file is a {run} "
            "run, so its verdicts are indicative, not findings")
