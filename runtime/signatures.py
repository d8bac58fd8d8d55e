"""What `inspect.signature` and `help()` say of the callables a user gets.

Contract: `call_signature(specs, defaults, out)` is the `inspect.Signature`
of a call that binds as `runtime.args.bind` does: each parameter of
`specs`, in order, positional or keyword, with its default (`defaults`:
name -> value, as the source wrote it; a default not there, as in a module
of an earlier gradc, shows as `DEFAULT`), then, with `out`, the keyword-only
`out=None` that gives a callable's results buffers.  It is None where no
Python signature states the call exactly: a parameter named like a Python
keyword (`lambda`: passed by position, or by `**{"lambda": v}`, which no
`inspect.Parameter` can name), or one named `out` beside the `out=`
buffers (the keyword is the buffers', so that parameter is passed by
position only, yet the ones before it take keywords).  A callable with no
signature of its own keeps `(*args, **kwargs)`, which is true, if vague.
`positional_only(signature, count)` makes its first `count` parameters
positional-only and required (`vmap`'s mapped arguments, and those before
them); `with_keywords(signature, names)` adds keyword-only ones defaulting
to `FROM_MODULE` (the bridges' module params).  `SignatureAttribute` is a
class's `__signature__`, which `inspect.signature` reads before
`__call__`: each instance's `call_signature()`, and None on the class
(whose signature is its constructor's); `DocAttribute(doc)` likewise a
class's `__doc__`: `doc` on the class, each instance's `describe()` (made
when asked: `help()`).  `header(source, line)` is a `def`'s header and
the `#` comment lines above it (and its decorators), as `help()` shows a
function: the language has no docstrings, and its comments stand for them.
User text (names, defaults) reaches only `inspect.Parameter` and text: no
code is made of it.
"""
from __future__ import annotations

import inspect
import keyword
from typing import Any, Iterable, Optional, Sequence


class _Shown:
    """A value shown in a signature as `text` (a stand-in, not a value a
    caller passes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


DEFAULT = _Shown("<default>")  # a default whose value the callable does not record
FROM_MODULE = _Shown("<the module's>")  # a module param left out: read from the module


def call_signature(specs: Sequence[Any], defaults: dict[str, Any],
                   out: bool = False) -> Optional[inspect.Signature]:
    """(See the module's contract.)  `specs`: `runtime.args.ParamSpec`s."""
    names = [s.name for s in specs]
    if not all(_nameable(n) for n in names) or (out and "out" in names):
        return None
    parameters = [inspect.Parameter(s.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=defaults.get(s.name, DEFAULT) if s.has_default
                                    else inspect.Parameter.empty) for s in specs]
    if out:
        parameters.append(inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None))
    try:
        return inspect.Signature(parameters)
    except ValueError:  # (a default before a parameter without: the checker refuses it)
        return None


def _nameable(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def positional_only(signature: Optional[inspect.Signature], count: int
                    ) -> Optional[inspect.Signature]:
    """`signature` with its first `count` parameters positional-only and
    without defaults: the last of them must be passed by position, and so
    must each before it."""
    if signature is None:
        return None
    kind, empty = inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.empty
    return signature.replace(parameters=[
        p.replace(kind=kind, default=empty) if i < count else p
        for i, p in enumerate(signature.parameters.values())])


def with_keywords(signature: Optional[inspect.Signature], names: Iterable[str]
                  ) -> Optional[inspect.Signature]:
    """`signature` with keyword-only parameters `names` (those that can be
    named: a module param's name is an identifier), each defaulting to
    `FROM_MODULE`, unless it has one of that name already."""
    if signature is None:
        return None
    have = set(signature.parameters)
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=FROM_MODULE)
             for n in names if n not in have and _nameable(n)]
    return signature.replace(parameters=[*signature.parameters.values(), *extra])


class SignatureAttribute:
    """(See the module's contract.)"""

    def __get__(self, obj: Any, cls: Optional[type] = None) -> Optional[inspect.Signature]:
        return None if obj is None else obj.call_signature()


class DocAttribute:
    """(See the module's contract.)"""

    def __init__(self, doc: Optional[str]) -> None:
        self.doc = doc

    def __get__(self, obj: Any, cls: Optional[type] = None) -> Optional[str]:
        return self.doc if obj is None else obj.describe()


def header(source: str, line: int, limit: int = 40) -> tuple[str, str]:
    """(the header of the `def` at 1-based `line` of `source`, its lines
    joined and without its `:`; the text of the `#` comment lines just
    above it and its decorators, without the `#`s), "" for either not
    found.  A header ends at the first line outside brackets that ends in
    `:`, within `limit` lines."""
    lines = source.splitlines()
    if not 0 < line <= len(lines):
        return "", ""
    parts, depth = [], 0
    for text in lines[line - 1:line - 1 + limit]:
        code = text.split("#", 1)[0].rstrip()  # (no string in a header holds a #)
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        parts.append(code.strip().rstrip("\\").strip())
        if depth <= 0 and code.endswith(":"):
            head = " ".join(p for p in parts if p)[:-1].rstrip()
            break
    else:
        return "", ""
    comments: list[str] = []
    above = line - 2
    while above >= 0 and lines[above].lstrip().startswith("@"):
        above -= 1
    while above >= 0 and lines[above].lstrip().startswith("#"):
        comments.insert(0, lines[above].lstrip()[1:].removeprefix(" ").rstrip())
        above -= 1
    return head, "\n".join(comments)


def described(head: str, comments: str, where: str) -> str:
    """A function's `__doc__`: its header, where it is defined, and the
    comments above it."""
    first = f"{head}\n\n(defined at {where})" if head else f"(defined at {where})"
    return f"{first}\n\n{comments}" if comments else first
