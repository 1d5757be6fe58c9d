"""Where ``trio-duplex serve`` takes its settings from: flag > environment > file > default.

Generic over the serve parser's flags, whoever adds them: ``--max-sessions`` can also be
``TRIO_DUPLEX_MAX_SESSIONS`` in the environment, or ``max_sessions`` in the TOML file that
``--config`` (or ``TRIO_DUPLEX_CONFIG``) names. A value from either is converted and
checked by the flag's own ``type`` and ``choices``, as if it had been typed on the command
line, and a refusal names where it came from. A repeatable flag (``action="append"``)
takes a TOML array, or a comma-separated environment value; a switch (``store_true``)
takes a TOML boolean, or 1/0, true/false, yes/no, on/off.

How the command line's own values are told apart from defaults: ``Layers.take`` moves
every flag's default out of the parser (``argparse.SUPPRESS``), so that after parsing the
namespace holds only the flags actually given, and ``fill`` supplies the rest.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import attrs

ENV_PREFIX = "TRIO_DUPLEX_"
CONFIG = "config"
"""The flag (``--config``) and its variable (``TRIO_DUPLEX_CONFIG``): the file's name."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SourceError(ValueError):
    """A value from the environment or the file was refused; the message names its source."""


@attrs.frozen
class Setting:
    """One flag of the parser, as the environment and the file name it."""

    action: argparse.Action
    default: Any

    @property
    def key(self) -> str:
        """Its key in the file: the long flag, ``-`` as ``_`` (``max_sessions``)."""
        flag = next(o for o in self.action.option_strings if o.startswith("--"))
        return flag.removeprefix("--").replace("-", "_")

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def is_list(self) -> bool:
        action = self.action
        return isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+")

    @property
    def is_switch(self) -> bool:
        return self.action.nargs == 0

    # -- values ------------------------------------------------------------------------

    def from_text(self, text: str, source: str) -> Any:
        """An environment variable's value."""
        if self.is_switch:
            word = text.strip().lower()
            if word not in _TRUE | _FALSE:
                raise SourceError(f"{source}: {text!r} is not one of 1/0, true/false, yes/no")
            return self._switch(word in _TRUE)
        if self.is_list:
            return [self._convert(t.strip(), source) for t in text.split(",") if t.strip()]
        return self._convert(text, source)

    def from_toml(self, value: object, source: str) -> Any:
        """A value of the TOML file (a string, a number, a boolean or an array)."""
        if self.is_switch:
            if not isinstance(value, bool):
                raise SourceError(f"{source}: expected true or false, got {value!r}")
            return self._switch(value)
        if self.is_list:
            items = value if isinstance(value, list) else [value]
            return [self._convert(self._scalar(v, source), source) for v in items]
        return self._convert(self._scalar(value, source), source)

    def _switch(self, on: bool) -> Any:
        const = self.action.const  # store_true: True, store_false: False
        value = const if isinstance(const, bool) else True
        return value if on else not value

    @staticmethod
    def _scalar(value: object, source: str) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise SourceError(f"{source}: expected a string or a number, got {value!r}")

    def _convert(self, text: str, source: str) -> Any:
        """``text`` as the flag's own ``type`` and ``choices`` take it from the command line."""
        kind = self.action.type
        try:
            value = text if kind is None else kind(text)  # type: ignore[operator]
        except argparse.ArgumentTypeError as exc:
            raise SourceError(f"{source}: {exc}") from None
        except (TypeError, ValueError):
            raise SourceError(f"{source}: invalid value {text!r}") from None
        choices = self.action.choices
        if choices is not None and value not in choices:
            shown = ", ".join(map(str, choices))
            raise SourceError(f"{source}: {text!r} is not one of {shown}")
        return value


@attrs.frozen
class Layers:
    """The serve parser's flags, their defaults taken out of it (see the module's doc)."""

    parser: argparse.ArgumentParser
    settings: tuple[Setting, ...]

    @classmethod
    def take(cls, parser: argparse.ArgumentParser) -> Layers:
        settings = []
        # argparse has no public list of a parser's actions; _actions is the one it uses.
        for action in parser._actions:
            # --help (and --version) default to SUPPRESS already: no value to supply.
            if action.default is argparse.SUPPRESS or action.dest == CONFIG:
                continue
            if not any(o.startswith("--") for o in action.option_strings):
                continue
            settings.append(Setting(action, action.default))
            action.default = argparse.SUPPRESS
        return cls(parser, tuple(settings))

    def fill(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        """Give ``args`` every flag the command line did not: from ``environ``, else the
        file, else the default. A refused value exits 2 with a message naming its source."""
        try:
            self._fill(args, environ)
        except SourceError as exc:
            self._error(str(exc))

    def _fill(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        given = vars(args)
        path = given.get(CONFIG) or environ.get(ENV_PREFIX + CONFIG.upper())
        table = self._read(path) if path else {}
        known = {s.key for s in self.settings}
        defaulted: set[str] = set()
        for key in table:
            if key not in known:
                hint = key.replace("-", "_")
                also = f" (did you mean {hint}?)" if hint in known else ""
                raise SourceError(f"config file {path}: unknown key {key!r}{also}")
        for setting in self.settings:
            dest = setting.action.dest
            if dest in given:
                continue
            if setting.variable in environ:
                source = f"environment variable {setting.variable}"
                value = setting.from_text(environ[setting.variable], source)
            elif setting.key in table:
                source = f"config file {path}: {setting.key}"
                value = setting.from_toml(table[setting.key], source)
            else:
                value = setting.default
                defaulted.add(dest)
            setattr(args, dest, value)
        # Which settings were given nowhere: an engine may have its own default for them.
        args.defaulted = frozenset(defaulted)

    @staticmethod
    def _read(path: str) -> dict[str, Any]:
        try:
            with Path(path).open("rb") as file:
                return tomllib.load(file)
        except OSError as exc:
            raise SourceError(f"config file {path}: cannot read it: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SourceError(f"config file {path}: not valid TOML: {exc}") from None

    def _error(self, message: str) -> NoReturn:
        self.parser.error(message)


__all__ = ["ENV_PREFIX", "Layers", "Setting", "SourceError"]
