"""Results as code: a published table is a spec (:mod:`~recsys_midx.reproduce.spec`) whose runs
(:mod:`~recsys_midx.reproduce.runs`) are collected into a CSV
(:mod:`~recsys_midx.reproduce.collect`) and rendered into the page
(:mod:`~recsys_midx.reproduce.render`, with the figure of the runs' validation curves from
:mod:`~recsys_midx.reproduce.figure`) by the ``recsys-midx-reproduce`` command
(:mod:`recsys_midx.app.reproduce`)."""
