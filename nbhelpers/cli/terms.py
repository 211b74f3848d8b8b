"""The package's messages in command-line terms: flags for Python names, no pointers to notebooks."""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable
from typing import Any

from ..config import BatchConfig, InferenceConfig, LiveConfig
from ..config.fields import flag, settings
from ..errors import NbHelpersError, NbHelpersWarning

__all__ = ["FLAGS", "cli_terms", "in_cli_terms"]

#: Setting name -> its flag, for every setting of every config that has one.
FLAGS = {f.name: flag(f) for cls in (InferenceConfig, LiveConfig, BatchConfig) for f in settings(cls)
         if f.metadata["cli"]}

_NAMES = r"(?<![\w.-])(" + "|".join(sorted(FLAGS, key=len, reverse=True)) + ")"  # a setting's name, alone

# Python names in the package's messages -> what a command-line user types, applied in order to the errors and
# warnings that reach the command line; tests/test_cli_terms.py checks each rule against the real message.
_CLI_TERMS: tuple[tuple[str, Any], ...] = (
    (r" ?\(upload the file first (?:in notebook 02_media, or give the full path|on Colab, or use "
     r"nbhelpers\.media\.demo_inputs\(\) for a demo photo and speech clip)\)",
     " (give the full path, or a path relative to the current folder)"),
    (r", or use the demo clip from nbhelpers\.media\.demo_inputs\(\)", ""),
    (r" or nbhelpers\.prepare_avatar\([^()]*\)", ""),
    (r", or deep=True in Python,", ""),
    (r" \(or weights\.download\(sets=[^()]*\)\)", ""),
    (r" ?\(or (?:run )?(?:notebook |notebooks/)?0\d_\w+(?:\.ipynb)?\)", ""),
    (r"(?<![\w.-])cache_dir(?!\w)", "--cache-dir"),
    (r"then download the weights: notebook 01 / nbhelpers\.weights\)",
     "then download the weights: python -m nbhelpers download)"),
    (r"or give the crop boxes yourself: nbhelpers\.faces\.track\(frames, boxes=\(x1, y1, x2, y2\)\)\.",
     "or give the crop box yourself: --box=x1,y1,x2,y2 (lipsync, demo, batch, avatar prepare)."),
    (r"run notebooks/01_weights\.ipynb(?: \(weights\.download\))?", "run `python -m nbhelpers download`"),
    (r"nbhelpers\.faces\.mim\.install_mmpose\(\) \(see notebooks/00_setup\.ipynb\), or use the 'dwpose' backend, "
     r"(which gives the same landmarks without mmcv)$",
     r'`python -c "from nbhelpers.faces.mim import install_mmpose; print(install_mmpose())"` (mim and pip; torch and '
     r"numpy stay as they are), or pass --backend dwpose, \1."),
    # the three ways to name the weights folder, as the weights module lists them, become the two a CLI user has
    (r"--weights DIR(?: on the command line)?, (?:weights_dir|directory)=(?: in Python)?,? (?:or )?(?:the )?"
     r"NBHELPERS_WEIGHTS(?: environment variable)?",
     "--weights DIR or the NBHELPERS_WEIGHTS environment variable"),
    (r"\(weights_dir=, NBHELPERS_WEIGHTS\)", "(or the NBHELPERS_WEIGHTS environment variable)"),
    # weights_dir= followed by a value, by the folder it names, or by nothing: a flag needs its DIR word and one space
    (r"weights_dir=(?=['\"])", "--weights "),
    (r"weights_dir= the folder", "--weights DIR, the folder"),
    (r"weights_dir=", "--weights DIR"),
    (r"landmark_backend='boxes' needs boxes=: one \(x1, y1, x2, y2\) for the clip or one per frame\.",
     "--backend boxes needs --box=x1,y1,x2,y2 (one crop box for the clip)."),
    (r"^boxes = \(([-\d, ]+)\)", lambda m: "--box=" + m.group(1).replace(" ", "")),  # the one box --box gives
    (r"boxes=\(x1, y1, x2, y2\) in Python, (--box=x1,y1,x2,y2) on the command line", r"\1"),
    # score takes no box: SyncNet's face boxes can be given in Python only
    (r" Pass boxes= \(x1, y1, x2, y2\) to give the face box yourself\.|, or pass boxes=(?=\.)", ""),
    (r"config\.device is", "--device is"),
    (r"then run the notebook again from the top", "then run the command again"),
    (r"Or set device=None \(automatic\) or 'cpu'\.", "Or leave --device out (automatic), or pass --device cpu."),
    (r"or device=None \(automatic\)", "or leave --device out (automatic)"),
    (r" or None \(automatic\)", " or auto (automatic, the default)"),  # flags.AUTO: how a flag spells it
    (r" or None \(([^()]*)\)", r" or left out (\1)"),
    # a setting named where its rule or value follows: the flag that sets it
    (rf"set {_NAMES}=None\b", lambda m: f"leave {FLAGS[m.group(1)]} out"),
    (rf"{_NAMES}='([A-Za-z][\w-]*)'", lambda m: f"{FLAGS[m.group(1)]} {m.group(2)}"),  # a word needs no quotes
    (rf"{_NAMES}=(?=\S)", lambda m: FLAGS[m.group(1)] + " "),
    (rf"^{_NAMES}(?=: )", lambda m: FLAGS[m.group(1)]),  # a message that opens with the setting it is about
    (rf"{_NAMES}(?= must| [\w.]+ \(user override\)| \(user override\))", lambda m: FLAGS[m.group(1)]),
)


def cli_terms(message: str) -> str:
    """The text of an error or warning the package raised, in command-line terms: flags (``--batch-size``) for
    Python names (``batch_size``), ``--weights`` for ``weights_dir=``, and no pointers to notebooks."""
    for pattern, replacement in _CLI_TERMS:
        message = re.sub(pattern, replacement, message)
    return message


def in_cli_terms(func: Callable[[Any], int]) -> Callable[[Any], int]:
    """Wrap a command so that the package's errors and warnings reach the terminal in command-line terms."""

    @functools.wraps(func)
    def run(args: Any) -> int:
        shown = warnings.showwarning

        def show(message, category, *rest, **kw):
            if isinstance(message, NbHelpersWarning):
                message = category(cli_terms(str(message)))
            return shown(message, category, *rest, **kw)

        warnings.showwarning = show
        try:
            return func(args)
        except NbHelpersError as exc:
            if exc.args and isinstance(exc.args[0], str):
                exc.args = (cli_terms(exc.args[0]), *exc.args[1:])
                if isinstance(exc, ImportError):  # MissingDependencyError: str() reads .msg, not args
                    exc.msg = exc.args[0]
            raise
        finally:
            warnings.showwarning = shown

    return run
