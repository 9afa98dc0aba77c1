"""Wire formats the agent speaks: the Open Inference Protocol V2 codec (:mod:`.v2`), JSON and binary tensors.
Bounded and validated at the boundary, so nothing malformed gets further.
"""
