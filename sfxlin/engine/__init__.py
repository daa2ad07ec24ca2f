"""The sweep engine: an experiment's declarations -> a lazy, labelled, dask-backed
``xr.Dataset`` -> a netCDF results file.

Typed parameters (:mod:`.params`), experiments, their parts and cells (:mod:`.sweep`), the families
experiments are variants of (:mod:`.family`), what a run will cost (:mod:`.plan`), finding
experiments by name (:mod:`.experiments`) and the plug-in protocol their declaration modules
follow (:mod:`.protocol`), the kept cells of interrupted runs (:mod:`.cellstore`) and
the code they are fingerprinted by (:mod:`.closure`), cells computed on a dask cluster (:mod:`.cluster`),
schedulers and progress (:mod:`.execution`), netCDF storage and provenance (:mod:`.storage`),
the coordinate vocabulary (:mod:`.schema`), combining runs (:mod:`.merge`), how much a cell amplifies
rounding (:mod:`.sensitivity`) and whether a file still comes from the code (:mod:`.verify`).

The rule of the house: the mathematics (``sfxlin.*`` outside this package) imports nothing of the
engine; the engine imports the mathematics; pipelines and analysis import both; the command line
imports everything. A test checks it (tests/test_layout.py).
"""
from .family import Cells, Cost, Family
from .params import Param, Profiles
from .sweep import Experiment, Out, Part, Variable, build, cell_rng, run_cell, substream

__all__ = ["Cells", "Cost", "Family", "Param", "Profiles", "Experiment", "Out", "Part", "Variable", "build",
           "cell_rng", "run_cell", "substream"]
