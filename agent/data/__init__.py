"""Data the agent reads: ``.npz``/``.npy``/CSV/Parquet files (:mod:`.files`, built on the lazy array
reader :mod:`.arrays` and the bounded table reader :mod:`.table_files`, both within the limits of
:mod:`.limits`), tables of predictions (:mod:`.tables`), the packaged MNIST/digits splits
(:mod:`.datasets`), and the reservoir of recent live inputs that scheduled audits sample (:mod:`.reservoir`).
"""
