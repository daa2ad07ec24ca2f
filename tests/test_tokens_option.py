"""``sfxlin run c1 --set tokens=FILE``: a token file's empirical law joins C1, its checksum is in the
cells' fingerprints and in the provenance, and bad files are refused before any work."""
import hashlib
import json
import os

import numpy as np
import pytest
import xarray as xr

from sfxlin.engine.cellstore import cell_fingerprint
from sfxlin.pipelines import c1_limit
from sfxlin.realdata import read_tokens
from sfxlin.engine.sweep import build, cell_rng, run_cell

SMALL = {"d": [2], "U_norm": [0.3], "n_seeds": 1, "L": [8, 16, 32], "n_queries": 3, "n_prompts": 4, "query_chunk": 2,
         "laws": ["gaussian", "uniform"]}


def _config(**values):
    return c1_limit.EXPERIMENT.configure(profile=None, values={**c1_limit.EXPERIMENT.configure("quick"), **SMALL,
                                                                **values})


@pytest.fixture
def tokens(tmp_path):
    """100 skewed tokens on R^2 (centred exponentials) in a .npy file."""
    Z = np.random.default_rng(11).standard_exponential((100, 2)) - 1.0
    path = tmp_path / "tokens.npy"
    np.save(path, Z)
    return path, Z


def test_the_empirical_law_joins_with_its_exact_limit(tokens):
    path, Z = tokens
    config = _config(tokens=str(path))
    cell = {"d": 2, "U_norm": 0.3, "seed": 0}
    out = run_cell(c1_limit.EXPERIMENT, config, cell)
    assert c1_limit.EXPERIMENT.inner_coords(config)["law"] == ["gaussian", "uniform", "empirical"]
    # U and q as the kernel draws them; the reference limit is sigma^2 U q (sigma = 1)
    rng = cell_rng(c1_limit.NAME, cell, config["root_seed"])
    U = rng.standard_normal((2, 2))
    U *= 0.3 / np.linalg.norm(U)
    q = rng.standard_normal((3, 2))
    a = q @ U.T
    # the empirical tilted mean written out: softmax over the 100 tokens of a . z_i
    w = np.exp(a @ Z.T - (a @ Z.T).max(axis=1, keepdims=True))
    f_emp = (w @ Z) / w.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out["bias_exact"][2], np.mean(np.sum((f_emp - a) ** 2, axis=1)), rtol=1e-12)
    assert np.all(np.isfinite(out["mse_predicted"][2])) and np.all(out["mse"][2] > 0)
    # the other laws draw from their own substreams: their outputs are bit-identical without the file
    without = run_cell(c1_limit.EXPERIMENT, _config(), cell)
    for name in ("mse", "bias_exact", "mse_predicted"):
        np.testing.assert_array_equal(out[name][:2], without[name])


def test_a_changed_file_changes_the_fingerprint_of_the_main_cells_only(tokens):
    path, Z = tokens
    cell = {"d": 2, "U_norm": 0.3, "seed": 0}
    config = _config(tokens=str(path))
    before = [cell_fingerprint(c1_limit.EXPERIMENT, config, cell), cell_fingerprint(c1_limit.EXPERIMENT, config, {},
                                                                                    "quadrature")]
    _rewrite(path, Z[::-1] * 2.0)  # same path, other content
    config = _config(tokens=str(path))
    after = [cell_fingerprint(c1_limit.EXPERIMENT, config, cell), cell_fingerprint(c1_limit.EXPERIMENT, config, {},
                                                                                   "quadrature")]
    assert after[0] != before[0]  # recomputed
    assert after[1] == before[1]  # the quadrature check does not read the file: kept


def _rewrite(path, Z):
    """Save ``Z`` over ``path`` as a later edit would: the modification time moves on (checksums
    are cached per process by path, size and modification time; two writes within the file
    system's clock tick could otherwise share one)."""
    st = os.stat(path)
    np.save(path, Z)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_a_file_changed_after_configuration_is_refused(tokens):
    path, Z = tokens
    config = _config(tokens=str(path))
    inputs = c1_limit.EXPERIMENT.cell_inputs(config, {"d": 2, "U_norm": 0.3, "seed": 0})
    _rewrite(path, Z + 1.0)
    with pytest.raises(ValueError, match="changed since the run was configured"):
        c1_limit.kernel({"d": 2, "U_norm": 0.3, "seed": 0}, np.random.default_rng(0), inputs)


