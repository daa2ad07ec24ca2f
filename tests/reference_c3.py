"""The plain per-L, per-step numpy reference of the C3 training (the oracle of the fast engine
in ``sfxlin.training``). It lives in the package (``sfxlin.reference_c3``) so that the benchmark
(``sfxlin.bench_c3``) can use it; this module re-exports it for the tests."""
from sfxlin.reference_c3 import (  # noqa: F401
    linear_step,
    softmax_step,
    train_reference,
    train_reference_all,
)

__all__ = ["softmax_step", "linear_step", "train_reference", "train_reference_all"]
