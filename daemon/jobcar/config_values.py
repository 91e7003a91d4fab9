"""Converters for one scalar of the config file: its text (after interpolation) to a checked value, or
Invalid saying what it must be. `config` says which key takes which."""

from __future__ import annotations

import re
from typing import Final

import yaml

from jobcar.targets import did_you_mean
from jobcar.units import parse_duration, parse_size
from jobcar.yaml_reader import Converter, Invalid, KeyPath, Reader

_BOOLEANS: Final = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def string(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = r.text(node, "a string")
    if not text:
        raise Invalid("must not be empty")
    return text


def optional_string(r: Reader, node: yaml.Node, path: KeyPath) -> str | None:
    return r.scalar(node, "a string") or None  # "" (e.g. from ${TOKEN:-}) means not set


def boolean(r: Reader, node: yaml.Node, path: KeyPath) -> bool:
    text = r.text(node, "true or false")
    if text.lower() not in _BOOLEANS:
        raise Invalid(f"must be true or false, not {text!r}")
    return _BOOLEANS[text.lower()]


def parse_int(text: str, minimum: int, maximum: int | None = None) -> int:
    if len(text) > 100 or not re.fullmatch(r"[-+]?[0-9](_?[0-9])*", text.strip()):
        raise Invalid(f"must be an integer, not {text!r}")
    number = int(text.strip().replace("_", ""))
    if number < minimum or (maximum is not None and number > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
        raise Invalid(f"must be {bounds}, not {number}")
    return number


def integer(minimum: int, *, optional: bool = False) -> Converter:
    def convert(r: Reader, node: yaml.Node, path: KeyPath) -> int | None:
        text = r.scalar(node, "an integer")
        if text is None or (optional and not text):
            if optional:
                return None
            raise Invalid("must be an integer, not empty")
        return parse_int(text, minimum)

    return convert


def duration(minimum: float = 0.0, *, exclusive: bool = False) -> Converter:
    def convert(r: Reader, node: yaml.Node, path: KeyPath) -> float:
        text = r.text(node, "a duration")
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if seconds < minimum or (exclusive and seconds == minimum):
            raise Invalid(f"must be {'more than' if exclusive else 'at least'} {minimum:g}s, not {text!r}")
        return seconds

    return convert


def size(minimum: int = 0) -> Converter:
    def convert(r: Reader, node: yaml.Node, path: KeyPath) -> int:
        text = r.text(node, "a size")
        try:
            size = parse_size(text)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if size < minimum:
            raise Invalid(f"must be at least {minimum} byte{'' if minimum == 1 else 's'}, not {text!r}")
        return size

    return convert


def choice(options: tuple[str, ...]) -> Converter:
    def convert(r: Reader, node: yaml.Node, path: KeyPath) -> str:
        text = r.text(node, "one of " + ", ".join(options))
        if text.lower() not in options:
            raise Invalid(f"must be one of {', '.join(options)}, not {text!r}" + did_you_mean(text, options))
        return text.lower()

    return convert
