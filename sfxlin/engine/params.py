"""Typed parameter declarations: an experiment's inputs declared once, parsed and validated once.

A :class:`Param` states a parameter's kind, bounds, unit, doc and value per profile; an
experiment's parameters are a tuple of them. :func:`configure` turns a profile and
``KEY=VALUE`` overrides into a frozen :class:`Config` whose values have their declared types
(integers as ``int``, lists as tuples, a covariance as a nested tuple), so kernels read
``config["lr"]`` without casting. Command-line text is parsed by the kind (``--set d=2,3``,
``--set Sigma=2,1,0.5`` for a diagonal, ``--set "Sigma=2,0.3;0.3,1"`` for a full matrix, rows
separated by ``;``); Python values are checked by the same rules.

Kinds: ``int``, ``float``, ``str``, ``bool``, the lists ``int_list``, ``float_list``,
``str_list``, ``matrix`` (a symmetric positive-definite matrix, given whole or as its
diagonal; stored whole), ``covariance`` (a covariance spec of :func:`sfxlin.covariance.from_spec`, its
syntax checked here and its matrix where the dimension is known, by the experiment's checks; a diagonal
given as numbers, ``--set Sigma=2,1,0.5`` or ``[2, 1, 0.5]``, is stored as the spec ``diagonal:2.0/1.0/0.5``
that builds it, and a matrix with off-diagonal entries is refused, naming the spec spellings) and ``file`` (an input file: a path, or ``file.nc:variable``; the value
is its text, ``suffixes`` the endings it may have, ``optional`` allows ``""`` or None for no
file). A file's sha256 is taken once, when the configuration is made (:attr:`Config.digests`);
it reaches every cell that reads the file as ``<name>_sha256`` (:func:`file_digests`: a changed
file gives other cells), the engine checks it again before the cell runs
(:func:`sfxlin.realdata.check_unchanged`) and the results file records it (``input_files``,
:func:`sfxlin.engine.storage.input_files`). Rules: ``low``/``high`` bounds (``low_open``/``high_open``
for strict), ``choices``, ``order`` (``"increasing"`` / ``"decreasing"``, strict) and ``min_len`` for lists,
``unique`` (no repeated list value: a grid coordinate names each cell once). ``root_seed``, the
root of every cell's generator (:func:`sfxlin.engine.sweep.cell_rng`, numpy's ``SeedSequence``, which
takes no negative integer), is ``>= 0`` whether or not its declaration says so (:data:`SEED`).
A parameter given twice in the overrides is refused, not silently resolved to the last value.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..realdata import parse_file_source, source_sha256

__all__ = ["Param", "Profiles", "Config", "configure", "parse_text", "file_digests", "digest_key", "KINDS"]

KINDS = ("int", "float", "str", "bool", "int_list", "float_list", "str_list", "matrix", "covariance", "file")

#: the parameter every experiment seeds its cells with; numpy's SeedSequence needs it >= 0
SEED = "root_seed"


class Profiles(dict):
    """A parameter's value per profile: ``Profiles(quick=[2, 3], paper=[2, 5, 10])``."""


