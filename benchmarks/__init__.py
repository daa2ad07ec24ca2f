"""Benchmarks (``sfxlin bench``), out of the runtime package: each times an engine of sfxlin
against its plain reference in one run and prints the ratio."""
