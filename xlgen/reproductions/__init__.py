"""Reproduction scripts (`python -m xlgen.reproductions.<name>`); results in docs/reproductions.md."""
