"""One flag per setting field (:func:`add_fields`), and the config made back from the flags (:func:`config_from`).

A flag left out is None in the parsed arguments, so the config's own default applies and a command can tell a flag
given from one left out. The config checks the values; :func:`~nbhelpers.cli.terms.cli_terms` turns the field its
message names into the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..config import RESTORERS, InferenceConfig, parse_box
from ..config.fields import described, flag, kinds, rule, settings
from ..errors import InputError
from .terms import cli_terms

__all__ = ["Parser", "add_fields", "box_flag", "check_restore", "config_from", "given_settings", "inference_config"]

NONE = "none"  # how the command line spells None, for a setting whose default is not None (LiveConfig.silence)
AUTO = ("auto", "automatic")  # how the command line spells None, for a setting whose None is "automatic"


def _number(kind: type):
    """An argparse type that reads a number, and keeps text that is not one, for the config to refuse by name; a
    decimal for a whole number is read as the number it is (``--batch-size 2.5``: "got 2.5", not text)."""

    def read(text: str) -> Any:
        for parse in (kind, float):
            try:
                return parse(text)
            except ValueError:
                pass
        return text

    read.__name__ = kind.__name__
    return read


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage error is two lines on stderr, the error and the ``--help`` to run (exit status
    2). Its error for a setting's flag given no value (argparse reads ``--bbox-shift -7x`` as a flag with no value and
    an option ``-7x``) says the setting's rule and help and how to write a negative value; a command's parser (one
    without subcommands) refuses arguments it does not know, naming its nearest flags."""

    elsewhere: Mapping[str, str] = {}  # flag -> the sentence saying where it belongs, for flags this command lacks

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:
            given = [w.split("=")[0] for w in extras if w[:1] == "-"]
            moved = dict.fromkeys(self.elsewhere[w] for w in given if w in self.elsewhere)
            flags = [s for a in self._actions for s in a.option_strings]
            near = sum((difflib.get_close_matches(w, flags, n=1) for w in given if w not in self.elsewhere), [])
            hint = "".join(f" {m}" for m in moved) + (f" Did you mean {', '.join(near)}?" if near else "")
            self.error(f"unrecognized arguments: {' '.join(extras)}.{hint}")
        return parsed, extras

    def error(self, message: str):
        commands = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is not None:  # the commands by what they are, not by argparse's dest name
            if message == f"the following arguments are required: {commands.dest}":
                message = f"a command is required: {', '.join(commands.choices)}"
            message = message.replace(f"argument {commands.dest}: invalid choice:", "unknown command", 1)
        named = re.fullmatch(r"argument (--[\w-]+): expected one argument", message)
        action = named and next((a for a in self._actions if named.group(1) in a.option_strings), None)
        f = getattr(action, "setting", None)
        if f is not None:
            low = f.metadata.get("ge", f.metadata.get("gt"))
            dash = any(w in kinds(f) for w in ("int", "float")) and (low is None or low < 0)
            message = (f"{flag(f)} needs a value: {cli_terms(rule(f))} ({f.metadata['help']})."
                       + (" A value after a space that starts with '-' and is not a number is read as another "
                          f"option; write it after '=', as in {flag(f)}={max(low or -10, -10):g}." if dash else ""))
        self.exit(2, f"{self.prog}: error: {message}\nrun '{self.prog} --help' for its usage and options\n")


def _default_text(f: dataclasses.Field, text: str | None) -> str:
    """`` (default: ...)``: ``text``, else the field's default or its ``none`` words; "" for a switch or no words."""
    if text is None and f.default is None:
        text = f.metadata.get("none")
        text = f"{text}, or write {AUTO[0]}" if text == "automatic" and "bool" not in kinds(f) else text
    elif text is None and not isinstance(f.default, bool):
        text = f"{f.default:g}" if isinstance(f.default, float) else f.default
    return "" if text is None else f" (default: {text})"


