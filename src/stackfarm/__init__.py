"""stackfarm: a version-matrix build system and compatibility test farm for the LLM-serving stack."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
