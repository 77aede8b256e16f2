"""``python -m mdboost``: the ``mdboost`` command (:func:`mdboost.cli.main`), as ``python -m pip``."""

import sys

from mdboost.cli import main

if __name__ == "__main__":
    sys.exit(main())
