"""A ``file`` parameter: its value is a path (or ``file.nc:variable``), its sha256 is taken once when
the configuration is made, it reaches the fingerprint of every cell that reads the file, it is
checked again in the cell, and the results file lists it in ``input_files`` because of its
declared kind, not because of the shape of its text."""
from __future__ import annotations

import hashlib
import json
import os

import dask
import numpy as np
import pytest

import sfxlin.realdata
from sfxlin.engine.cellstore import CellStore, cell_fingerprint
from sfxlin.engine.params import Param, configure, parse_text
from sfxlin.pipelines import c1_limit
from sfxlin.engine.storage import changed_input_files, input_files, provenance
from sfxlin.engine.sweep import Experiment, Out, Part, Variable, build, run_cell

C1_SMALL = {"d": [2], "U_norm": [0.3], "n_seeds": 2, "L": [8, 16, 32], "n_queries": 2, "n_prompts": 2,
            "query_chunk": 1, "laws": ["gaussian"]}


def _sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _rewrite(path, data: bytes):
    """Write ``data`` over ``path`` as a later edit would: the modification time moves on (digests are
    cached per process by path, size and times; two writes within one clock tick could share one)."""
    st = os.stat(path)
    with open(path, "wb") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


# ------------------------------------------------------------------ a toy experiment reading a file
PARAMS = (
    Param("weights", "file", "a raw float64 file (any suffix); '' for none", "", optional=True),
    Param("note", "str", "a string that merely looks like a token file", "x.npy"),
    Param("n_seeds", "int", "replicates", 2, low=1, grid=True),
    Param("root_seed", "int", "root seed", 1),
)


def _total(cell, rng, inputs):
    """The sum of the float64 values in the ``weights`` file, once per seed."""
    return {"total": np.fromfile(inputs["weights"], dtype=np.float64).sum()}


TOY = Experiment(name="file_toy", params=PARAMS, inner_coords=lambda config: {},
                 variables=(Variable("total", ("seed",), "sum of the file", "sum of the float64 values"),),
                 parts=(Part("", lambda config: {"seed": list(range(config["n_seeds"]))}, _total),))


@pytest.fixture
def weights(tmp_path):
    """A file of three float64 values under an unusual suffix, and a ``.npy``-named file beside it."""
    path = tmp_path / "weights.f64"
    np.array([1.0, 2.0, 4.0]).tofile(path)
    np.save(tmp_path / "x.npy", np.zeros(2))
    return path


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "emb.npy"
    np.save(path, np.random.default_rng(4).standard_normal((30, 2)))
    return path


@pytest.fixture
def count_hashes(monkeypatch):
    """Every call to :func:`sfxlin.realdata.file_sha256` (through which every digest is taken)."""
    calls = []
    real = sfxlin.realdata.file_sha256
    monkeypatch.setattr(sfxlin.realdata, "file_sha256", lambda path: calls.append(str(path)) or real(path))
    return calls


def test_the_digest_is_taken_once_when_the_configuration_is_made(tokens, count_hashes, tmp_path):
    config = c1_limit.EXPERIMENT.configure(profile=None, values={**c1_limit.EXPERIMENT.configure("quick"), **C1_SMALL,
                                                                  "tokens": str(tokens)})
    assert count_hashes == [str(tokens)]
    assert config.digests == {"tokens": _sha256(tokens)}
    # what follows reads the digest the configuration took: the fingerprints of every cell of every
    # part, a cell store, the lazy Dataset and its provenance, the replace check
    cells = [{"d": 2, "U_norm": 0.3, "seed": s} for s in (0, 1)]
    prints = {cell_fingerprint(c1_limit.EXPERIMENT, config, cell) for cell in cells}
    CellStore(tmp_path / "cells", c1_limit.EXPERIMENT, config)
    ds = build(c1_limit.EXPERIMENT, config)
    recorded = ds.attrs["input_files"]
    assert changed_input_files(recorded, config) == []
    assert len(prints) == 2 and count_hashes == [str(tokens)]
    # each cell checks the file again before it reads it
    run_cell(c1_limit.EXPERIMENT, config, cells[0])
    after_one = len(count_hashes)
    run_cell(c1_limit.EXPERIMENT, config, cells[1])
    assert 1 < after_one < len(count_hashes)


def test_a_file_changed_between_configure_and_the_cell_is_refused_naming_the_parameter(weights):
    config = TOY.configure(profile=None, values={"weights": str(weights), "note": "x.npy", "n_seeds": 2,
                                                 "root_seed": 1})
    assert run_cell(TOY, config, {"seed": 0})["total"] == 7.0
    old = _sha256(weights)
    _rewrite(weights, np.array([1.0, 2.0, 8.0, 16.0]).tobytes())
    with pytest.raises(ValueError) as info:
        run_cell(TOY, config, {"seed": 1})
    message = str(info.value)
    assert message.startswith(f"file_toy[seed=1]: weights: {str(weights)!r} changed since the run was configured")
    assert f"sha256 {old[:12]} -> {_sha256(weights)[:12]}" in message and "\n" not in message
    # configured again, the new content is the run's
    again = TOY.configure(profile=None, values={**config})
    assert run_cell(TOY, again, {"seed": 1})["total"] == 27.0


