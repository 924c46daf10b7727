"""Reports of a sweep drawn from its runs' ``results.json`` and ``epochs.csv``: which settings
tell the runs apart (:mod:`~recsys_midx.reports.sweeps`), the summary plots
(:mod:`~recsys_midx.reports.summary_plots`) and the time each group takes to reach a share of the
exact softmax's best (:mod:`~recsys_midx.reports.time_to_quality`).

The ``recsys-midx-summarize`` command (:mod:`recsys_midx.app.summarize`) reads the runs and
writes these reports; they need pandas and matplotlib, not Lightning or Hydra.
"""
