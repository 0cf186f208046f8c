"""The loader's one problem collector: (YAML path, message) pairs found anywhere in a file, with
each path's line and each value's text as written, become one ConfigError. Checks record and go
on; the loader raises the ConfigError of :meth:`Problems.issues` once the whole file is checked."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ...errors import ConfigIssue, printable

MAX_ISSUES: Final = 100
"""Most problems one ConfigError lists; the rest are counted in a last line."""

NAME_RE: Final = re.compile(r"[A-Za-z0-9_.-]+")

YAML11_BOOLEAN_WORDS: Final = frozenset({"yes", "no", "on", "off", "y", "n"})
"""Words YAML 1.1 (and so plain PyYAML, for all but y/n) reads as booleans; a pattern file reads
them as text, so a boolean written that way is an error that says to write true or false."""

# A float YAML 1.1 reads as text (no dot, or an unsigned exponent): 1e15, 2E6, 1.5e3.
_FLOAT_AS_TEXT: Final = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+")


def join(path: str, key: Any) -> str:
    """The YAML path of ``key`` in the mapping at ``path``: ``patterns[0].blocks``; a key's
    control characters escaped (:func:`printable`), as every message shows it."""
    key = printable(str(key))
    return f"{path}.{key}" if path else key


def index(path: str, i: int) -> str:
    """The YAML path of item ``i`` of the list at ``path``: ``patterns[0]``."""
    return f"{path}[{i}]"


def show(value: Any) -> str:
    """A parsed value for a message (see :meth:`Problems.show` for the text as written)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    if len(text) > 60 and isinstance(value, dict | list):
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} items"
    return _clip(text)


