"""sfxlin.analysis: fits, verdicts and figures that read results files only."""
