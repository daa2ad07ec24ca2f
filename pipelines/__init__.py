"""sfxlin.pipelines: one module per experiment."""
