"""``python -m nbhelpers.weights``: runs the command line of the former ``nbhelpers/weights.py``."""

import sys

from .cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
