"""draftzoo: train, measure, publish and serve speculative-decoding drafters."""

__version__ = "0.1.0"
