"""The ONNX classifier the agent monitors (:mod:`.classifier`): loading, input preparation, scores as
probabilities. onnxruntime itself stays behind :mod:`invariants.onnx_session`.
"""
