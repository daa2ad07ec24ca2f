"""Predeclared criteria as data, and their verdicts: PASS / FAIL / INCONCLUSIVE.

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
  all of them; the measured figure then shows ``min .. max (k/n in range)``), else FAIL.

The criteria themselves live with their experiments (``pipelines/``); this module holds the
machinery only and imports nothing but numpy.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "calibration_note",
    "criteria_from_attrs",
    "Criteria",
    "FAIL",
    "INCONCLUSIVE",
    "KINDS",
    "PASS",
    "Criterion",
    "Inconclusive",
    "Shared",
    "VerdictRow",
    "count_verdicts",
    "to_frame",
    "evaluate",
    "format_table",
    "measure_unless",
    "to_markdown",
]

PASS = "PASS"
FAIL = "FAIL"
INCONCLUSIVE = "INCONCLUSIVE"

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
    profile : the profile the threshold is calibrated for (``"paper"``): a run of another
        profile is judged by it all the same, and the tables say so.
    fmt : format spec of numbers in the measured figure (default ``".3g"``).
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
                "reference": self.reference, "reason": self.reason, "profile": self.profile, "fmt": self.fmt}

    def holds(self, values) -> np.ndarray:
        """Boolean array: which of the (finite) ``values`` satisfy the comparison."""
        v = np.asarray(values, dtype=np.float64)
        if self.kind == "in":
            low, high = self.threshold  # type: ignore[misc]
            return (v >= low) & (v <= high)
        return _OPS[self.kind](v, self.threshold)


class Criteria:
    """The criteria of one claim, each declared next to the measure it reads::

        CRITERIA = Criteria("C1")

        @CRITERIA("C1-slopes", "log-log slope of the Gaussian error in L, every (d, U_norm)",
                  "in", (-1.1, -0.9), reference="-0.982 .. -1.027", reason="the error is O(1/L)")
        def _slopes(ds):
            return slopes(ds).slope.values.ravel()

    Iterating gives the :class:`Criterion` s in declaration order (what ``build()`` stores in a
    results file); :meth:`measures` calls every measure on a results Dataset, or on what
    ``prepare(ds)`` returns (e.g. ``prepare=Shared``, when the measures share a computation);
    :meth:`verdicts` judges them. ``inconclusive(data)`` (optional, given what ``prepare``
    returns) says which criteria the data cannot decide whatever their value, ``{id: reason}``.
    """

    def __init__(self, claim, prepare=None, inconclusive=None):
        self.claim = claim
        self.prepare = prepare
        self.inconclusive = inconclusive
        self._items: list = []

    def __call__(self, id, description, kind, threshold, *, reference="", reason="", profile="paper", fmt=".3g"):
        criterion = Criterion(id=id, claim=self.claim, description=description, kind=kind, threshold=threshold,
                              reference=reference, reason=reason, profile=profile, fmt=fmt)
        if any(c.id == id for c, _ in self._items):
            raise ValueError(f"criterion {id!r} is declared twice")

        def register(measure):
            self._items.append((criterion, measure))
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

    def verdicts(self, ds, inconclusive=None) -> list:
        """The verdict rows of the criteria stored in the results file ``ds`` (predeclared when it
        was made), each measured by the measure declared here under its id; a stored criterion
        with no measure here is INCONCLUSIVE. Flagged INCONCLUSIVE whatever their value: the
        stored criteria that ``self.inconclusive`` names, and ``inconclusive`` (as in :func:`evaluate`)."""
        stored = criteria_from_attrs(ds)
        ids = {c.id for c in stored}
        data = self.prepare(ds) if self.prepare is not None else ds
        flags = {} if self.inconclusive is None else {k: v for k, v in self.inconclusive(data).items() if k in ids}
        return evaluate(stored, self._measure(data, ids), {**flags, **_flag_reasons(inconclusive)})


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
    verdict : ``"PASS"``, ``"FAIL"`` or ``"INCONCLUSIVE"``.
    note : why INCONCLUSIVE (missing, non-finite, not measurable or flagged, with the reason), else ``""``.
    """

    criterion: Criterion
    measured: object
    measured_str: str
    verdict: str
    note: str = ""

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
    return VerdictRow(crit, raw, _measured_str(crit, values, ok), PASS if ok.all() else FAIL)


def to_frame(rows: Sequence[VerdictRow]):
    """The verdict rows as a ``pandas.DataFrame`` indexed by criterion id (columns: claim,
    description, measured, threshold, reference, verdict, note): the data behind the tables."""
    import pandas as pd

    return pd.DataFrame([r.to_dict() for r in rows]).set_index("criterion")


def count_verdicts(rows: Iterable[VerdictRow]) -> dict[str, int]:
    """``{"PASS": k, "FAIL": m, "INCONCLUSIVE": j}``."""
    out = {PASS: 0, FAIL: 0, INCONCLUSIVE: 0}
    for r in rows:
        out[r.verdict] += 1
    return out


_HEADER = ("criterion", "measured", "threshold", "reference", "verdict")


def _cells(rows: Sequence[VerdictRow]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    with_note = any(r.note for r in rows)
    header = _HEADER + (("note",) if with_note else ())
    body = []
    for r in rows:
        cells = (r.id, r.measured_str, r.threshold_str, r.reference, r.verdict)
        body.append(cells + ((r.note,) if with_note else ()))
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
    return [Criterion(**{**c, "threshold": tuple(c["threshold"]) if isinstance(c["threshold"], list) else c["threshold"]})
            for c in json.loads(raw)]


def calibration_note(ds) -> str:
    """A line saying the file is judged by criteria calibrated for another profile (or ``""``)."""
    import json

    profiles = sorted({c.profile for c in criteria_from_attrs(ds)} - {"any"})
    overrides = json.loads(ds.attrs.get("overrides", "[]") or "[]")
    profile = ds.attrs.get("profile", "custom")
    if not profiles or (profiles == [profile] and not overrides):
        return ""
    run = f"profile {profile!r}" + (f" with --set {' '.join(overrides)}" if overrides else "")
    return (f"note: these criteria are calibrated for the {', '.join(profiles)} profile; this file is a {run} run, "
            "so its verdicts are indicative, not findings")