def test_the_fingerprint_holds_the_digest(weights):
    values = {"weights": str(weights), "note": "x.npy", "n_seeds": 1, "root_seed": 1}
    config = TOY.configure(profile=None, values=values)
    assert TOY.cell_inputs(config, {"seed": 0}) == {"weights": str(weights), "note": "x.npy", "root_seed": 1,
                                                    "weights_sha256": _sha256(weights)}
    before = cell_fingerprint(TOY, config, {"seed": 0})
    _rewrite(weights, np.array([3.0]).tobytes())
    edited = TOY.configure(profile=None, values=values)  # the same values, another content
    assert edited.to_json() == config.to_json() and edited != config
    assert cell_fingerprint(TOY, edited, {"seed": 0}) != before
    assert dask.base.tokenize(edited) != dask.base.tokenize(config)  # the lazy blocks are other tasks too


def test_a_plain_mapping_holds_no_digest_and_is_refused_where_a_cell_reads_the_file(weights):
    plain = {"weights": str(weights), "note": "x.npy", "n_seeds": 1, "root_seed": 1}
    with pytest.raises(ValueError, match=r"^weights: the configuration took no digest of '.*weights.f64'; make it "
                                         r"with configure\(\)"):
        TOY.cell_inputs(plain, {"seed": 0})


def test_input_files_lists_the_declared_file_kind_whatever_its_suffix(weights, tmp_path):
    note = str(tmp_path / "x.npy")  # an existing .npy file named by a str parameter: not an input file
    config = TOY.configure(profile=None, values={"weights": str(weights), "note": note, "n_seeds": 1,
                                                 "root_seed": 1})
    expected = {"weights": {"source": str(weights), "sha256": _sha256(weights)}}
    assert input_files(config) == expected
    assert json.loads(provenance("file_toy", config)["input_files"]) == expected
    assert json.loads(build(TOY, config).attrs["input_files"]) == expected


def test_changed_input_files_names_the_parameter_and_both_digests(weights):
    values = {"weights": str(weights), "note": "x.npy", "n_seeds": 1, "root_seed": 1}
    recorded = json.dumps(input_files(TOY.configure(profile=None, values=values)))
    old = _sha256(weights)
    _rewrite(weights, np.array([5.0]).tobytes())
    config = TOY.configure(profile=None, values=values)
    new = _sha256(weights)
    assert changed_input_files(recorded, config) == [f"weights: sha256 {old[:12]} -> {new[:12]}"]
    assert changed_input_files(None, config) == [f"weights: sha256 none -> {new[:12]}"]
    none = TOY.configure(profile=None, values={**values, "weights": ""})
    assert changed_input_files(recorded, none) == [f"weights: sha256 {old[:12]} -> none"]


# ------------------------------------------------------------------ values and rules
def test_an_optional_file_may_be_empty_or_none_and_a_required_one_may_not():
    optional = Param("tokens", "file", "a token file", "", optional=True)
    required = Param("weights", "file", "a weight file", "")
    assert optional.check("") == "" and optional.check(None) == ""
    assert configure((optional,), "quick").digests == {}
    for value in ("", None):
        with pytest.raises(ValueError, match=rf"^weights: a file is needed, got {value!r}$"):
            required.check(value)


def test_set_tokens_on_the_command_line_names_a_relative_file(tokens, monkeypatch):
    monkeypatch.chdir(tokens.parent)
    base = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in C1_SMALL.items()]
    config = c1_limit.EXPERIMENT.configure("quick", [*base, "tokens=emb.npy"])
    assert config["tokens"] == "emb.npy" and config.digests == {"tokens": _sha256(tokens)}
    assert c1_limit.EXPERIMENT.configure("quick", [*base, "tokens="]).digests == {}
    param = next(p for p in c1_limit.EXPERIMENT.params if p.name == "tokens")
    assert parse_text(param, "emb.npy") == "emb.npy"


@pytest.mark.parametrize("value, match", [
    ("tokens.csv", r"^tokens must be a \.npy file or 'file\.nc:variable', got 'tokens\.csv'$"),
    ("emb.nc", r"^tokens: a netCDF file needs a variable: 'emb\.nc:variable'$"),
    ("emb.nc:", r"^tokens: 'emb\.nc:' names no variable after ':'"),
    ("missing.npy", r"^tokens: no such file 'missing\.npy'$"),
    (3, r"^tokens must be a path to a \.npy file or 'file\.nc:variable', got 3$"),
])
def test_a_file_of_another_form_is_refused_naming_the_parameter(value, match):
    param = Param("tokens", "file", "a token file", "", suffixes=(".npy", ".nc"), optional=True)
    with pytest.raises(ValueError, match=match):
        param.check(value)


def test_a_netcdf_variable_is_hashed_as_its_whole_file(tmp_path):
    import xarray as xr

    xr.Dataset({"emb": (("token", "feature"), np.ones((4, 2)))}).to_netcdf(tmp_path / "emb.nc")
    param = Param("tokens", "file", "a token file", "", suffixes=(".npy", ".nc"))
    config = configure((param,), values={"tokens": f"{tmp_path}/emb.nc:emb"}, profile=None)
    assert config.digests == {"tokens": _sha256(tmp_path / "emb.nc")}


def test_suffixes_and_optional_are_for_file_parameters_only():
    with pytest.raises(ValueError, match="parameter 'x': suffixes and optional describe a file parameter"):
        Param("x", "str", "a string", "", optional=True)
    assert Param("t", "file", "a token file", "", suffixes=(".npy", ".nc"), optional=True).rule() == \
        "file, ending .npy or .nc, '' for none"