def _add(group: Any, f: dataclasses.Field, choices: Iterable[Any] | None, default_text: str | None) -> None:
    m, words = f.metadata, kinds(f)
    choices = m.get("choices") if choices is None else tuple(choices)
    help_text = described(f, choices) + _default_text(f, default_text)
    if words[0] == "bool":  # default False: the flag; True: its --no- flag; None: both, one at a time
        off = m.get("flag_off") or "--no-" + f.name.replace("_", "-")
        off_help = (f"turn off {f.name.replace('_', ' ')}, which is on by default: {help_text}" if f.default
                    else f"the opposite of {flag(f)}")
        group = group.add_mutually_exclusive_group() if f.default is None else group
        for name, value, text in ((flag(f), True, help_text), (off, False, off_help)):
            if f.default is not value:
                group.add_argument(name, dest=f.name, action="store_const", const=value, default=None, help=text)
        return
    if choices is not None:
        choices = [NONE if c is None else c for c in choices if c is not None or f.default is not None]
    kind = None if "str" in words else int if "int" in words else float if "float" in words else None  # None: text
    metavar = m["unit"].upper() if "unit" in m and choices is None else None
    if metavar is None and choices is None:
        metavar = {int: "N", float: "NUMBER"}.get(kind, "PATH" if "os.PathLike" in words else None)
    action = group.add_argument(flag(f), dest=f.name, type=_number(kind) if kind else str, default=None,
                                choices=choices, metavar=metavar, help=help_text)
    action.setting = f  # for Parser.error


def add_fields(parser: Any, config_class: type, *, title: str | None = None, only: Iterable[str] | None = None,
               choices: Mapping[str, Iterable[Any]] | None = None,
               defaults: Mapping[str, str] | None = None) -> None:
    """Add one flag per setting of ``config_class`` (those with ``cli=True``; ``only`` those named) to ``parser``, in
    an argument group titled ``title`` (None: the parser's options). ``choices`` maps a setting to the choices this
    command takes, where fewer than the field's; ``defaults`` to the words for its default in the help, where the
    command's default is not the field's (``avatar live --to``: a file in the avatar's folder)."""
    group = parser.add_argument_group(title) if title else parser
    names = None if only is None else set(only)
    for f in settings(config_class):
        if f.metadata["cli"] and (names is None or f.name in names):
            _add(group, f, (choices or {}).get(f.name), (defaults or {}).get(f.name))


def given_settings(args: argparse.Namespace, config_class: type, only: Iterable[str] | None = None) -> dict[str, Any]:
    """The settings of ``config_class`` (``only`` those named) whose flags were given, by field name. ``auto`` or
    ``automatic`` for a setting whose default is automatic (``--device auto``, ``--batch-size auto``) is the default
    spelt out, so not a given value; ``none`` is None for a setting that takes None."""
    values = {}
    for f in settings(config_class):
        value = getattr(args, f.name, None)
        if (only is not None and f.name not in only) or value is None:
            continue
        if isinstance(value, str) and value in AUTO and f.metadata.get("none") == "automatic":
            continue
        values[f.name] = None if value == NONE and None in f.metadata.get("choices", ()) else value
    return values


def config_from(args: argparse.Namespace, config_class: type, **changes: Any) -> Any:
    """``config_class`` made from the flags :func:`add_fields` added: the flags given (:func:`given_settings`), then
    ``changes``; InputError for a value the config refuses (its message names the field)."""
    return config_class(**{**given_settings(args, config_class), **changes})


def box_flag(text: str | None) -> tuple[int, int, int, int] | None:
    """``--box=x1,y1,x2,y2`` as four whole source pixels, None when not given (:func:`nbhelpers.config.parse_box`)."""
    return parse_box(text, "--box", f"--box={text}") if text else None  # as the frame-fit check writes it


def inference_config(args: argparse.Namespace) -> InferenceConfig:
    """The :class:`InferenceConfig` of a job's flags (``--box`` sets the landmark backend to ``boxes``)."""
    return config_from(args, InferenceConfig, **({"landmark_backend": "boxes"} if getattr(args, "box", None) else {}))


def check_restore(args: argparse.Namespace) -> None:
    """InputError, before any work, for ``--restore-strength`` not a finite number from 0 to 1, or given without
    ``--restore``: the strength blends the restorer's output, and no avatar or jobs-file row names a restorer of its
    own, so alone it would be ignored."""
    strength = getattr(args, "restore_strength", None)
    if strength is not None and getattr(args, "restore", None) is None:
        strength = InferenceConfig(restore_strength=strength).restore_strength  # NaN, inf, text: refused first
        raise InputError(f"--restore-strength {strength:g} blends the restored face into the generated one, but no "
                         f"face restorer is chosen: add --restore NAME ({', '.join(RESTORERS)}), or leave "
                         "--restore-strength out.")
