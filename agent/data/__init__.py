"""Data the agent reads: ``.npz``/CSV/Parquet files (:mod:`.files`), the packaged MNIST/digits splits
(:mod:`.datasets`), and the reservoir of recent live inputs that scheduled audits sample (:mod:`.reservoir`).
"""
