"""The experiment families, each declared once (:mod:`sfxlin.engine.family`): C1 (:mod:`.c1`), C2 (:mod:`.c2`),
C3 (:mod:`.c3`) and the deep models of C3 (:mod:`.deep`); every other module of ``sfxlin.pipelines`` is one
of their variants."""
