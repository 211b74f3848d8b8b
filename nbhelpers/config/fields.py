"""Setting fields: what the checks, the command line, the widgets and the docs know of each setting.

A config class declares each setting with :func:`setting`, which puts the facts in the field's ``metadata``: its
``help``, ``unit``, ``choices`` (with display ``labels`` and, where the help does not say it, what each one does:
``meanings``), range (``ge``/``gt``/``le``/``lt``), what ``None`` means (``none``), the official ``source``, and,
where it is not ``--`` and the name with dashes, its ``flag``.
:func:`check` enforces the annotation and those facts at construction, :func:`rule` says them in words, and
:func:`documented` writes them into the class docstring. ``nbhelpers.cli`` makes each command's flags from them.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import operator
import os
import re
from collections.abc import Iterator
from typing import Any

from ..errors import InputError, SettingNameError

__all__ = ["check", "described", "documented", "flag", "kinds", "rule", "setting", "settings"]

# The annotation words a setting may use, and the values each one takes (a bool is no number here).
_TAKES = {
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "os.PathLike": lambda v: isinstance(v, os.PathLike),
    "None": lambda v: v is None,
}


def setting(default: Any, *, help: str, unit: str | None = None, choices: tuple | None = None,
            labels: dict | None = None, meanings: dict | None = None, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None, pattern: str | None = None,
            rule: str | None = None, none: str | None = None, source: str | None = None,
            app_range: tuple[int, int] | None = None, flag: str | None = None, flag_off: str | None = None,
            label: str | None = None, cli: bool = True, key: bool = True) -> Any:
    """A dataclass field for one setting with ``default``, its facts (see the module docstring) in ``metadata``.

    ``source`` is the official file and line or a section of ``docs/official-behaviour.md``; ``app_range`` the range
    the official app's slider offers (``app.py:502-515``); ``flag_off`` the flag that sets a ``bool | None``
    setting to False (default ``--no-<name>``); ``label`` the settings panel's name for it. ``cli=False`` keeps the
    setting off the command line; ``key=False`` marks one that does not change what an output is (device,
    precision, batch), so a finished output made with another value is kept."""
    facts = {"help": help, "unit": unit, "choices": choices, "labels": labels, "meanings": meanings, "ge": ge,
             "gt": gt, "le": le, "lt": lt, "pattern": pattern, "rule": rule, "none": none, "source": source,
             "app_range": app_range, "flag": flag, "flag_off": flag_off, "label": label}
    metadata = {k: v for k, v in facts.items() if v is not None}
    metadata.update(cli=cli, key=key)
    return dataclasses.field(default=default, metadata=metadata)


def settings(config: Any) -> Iterator[dataclasses.Field]:
    """The setting fields of a config class or object (those made by :func:`setting`), in declaration order."""
    return (f for f in dataclasses.fields(config) if "help" in f.metadata)


def kinds(f: dataclasses.Field) -> tuple[str, ...]:
    """The words of a field's annotation: ``int | None`` -> ``("int", "None")``."""
    return tuple(word.strip() for word in str(f.type).split("|"))


def flag(f: dataclasses.Field) -> str:
    """The field's command-line flag: its ``flag``, else ``--`` and its name with dashes."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _number(value: float) -> str:
    if isinstance(value, int) and value >= 2**32 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _range(m: dict[str, Any]) -> str:
    low = next(((op, m[k]) for k, op in (("ge", ">="), ("gt", ">")) if k in m), None)
    high = next(((op, m[k]) for k, op in (("le", "<="), ("lt", "<")) if k in m), None)
    if low and high and (low[0], high[0]) == (">=", "<="):
        return f" from {_number(low[1])} to {_number(high[1])}"
    return "".join(f"{' and' if i else ''} {op} {_number(v)}" for i, (op, v) in enumerate(x for x in (low, high) if x))


def rule(f: dataclasses.Field) -> str:
    """The rule of a setting in words: ``"a whole number of pixels from 0 to 200"``, ``"one of 'jaw', 'raw',
    'neck'"``, ``"True, False or None (automatic)"``."""
    m, words = f.metadata, kinds(f)
    choices = m.get("choices")
    if "rule" in m:
        text = m["rule"]
    elif choices:
        text = "one of " + ", ".join(repr(c) for c in choices if c is not None)
    elif "int" in words or "float" in words:
        text = "a whole number" if "int" in words else "a finite number"
        text += (f" of {m['unit']}" if "unit" in m else "") + _range(m)
    elif words[0] == "bool":
        text = "True, False" if "None" in words else "True or False"
    else:
        text = "a path" if "os.PathLike" in words else "text"
    if "None" in words or (choices and None in choices):
        text += f" or None ({m['none']})" if "none" in m else " or None"
    return text


