"""The command line, ``python -m nbhelpers``: the same jobs as the notebooks, without Jupyter.

:mod:`.parser` declares the commands, with each setting's flag made from its config field (:mod:`.flags`);
:mod:`.main` runs one command line (one module per command group) and :mod:`.terms` words the package's messages in
flags. Importing this package imports none of its modules; ``python -m nbhelpers`` imports :mod:`.main`.
"""
