"""smoothscale: scale stateful Spark streaming apps on Kubernetes without stopping them."""

__version__ = "0.1.0"
