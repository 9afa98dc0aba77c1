"""The champion/challenger benchmark (``python -m bench.challenger``): model versions whose truth is
known (:mod:`bench.challenger.pairs`, seeded models in ``models/``), the paired difference measured over
the estimator benchmark's scenarios (:mod:`bench.challenger.run`) against its targets
(:mod:`bench.challenger.report`)."""