def refusal(f: dataclasses.Field, value: Any) -> InputError:
    """The error for ``value`` refused by ``f``: the name, the rule, the value, and the official app's range."""
    number = any(w in kinds(f) for w in ("int", "float"))
    got = f"{value!r} (text)" if number and isinstance(value, str) else repr(value)
    hint = f" The official app offers {f.metadata['app_range'][0]}-{f.metadata['app_range'][1]} (default " \
           f"{f.default})." if "app_range" in f.metadata else ""
    return InputError(f"{f.name} must be {rule(f)}; got {got}.{hint}")


def _checked(f: dataclasses.Field, value: Any) -> Any:
    """``value`` as ``f`` stores it (plain int and float for numpy numbers), or raise its refusal."""
    m, words = f.metadata, kinds(f)
    if not any(_TAKES[w](value) for w in words if w in _TAKES):
        raise refusal(f, value)
    if "choices" in m and value not in m["choices"] and not (value is None and "None" in words):
        raise refusal(f, value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real) and ("int" in words or "float" in words):
        try:
            value = int(value) if "int" in words and isinstance(value, numbers.Integral) else float(value)
        except OverflowError:  # an int beyond a float's range
            raise refusal(f, value) from None
        if not math.isfinite(value) or any(k in m and not test(value, m[k]) for k, test in _BOUNDS.items()):
            raise refusal(f, value)
    if "pattern" in m and isinstance(value, str) and not re.fullmatch(m["pattern"], value):
        raise refusal(f, value)
    return value


_BOUNDS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def check(config: Any) -> None:
    """Check every setting of a frozen config object against its annotation and facts; store numpy numbers as
    plain Python ones (so they hash and serialise as the same settings).

    Raises:
        InputError: The first setting refused: ``"extra_margin must be a whole number of pixels from 0 to 200;
            got 500."``
    """
    for f in settings(config):
        value = getattr(config, f.name)
        kept = _checked(f, value)
        if kept is not value:
            object.__setattr__(config, f.name, kept)


def described(f: dataclasses.Field, choices: tuple | None = None) -> str:
    """The field's help, followed by what each of ``choices`` (default: all) does where the field says it:
    ``"where the 68 face landmarks come from: auto (the first usable of ...), dwpose (DWPose in torch), ..."``."""
    meanings = f.metadata.get("meanings")
    if not meanings:
        return f.metadata["help"]
    offered = f.metadata["choices"] if choices is None else choices
    return f.metadata["help"] + ": " + ", ".join(f"{c} ({meanings[c]})" for c in offered if c in meanings)


def documented(cls: type) -> type:
    """Append to the class docstring (``help(cls)``) the ``Raises:`` section of :func:`check` and an ``Attributes:``
    section made from the fields' facts; make ``__init__`` refuse a keyword that names no field with
    :class:`~nbhelpers.errors.SettingNameError`, naming the nearest setting."""
    init, names = cls.__init__, [f.name for f in settings(cls)]

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for key in (k for k in kwargs if k not in cls.__dataclass_fields__):
            near = difflib.get_close_matches(key, names, n=1)
            said = f"did you mean {near[0]!r}?" if near else f"its settings are {', '.join(names)}."
            raise SettingNameError(f"{cls.__name__} has no setting {key!r}; {said} help(nbhelpers.config."
                                   f"{cls.__name__}) describes each setting.")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    lines = []
    for f in settings(cls):
        m, text = f.metadata, described(f)
        text = text if re.match(r"\S*[._]", text) else text[0].upper() + text[1:]
        source = f" Source: {m['source']}." if "source" in m else ""
        lines.append(f"        {f.name}: {text}. Default {f.default!r}; {rule(f)}.{source}")
    raises = ("    Raises:\n        InputError: A setting of the wrong type, not finite or out of range, or a name "
              "that is none (SettingNameError); the message names it and states the rule or the nearest name.\n\n")
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + raises + "    Attributes:\n" + "\n".join(lines) + "\n"
    return cls
