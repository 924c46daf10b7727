"""Summarise runs; the same as ``recsys-midx-summarize`` (see :mod:`recsys_midx.app.summarize`)."""

from recsys_midx.app.summarize import main

main()
