"""Evaluate a trained checkpoint: ``python eval.py run_dir=outputs/2026-01-01/12-00-00``
(``recsys_midx/conf/eval.yaml``; see :mod:`recsys_midx.app.evaluate`)."""

from recsys_midx.app.evaluate import main

if __name__ == "__main__":
    main()
