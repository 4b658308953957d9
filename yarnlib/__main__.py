"""``python -m yarnlib``: the same entry point as the ``yarnlib`` console script."""

import sys

from yarnlib.cli import main

if __name__ == "__main__":
    sys.exit(main())
