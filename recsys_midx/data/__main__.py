"""``python -m recsys_midx.data prepare|describe ...``: the prepare command of
:mod:`recsys_midx.app.prepare`, kept under the data package's name that its messages give."""

import sys

from recsys_midx.app.prepare import main

if __name__ == "__main__":
    sys.exit(main())
