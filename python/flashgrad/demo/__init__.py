"""flashgrad's demo: train a tiny character-level hybrid language model with flashgrad's ops.

Run it with `python -m flashgrad.demo --help`; docs/demo.md describes what it does and shows.
"""

from .cli import main

__all__ = ["main"]
