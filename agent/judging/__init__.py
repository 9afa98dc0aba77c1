"""The request path's judging: the immutable :class:`~.runtime.Runtime` (model + bundle + calibration),
the decode → run → judge → answer :class:`~.pipeline.Pipeline`, verdict batching across requests
(:mod:`.batching`), the streaming windows (:mod:`.windows`) and their persistence (:mod:`.state`).
"""
