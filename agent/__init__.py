"""icos-agent: label-free operational accuracy monitoring for deployed ONNX classifiers."""

__version__ = "0.1.0"