def _clip(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _hint(value: Any) -> str:
    if isinstance(value, str) and _FLOAT_AS_TEXT.fullmatch(value):
        return (
            f" (YAML reads {value} as text: write a decimal point and a signed exponent, "
            "as in 1.0e+6, or the number in full)"
        )
    return ""


def choices(values: Sequence[Any] | Mapping[Any, Any]) -> str:
    """``a, b, c`` for a message listing valid choices."""
    return ", ".join(str(v) for v in values)


def suggest(value: Any, valid: Sequence[Any] | Mapping[Any, Any]) -> str:
    """`` (did you mean 'x'?)`` when ``value`` is close to one of ``valid``, else ``""``."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [v for v in valid if isinstance(v, str)], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Problems:
    """Every problem found in one file, where each YAML path of it is and what its non-text
    scalars were written as; builds the single ConfigError that reports the problems."""

    def __init__(self, file: str, like: Problems | None = None) -> None:
        self.file = file
        self.items: list[tuple[str, str, int | None]] = []  # (YAML path, message, line)
        self.lines: dict[str, int] = like.lines if like is not None else {}
        """{YAML path: 1-based line}; the first occurrence wins (shared with ``like``'s)."""
        self.written: dict[str, tuple[str, Any]] = like.written if like is not None else {}
        """{YAML path: (text as written, value it became)} for scalars that did not become text
        (numbers, booleans, null), so a message can say ``0x10`` or ``~`` rather than 16 or null."""
        self.yaml11_words: set[str] = like.yaml11_words if like is not None else set()
        """Paths of unquoted yes/no/on/off: text here, booleans to YAML 1.1 readers."""

    def add(self, path: str, message: str, *, line: int | None = None) -> None:
        """Record a problem at ``path`` (``line`` when the path alone does not locate it)."""
        at = path
        while line is None and at and at not in self.lines:  # its nearest ancestor's
            cut = max(at.rfind("."), at.rfind("["))
            at = at[:cut] if cut > 0 else ""
        self.items.append((path, message, self.lines.get(at) if line is None else line))

    def __len__(self) -> int:
        return len(self.items)

    def issues(self) -> list[ConfigIssue]:
        """One ConfigIssue per problem (at most MAX_ISSUES, then a count of the rest)."""
        issues = [
            ConfigIssue(message, path=path, file=self.file, line=line)
            for path, message, line in self.items[:MAX_ISSUES]
        ]
        more = len(self.items) - MAX_ISSUES
        return issues + [ConfigIssue(f"... and {more} more problems", file=self.file)] * (more > 0)

    def show(self, path: str, value: Any) -> str:
        """``value`` (found at ``path``) as the file wrote it: ``0x10``, ``~``, ``.inf``."""
        written = self.written.get(path)
        if written is not None and not isinstance(value, str):
            text, parsed = written
            same = type(parsed) is type(value) and (
                parsed == value
                or (isinstance(value, float) and math.isnan(value) and math.isnan(parsed))
            )
            if same and text != show(value):
                return _clip(text)
        return show(value)

    # ---- typed checks: the value, or None after recording a problem ----
    def missing(self, raw: Mapping[Any, Any], path: str, key: str, what: str = "") -> bool:
        """Whether the required ``key`` is missing from ``raw``, recorded (``what`` says why)."""
        if key not in raw:
            self.add(join(path, key), f"missing required key {key!r}{what}")
        return key not in raw

    def mapping(self, value: Any, path: str, expected: str) -> bool:
        """Whether ``value`` is a mapping; if not, ``expected, got <value>`` is recorded."""
        return value == {} or self.non_empty(value, path, dict, expected)

    def non_empty(self, value: Any, path: str, kind: type, expected: str) -> bool:
        """Whether ``value`` is a non-empty ``kind`` (list or dict); if not, ``expected, got
        <value>`` is recorded."""
        if not isinstance(value, kind) or not value:
            self.add(path, f"{expected}, got {self.show(path, value)}")
            return False
        return True

    def get(
        self, raw: Mapping[Any, Any], path: str, key: str, check: Any, *args: Any, **kw: Any
    ) -> Any:
        """``check(raw[key], its path, *args, **kw)`` when ``key`` is in ``raw``, else ``default``
        (a keyword, None unless given)."""
        default = kw.pop("default", None)
        return check(raw[key], join(path, key), *args, **kw) if key in raw else default

    def unknown_keys(
        self, raw: Mapping[Any, Any], path: str, valid: Sequence[str], where: str
    ) -> None:
        """Record each key of ``raw`` that is not in ``valid`` (``where``: "in a pattern")."""
        for key in raw:
            if key not in valid:
                self.add(
                    join(path, key),
                    f"unknown key {show(key)} {where}{suggest(key, valid)}; "
                    f"valid keys: {choices(valid)}",
                )

    def integer(self, value: Any, path: str, **bounds: Any) -> int | None:
        """An int (a whole float counts) within ``bounds`` (:meth:`within`'s)."""
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"expected an integer, got {self.show(path, value)}{_hint(value)}")
            return None
        return value if self.within(value, value, path, **bounds) else None

    def number(self, value: Any, path: str, **bounds: Any) -> float | None:
        """A finite int or float within ``bounds`` (:meth:`within`'s)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.add(path, f"expected a number, got {self.show(path, value)}{_hint(value)}")
            return None
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            self.add(path, f"expected a finite number, got {self.show(path, value)}")
            return None
        return number if self.within(number, value, path, **bounds) else None

    def within(
        self,
        number: float,
        value: Any,
        path: str,
        minimum: float | None = None,
        maximum: float | None = None,
        why: str = "",
        why_min: str = "",
    ) -> bool:
        """Whether ``number`` (``value`` as checked) is in [minimum, maximum]; records why not,
        ``why`` explaining the maximum and ``why_min`` the minimum."""
        if minimum is not None and number < minimum:
            word, bound, reason = "least", minimum, why_min
        elif maximum is not None and number > maximum:
            word, bound, reason = "most", maximum, why
        else:
            return True
        reason = f" ({reason})" if reason else ""
        shown = str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else f"{bound:g}"
        self.add(path, f"must be at {word} {shown}, got {self.show(path, value)}{reason}")
        return False

    def boolean(self, value: Any, path: str) -> bool | None:
        """true or false; YAML 1.1's yes/no/on/off (and y/n) get a message saying so."""
        if isinstance(value, bool):
            return value
        message = f"expected true or false, got {self.show(path, value)}"
        if isinstance(value, str) and value.lower() in YAML11_BOOLEAN_WORDS:
            message += (
                ": write true or false (yes/no/on/off/y/n are not booleans in a pattern file)"
            )
        self.add(path, message)
        return None

    def choice(
        self, value: Any, path: str, valid: Sequence[Any], what: str, plural: str = ""
    ) -> Any:
        """One of ``valid``; the message lists them and suggests a close one."""
        if value not in valid:
            self.add(
                path,
                f"unknown {what} {self.show(path, value)}{suggest(value, valid)}; valid "
                f"{plural or what + 's'}: {choices(valid)}",
            )
            return None
        return value

    def name(self, value: Any, path: str, what: str) -> str | None:
        """A non-empty string of NAME_RE: letters, digits and _ . -"""
        if not isinstance(value, str) or not NAME_RE.fullmatch(value):
            self.add(
                path,
                f"{what} must be a non-empty string of letters, digits and _ . -, "
                f"got {self.show(path, value)}",
            )
            return None
        return value
