"""vstack: maintain a patch series against vLLM (pin, base, apply, build, export)."""

__version__ = "0.1.0"
