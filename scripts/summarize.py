"""Summarise runs; the same as ``recsys-midx-summarize`` (see :mod:`recsys_midx.analysis.summarize`)."""
from recsys_midx.analysis.summarize import main
main()
