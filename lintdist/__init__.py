"""lintdist: a static linter and auto-fixer for PyTorch distributed-training scripts."""

__version__ = "0.1.0"
