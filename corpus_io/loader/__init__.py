"""The loader pipeline: reading (read.py), stages (stages.py) and their composition (build.py)."""
