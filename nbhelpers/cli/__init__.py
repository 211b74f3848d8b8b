"""The command line, ``python -m nbhelpers``: the same jobs as the notebooks, without Jupyter.

- :mod:`.parser`: the commands and their arguments; each setting's flag comes from its config field (:mod:`.flags`).
- :mod:`.flags`: flags made from the fields of :mod:`nbhelpers.config`, and the configs made back from the flags.
- :mod:`.terms`: the package's messages in command-line terms (``--extra-margin`` for ``extra_margin``).
- :mod:`.main`: :func:`~nbhelpers.cli.main.main`, which runs one command line and maps errors to exit statuses.
- One module per command group: :mod:`.lipsync` (lipsync, demo), :mod:`.avatar` (prepare, generate, live),
  :mod:`.batch`, :mod:`.score`, :mod:`.system` (download, verify, report).

Importing this package imports none of its modules; ``python -m nbhelpers`` imports :mod:`.main`.
"""