@dataclass(frozen=True)
class Param:
    """One declared input of an experiment.

    ``value`` is the default of every profile, or a :class:`Profiles` giving one per profile.
    ``grid`` marks a parameter that only says which cells the grid has (``d``, ``n_seeds``): it
    does not reach a cell's kernel except through the cell's coordinates, so changing it keeps
    every shared cell (an extended sweep reuses them). ``parts`` names the parts of the
    experiment whose cells it reaches (None: every part). ``why`` says why a list needs
    ``min_len`` values (what the analysis fits with them). For a ``file``: ``suffixes``, the
    endings its path may have (None: any; ``.nc`` stands for ``file.nc:variable``), and
    ``optional``, whether ``""`` (or None) is allowed for no file. ``absent``: the value of a recorded
    configuration that lacks the parameter (a results file written before it existed; None: a recorded
    configuration must give it).
    """

    name: str
    kind: str
    doc: str
    value: object
    unit: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    order: str | None = None
    min_len: int = 1
    why: str = ""
    unique: bool = True
    grid: bool = False
    parts: tuple | None = None
    suffixes: tuple | None = None
    optional: bool = False
    absent: object = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"parameter {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind != "file" and (self.suffixes is not None or self.optional):
            raise ValueError(f"parameter {self.name!r}: suffixes and optional describe a file parameter; kind is "
                             f"{self.kind!r}")
        if self.order not in (None, "increasing", "decreasing"):
            raise ValueError(f"parameter {self.name!r}: order must be 'increasing' or 'decreasing'")
        if self.name == SEED and self.low is None:  # stated by rule() and checked by check() like any bound
            object.__setattr__(self, "low", 0)

    def default(self, profile):
        """The value of this parameter in ``profile``."""
        if isinstance(self.value, Profiles):
            if profile not in self.value:
                raise ValueError(f"parameter {self.name!r} has no value for profile {profile!r}")
            return self.value[profile]
        return self.value

    def rule(self) -> str:
        """The declared constraints in words (for ``sfxlin list`` and the docs)."""
        parts = [f"list of {self.kind[:-len('_list')]}" if self.kind.endswith("_list") else self.kind]
        lo = None if self.low is None else ("> " if self.low_open else ">= ") + f"{self.low:g}"
        hi = None if self.high is None else ("< " if self.high_open else "<= ") + f"{self.high:g}"
        parts += [b for b in (lo, hi) if b]
        if self.choices:
            parts.append("one of " + ", ".join(map(str, self.choices)))
        if self.kind.endswith("_list"):
            if self.order:
                parts.append(f"strictly {self.order}")
            if self.min_len > 1:
                parts.append(f"at least {self.min_len} values")
        if self.kind == "file":
            parts += [f"ending {' or '.join(self.suffixes)}"] if self.suffixes else []
            parts += ["'' for none"] if self.optional else []
        if self.unit:
            parts.append(f"unit: {self.unit}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ checking
    def check(self, value):
        """``value`` converted to the declared type and checked against every rule; a ValueError
        naming the parameter otherwise."""
        if self.kind == "file":
            return self._file(value)
        try:
            if self.kind == "matrix":
                return self._matrix(value)
            if self.kind == "covariance":
                return _covariance_spec(value)
            if self.kind.endswith("_list"):
                return self._list(value)
            return self._scalar(value, self.kind)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.name}: {exc}") from None

    def _scalar(self, value, kind):
        if kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"expected true or false, got {value!r}")
            return bool(value)
        if kind == "str":
            if not isinstance(value, str):
                raise ValueError(f"expected a string, got {value!r}")
            out = value
        elif kind == "int":
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, float, np.floating)) \
                    or not float(value).is_integer():
                raise ValueError(f"expected an integer, got {value!r}")
            out = int(value)
        else:
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
                raise ValueError(f"expected a number, got {value!r}")
            out = float(value)
            if not math.isfinite(out):
                raise ValueError(f"expected a finite number, got {value!r}")
        if self.choices is not None and out not in self.choices:
            raise ValueError(f"expected one of {list(self.choices)}, got {out!r}")
        if kind != "str":
            if self.low is not None and (out < self.low or (self.low_open and out == self.low)):
                raise ValueError(f"must be {'>' if self.low_open else '>='} {self.low:g}, got {out!r}")
            if self.high is not None and (out > self.high or (self.high_open and out == self.high)):
                raise ValueError(f"must be {'<' if self.high_open else '<='} {self.high:g}, got {out!r}")
        return out

    def _list(self, value):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, np.ndarray)):
            raise ValueError(f"expected a list, got {value!r}")
        items = tuple(self._scalar(v, self.kind[:-len("_list")]) for v in value)
        if self.unique and len(set(items)) != len(items):
            repeated = sorted({v for v in items if items.count(v) > 1}, key=str)
            raise ValueError(f"repeats the value {', '.join(map(str, repeated))}: every value must appear once, "
                             f"got {list(items)}")
        if self.order == "increasing" and any(b <= a for a, b in zip(items, items[1:])):
            raise ValueError(f"must be strictly increasing, got {list(items)}")
        if self.order == "decreasing" and any(b >= a for a, b in zip(items, items[1:])):
            raise ValueError(f"must be strictly decreasing, got {list(items)}")
        if len(items) < self.min_len:
            need = f"at least {self.min_len} values" if self.min_len > 1 else "a non-empty list"
            raise ValueError(f"needs {need}" + (f" ({self.why})" if self.why else "") + f", got {list(items)}")
        return items

    def _file(self, value) -> str:
        """The text of a file parameter's source once its form is checked and its file found; ``""``
        for none (None or ``""``, where ``optional``). The messages name the parameter."""
        if value is None or value == "":
            if not self.optional:
                raise ValueError(f"{self.name}: a file is needed, got {value!r}")
            return ""
        parse_file_source(value, self.name, self.suffixes)
        return os.fspath(value)

    def digest(self, value) -> str:
        """The sha256 of the file that ``value`` (a checked, non-empty source) names."""
        return source_sha256(value, self.name, self.suffixes)

    def _matrix(self, value):
        try:
            S = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"expected numbers, got {value!r}") from None
        if S.ndim == 1:
            S = np.diag(S)
        if S.ndim != 2 or S.shape[0] != S.shape[1] or S.size == 0:
            raise ValueError(f"expected a diagonal (list) or a square matrix, got shape {S.shape}")
        if not np.all(np.isfinite(S)):
            raise ValueError(f"entries must be finite, got {S.tolist()}")
        if not np.allclose(S, S.T, rtol=0, atol=1e-12 * max(1.0, np.abs(S).max())):
            raise ValueError(f"must be symmetric, got {S.tolist()}")
        lam = np.linalg.eigvalsh(S)
        if lam.min() <= 0:
            raise ValueError(f"must be positive definite (a covariance with an inverse); eigenvalues {lam.tolist()}")
        return tuple(tuple(float(x) for x in row) for row in S)


