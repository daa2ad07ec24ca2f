"""sfxlin.pipelines: one module per experiment, each a variant of its family (:mod:`sfxlin.pipelines.families`)."""
