"""``python -m nbhelpers``: the command line (:mod:`nbhelpers.cli`); ``python -m nbhelpers --help`` lists the
commands."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