def parse_text(param: Param, text: str):
    """The value of ``--set NAME=TEXT`` for ``param``: JSON if it starts with ``[``, else by kind
    (lists comma-separated; a matrix's rows separated by ``;``)."""
    text = text.strip()
    if text.startswith("["):
        try:
            return param.check(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{param.name}: {text!r} is not valid JSON ({exc.msg})") from None
    kind = param.kind
    if kind == "covariance" and not text[:1].isalpha():
        kind = "matrix"   # numbers: a diagonal, or rows separated by ';'
    try:
        if kind == "matrix":
            rows = [[float(x) for x in row.split(",") if x.strip()] for row in text.split(";")]
            value = rows[0] if len(rows) == 1 else rows
        elif kind.endswith("_list"):
            value = [_scalar_text(item.strip(), kind[:-len("_list")]) for item in text.split(",") if item.strip()]
        else:
            value = _scalar_text(text, kind)
    except ValueError:
        what = f"list of {kind[:-len('_list')]}" if kind.endswith("_list") else kind
        raise ValueError(f"{param.name}: {text!r} is not a valid {what}") from None
    return param.check(value)


def _covariance_spec(value) -> str:
    """The covariance spec ``value`` names: a spec string (its syntax checked), or the spec
    ``diagonal:a/b/...`` of a diagonal given as numbers (a list, or a matrix with no off-diagonal entry)."""
    from ..covariance import parse_spec

    if isinstance(value, str):
        parse_spec(value)
        return value
    S = np.asarray(value, dtype=float)
    if S.ndim == 2 and S.shape[0] == S.shape[1] and np.array_equal(S, np.diag(np.diag(S))):
        S = np.diag(S)
    if S.ndim != 1 or S.size == 0:
        raise ValueError(f"expected a covariance spec (sfxlin.covariance.from_spec), or a diagonal, got {value!r}; a "
                         "matrix with off-diagonal entries is a spec too: a rotated spectrum "
                         "(rotated:diagonal:2/1:seed=3) or a family (kms:0.5), docs/covariance.md")
    return "diagonal:" + "/".join(repr(float(x)) for x in S)


def _scalar_text(text, kind):
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        lowered = text.lower()
        if lowered not in ("true", "false", "1", "0"):
            raise ValueError(text)
        return lowered in ("true", "1")
    return text


@dataclass(frozen=True)
class Config(Mapping):
    """A validated, immutable configuration: ``config["lr"]``, ``dict(config)``, ``config.to_json()``.

    ``profile`` and ``overrides`` say where the values came from (``"custom"`` for values given
    whole); they travel into the results file's attrs, not into any computation. ``digests``:
    ``{parameter: sha256}`` of every ``file`` parameter that names a file, taken when the
    configuration was made."""

    values: Mapping = field(default_factory=dict)
    profile: str = "custom"
    overrides: tuple = ()
    digests: Mapping = field(default_factory=dict)

    def __getitem__(self, key):
        try:
            return self.values[key]
        except KeyError:
            raise KeyError(f"no parameter {key!r}; known: {sorted(self.values)}") from None

    def __iter__(self):
        return iter(self.values)

    def __len__(self):
        return len(self.values)

    def __hash__(self):
        return hash(self.to_json())

    def __dask_tokenize__(self):
        return ("sfxlin.Config", self.to_json(), json.dumps(dict(self.digests), sort_keys=True))

    def to_json(self) -> str:
        return json.dumps(_plain(self.values), sort_keys=True)

    def __repr__(self):
        return f"Config({_plain(self.values)!r})"


def _plain(value):
    """JSON data of a configuration value (tuples as lists)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def configure(params, profile="quick", overrides=(), values=None, checks=(), name="the experiment") -> Config:
    """The configuration of ``profile`` with ``overrides`` applied, every value checked.

    ``overrides``: ``"KEY=TEXT"`` strings (the command line's ``--set``), each key at most once; ``values``: a mapping of
    Python values (e.g. a file's ``config`` attr) replacing the profile's; with ``profile=None``
    ``values`` must give every parameter but those declaring the value of their ``absent``. Every ``file`` parameter's file is hashed here, once
    (:attr:`Config.digests`). ``checks``: functions ``check(config)`` raising
    ValueError for rules that tie several parameters together. Unknown keys, and missing ones,
    are errors naming them (and ``name``, the experiment's).
    """
    table = {p.name: p for p in params}
    raw = {} if profile is None else {p.name: p.default(profile) for p in params}
    if values is not None:
        unknown = sorted(set(values) - set(table))
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown} of {name}; known: {sorted(table)}")
        if profile is None:   # a recorded configuration: what it lacks had the value of its absence
            raw.update({p.name: p.absent for p in params if p.absent is not None})
        raw.update(values)
    missing = sorted(set(table) - set(raw))
    if missing:
        raise ValueError(f"missing parameter(s) {missing}")
    parsed, given = {}, {}
    for item in overrides or ():
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        if key not in table:
            raise ValueError(f"--set {key}: unknown parameter of {name}; known: {sorted(table)}")
        if key in given:
            several = f" (several values comma-separated: --set {key}=A,B)" if table[key].kind.endswith("_list") else ""
            raise ValueError(f"--set {key}: given twice ({given[key]!r}, then {item!r}); give each parameter "
                             f"once{several}")
        given[key] = item
        try:
            parsed[key] = parse_text(table[key], text)
        except ValueError as exc:
            raise ValueError(f"--set {exc}") from None
    checked = {name: parsed[name] if name in parsed else table[name].check(raw[name]) for name in table}
    config = Config(checked, profile=profile if profile is not None and values is None else "custom",
                    overrides=tuple(overrides or ()),
                    digests={name: table[name].digest(value) for name, value in checked.items()
                             if table[name].kind == "file" and value})
    for check in checks:
        check(config)
    return config


def digest_key(name) -> str:
    """``"<name>_sha256"``: the key of a file parameter's digest among a cell's inputs."""
    return f"{name}_sha256"


def file_digests(params, config, inputs) -> dict:
    """``{digest_key(name): sha256}`` for every ``file`` parameter of ``params`` that ``inputs`` (what
    reaches a cell) holds with a file, from ``config``'s digests (no file is read). A ValueError
    naming the parameter when ``config`` took no digest of it (a plain mapping, not a
    :class:`Config` from :func:`configure`)."""
    digests = getattr(config, "digests", {})
    out = {}
    for p in params:
        if p.kind == "file" and inputs.get(p.name):
            if p.name not in digests:
                raise ValueError(f"{p.name}: the configuration took no digest of {inputs[p.name]!r}; make it with "
                                 "configure() (experiment.configure)")
            out[digest_key(p.name)] = digests[p.name]
    return out
