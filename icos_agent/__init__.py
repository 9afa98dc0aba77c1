"""icos-agent in Python: fit a model's bundle and estimate its accuracy, without labels, over any data — a data
frame, arrays, files, a data lake — window by window, with the same additive statistics as the agent and
``icos-agent check`` (docs/python.md).

>>> import icos_agent
>>> bundle = icos_agent.fit(model="model.onnx", train=(train_df, "label"), val=(val_df, "label"))
>>> est = bundle.estimate(live_df, timestamp="ts", window="1h")
>>> est.to_df()
"""

from icos_agent.bundle import Bundle, fit, fit_reference, load
from icos_agent.estimates import ALERT_MARGIN, Estimates

__all__ = ["ALERT_MARGIN", "Bundle", "Estimates", "fit", "fit_reference", "load"]