def test_the_provenance_records_the_checksum(tokens):
    """``build()`` writes the attrs before any work (the command line saves them as they are)."""
    path, _ = tokens
    ds = build(c1_limit.EXPERIMENT, _config(tokens=str(path)))
    files = json.loads(ds.attrs["input_files"])
    assert files == {"tokens": {"source": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}
    assert ds.law.values.tolist() == ["gaussian", "uniform", "empirical"]
    assert "input_files" not in build(c1_limit.EXPERIMENT, _config()).attrs


def test_a_netcdf_variable(tmp_path):
    Z = np.random.default_rng(12).standard_normal((50, 2))
    xr.Dataset({"emb": (("token", "feature"), Z)}).to_netcdf(tmp_path / "emb.nc")
    config = _config(tokens=f"{tmp_path}/emb.nc:emb")
    assert config["tokens"].endswith("emb.nc:emb")
    out = run_cell(c1_limit.EXPERIMENT, config, {"d": 2, "U_norm": 0.3, "seed": 0})
    assert out["bias_exact"].shape == (3,)


@pytest.mark.parametrize("make, values, match", [
    (None, {"tokens": "/nonexistent/tokens.npy"}, "tokens: no such file"),
    ("ok", {"d": [2, 3]}, r"tokens: the file's tokens have dimension 2 .* but d = \[2, 3\]"),
    ("nan", {}, r"tokens must be finite: 1 row\(s\) hold NaN or inf, the first is row 4"),
    ("nc", {}, "has no variable 'missing'"),
    (None, {"tokens": "tokens.csv"}, "tokens must be a .npy file or 'file.nc:variable'"),
    (None, {"laws": ["gaussian", "empirical"]}, "laws"),
])
def test_bad_token_files_are_refused_before_any_work(make, values, match, tmp_path):
    Z = np.zeros((10, 2))
    if make == "nan":
        Z[4, 0] = np.nan
    np.save(tmp_path / "t.npy", Z)
    xr.Dataset({"emb": (("token", "feature"), Z)}).to_netcdf(tmp_path / "t.nc")
    source = {"ok": str(tmp_path / "t.npy"), "nan": str(tmp_path / "t.npy"), "nc": f"{tmp_path}/t.nc:missing"}
    overrides = {**({"tokens": source[make]} if make else {}), **values}
    with pytest.raises(ValueError, match=match):
        _config(**overrides)


def _garbage(path):
    path.write_bytes(b"these bytes are no .npy file at all")


def _pickled(path):
    np.save(path, np.array([{"token": 1}, None], dtype=object), allow_pickle=True)


def _strings(path):
    np.save(path, np.array([["a", "b"], ["c", "d"]]))


def _archive(path):
    with open(path, "wb") as fh:
        np.savez(fh, Z=np.zeros((3, 2)))


def _empty(path):
    path.write_bytes(b"")


@pytest.mark.parametrize("write, reason", [(_garbage, "not a .npy file"), (_pickled, "pickled Python objects"),
                                           (_strings, "its dtype is <U1"), (_archive, ".npz archive"),
                                           (_empty, "empty or truncated")])
def test_a_file_that_is_not_a_plain_numeric_array_says_how_to_save_one(tmp_path, write, reason):
    path = tmp_path / "t.npy"
    write(path)
    with pytest.raises(ValueError) as info:
        _config(tokens=str(path))
    message = str(info.value)
    assert message.startswith(f"tokens: {path} is not a plain numeric .npy array (")
    assert reason in message and message.endswith("; save it with np.save(path, array) from a float array")
    assert "allow_pickle" not in message and "\n" not in message


@pytest.mark.parametrize("dims", [("feature", "token"), ("d", "n"), ("dim", "sample")])
def test_a_netcdf_variable_with_features_first_is_said_to_look_transposed(tmp_path, dims):
    """(feature, token) read as is would be 2 tokens of dimension 50 (and a hint to run with
    d = 50): the message says the dims look transposed and how to fix the file."""
    Z = np.random.default_rng(13).standard_normal((50, 2))
    xr.Dataset({"emb": (dims, Z.T)}).to_netcdf(tmp_path / "emb.nc")
    with pytest.raises(ValueError) as info:
        _config(tokens=f"{tmp_path}/emb.nc:emb")
    message = str(info.value)
    assert message.startswith("tokens: variable 'emb' of ") and f"has dims {dims}, which look transposed" in message
    assert "tokens are the rows and features the last dim" in message
    assert f".transpose({dims[1]!r}, {dims[0]!r})" in message and "--set d=" not in message


def test_a_netcdf_variable_with_neutral_or_upright_dim_names_is_read_as_is(tmp_path):
    Z = np.random.default_rng(14).standard_normal((20, 2))
    for dims in (("dim_0", "dim_1"), ("token", "feature"), ("sample", "d")):
        xr.Dataset({"emb": (dims, Z)}).to_netcdf(tmp_path / "emb.nc")
        np.testing.assert_array_equal(read_tokens(f"{tmp_path}/emb.nc:emb"), Z)
