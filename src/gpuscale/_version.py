"""The package's version, read by `gpuscale --version`, the summaries and the batch scripts."""

__version__ = "0.1.0"
