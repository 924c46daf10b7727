"""The commands and what only they use.

One module per command: :mod:`~recsys_midx.app.train` (``recsys-midx-train``, ``train.py``),
:mod:`~recsys_midx.app.evaluate` (``recsys-midx-eval``, ``eval.py``),
:mod:`~recsys_midx.app.recommend` (``recsys-midx-recommend``),
:mod:`~recsys_midx.app.export` (``recsys-midx-export``),
:mod:`~recsys_midx.app.summarize` (``recsys-midx-summarize``) and
:mod:`~recsys_midx.app.prepare` (``python -m recsys_midx.data``). Beside them: a run built,
trained and tested from a composed config (:mod:`~recsys_midx.app.experiment`), the settings
checked before a run starts (:mod:`~recsys_midx.app.preflight`, :mod:`~recsys_midx.app.threads`,
:mod:`~recsys_midx.app.loggers`) and a run folder loaded again (:mod:`~recsys_midx.app.trained`).

Nothing is imported here: each command pulls in Lightning, Hydra or both, which the algorithms of
:mod:`recsys_midx.inference` and :mod:`recsys_midx.analysis` never load.
"""
