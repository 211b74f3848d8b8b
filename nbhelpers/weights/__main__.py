"""``python -m nbhelpers.weights list|download|verify``: the weights command line (:mod:`.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
