"""User-facing errors.

Contract: every error the toolchain raises about a user's source is a
`GradError` carrying a `Span` (file, line, column, and the end of the
offending text) and, when known, the source text so it can render the
offending line with a caret.  `str(err)` is the full diagnostic:

    FILE:LINE:COL: error: MESSAGE
        the source line
        ^^^^

`called(name)` is how a message names a callable: `f()` for a function,
and a derived one's name, already a call (`grad(f)`), as it is.
`quoted(err)` is another library's error as a part of a message, which is
one line (a line break in it is shown as U+FFFD, as any control is);
`one_line(text)` is user text (a file name) as part of a note's line.
`shown(value)` is a value the caller passed (an option such as `wrt` or
`out_axes`) as part of a message: its repr, cut short.
"""
from __future__ import annotations

import reprlib
import unicodedata
from dataclasses import dataclass, field


def called(name: str) -> str:
    """`name` as a message says it is called: `f()`, but `grad(f)` (not
    `grad(f)()`)."""
    return name if name.endswith(")") else f"{name}()"


def kind_of(value) -> str:
    """What a message says a value of the wrong kind is: its type's name,
    but None for None (not NoneType, a name no caller wrote)."""
    return "None" if value is None else type(value).__name__


def quoted(err: BaseException) -> str:
    """The message of another library's error `err` as part of one of
    ours: its lines joined with "; ", each without its final period.  (JAX's
    error for a tracer read as an array is three lines, whose breaks the
    message showed as U+FFFD.)"""
    lines = [line.strip() for line in str(err).splitlines()]
    return "; ".join(line.rstrip(".") for line in lines if line)


class _Shown(reprlib.Repr):
    """`repr` cut to a few levels and items (a tuple nested 100,000 deep,
    passed as wrt, made its repr a RecursionError; a long list's ran on),
    and an integer beyond `_BITS` by its size: `str` refuses one of over
    4300 digits (a ValueError), and none of its digits would help."""

    _BITS = 256

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxtuple, self.maxlist = 3, 6, 6
        self.maxstring, self.maxother = 60, 60

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > self._BITS:
            return f"<{'a negative' if x < 0 else 'an'} integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


def shown(value) -> str:
    """A value the caller passed (an option: `wrt`, `in_axes`, `has_aux`)
    as a message shows it: its repr, cut short (`_Shown`); the type and
    address of an object whose `__repr__` fails."""
    return _SHOWN.repr(value)


_SHOWN = _Shown()


@dataclass(frozen=True)
class Span:
    """A region of source text; lines and columns are 1-based."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0
    # For a place in a function that another one called (inlined): the
    # call that reached it, "in h(), called at f.grad:5:3" (`compiler.lower`),
    # which an error raised there, at load or at run time, carries as its
    # note.  Not part of the place: spans that differ only here are equal.
    via: str = field(default="", compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def __reduce_ex__(self, protocol):
        # UNKNOWN_SPAN unpickles as itself, which errors tell by identity:
        # an error from a process pool's worker showed `<unknown>:1:1:`
        if self is UNKNOWN_SPAN:
            return "UNKNOWN_SPAN"
        return super().__reduce_ex__(protocol)


UNKNOWN_SPAN = Span("<unknown>", 1, 1)


class GradError(Exception):
    """An error in a `.grad` program, reported at a source span."""

    def __init__(self, message: str, span: Span | None = None,
                 source: str | None = None, note: str | None = None):
        self.message = message
        self.span = span or UNKNOWN_SPAN
        self.source = source
        self.note = note if note is not None else (self.span.via or None)
        super().__init__(message)

    @property
    def file(self) -> str:
        return self.span.file

    @property
    def line(self) -> int:
        return self.span.line

    @property
    def col(self) -> int:
        return self.span.col

    def add_note(self, note: str) -> None:
        """Another note, after the one it may carry (the call that
        reached it, `compiler.lower`): each shows on a line of its own."""
        self.note = f"{self.note}\nnote: {note}" if self.note else note

    def with_source(self, source: str) -> "GradError":
        """Attach the source text if the error does not carry it yet."""
        if self.source is None:
            self.source = source
        return self

    def __str__(self) -> str:
        # (the file name is user text too, and messages and notes may hold
        # one (`cannot read PATH`): a name holding an escape sequence or a
        # newline acted on the terminal, or forged a line of its own)
        where = "" if self.span is UNKNOWN_SPAN else f"{self.span}: "
        text = _shown(f"{where}error: {self.message}")
        caret = _caret_lines(self.span, self.source)
        if caret:
            text += "\n" + caret
        if self.note:  # (each of its notes is a line: `add_note`)
            text += "".join(f"\nnote: {_shown(line)}" if k == 0 else f"\n{_shown(line)}"
                            for k, line in enumerate(self.note.split("\n")))
        return text


# Characters a terminal acts on rather than shows: controls (an escape
# sequence, a NUL), format characters (the bidirectional overrides that
# make a line display in another order than it reads, zero-width ones that
# would shift the caret) and line or paragraph separators; and lone
# surrogates (a file name that is not UTF-8, as os.fsdecode gives it),
# which no UTF-8 stream can write.
_UNSHOWN = ("Cc", "Cf", "Zl", "Zp", "Cs")


def _shown(line: str) -> str:
    """`line` with each character a terminal would act on as U+FFFD: one
    character each, as columns count them; a tab stays, to pad the caret."""
    return "".join("\ufffd" if c != "\t" and unicodedata.category(c) in _UNSHOWN else c
                   for c in line)


def one_line(text: str) -> str:
    """User text (a file name) as part of one line of a note: a note's
    lines are split at '\n' (`GradError.add_note`), so a line break in
    the text would begin a line of its own, which no "note:" heads."""
    return _shown(text)


def _caret_lines(span: Span, source: str | None) -> str:
    if source is None:
        return ""
    lines = source.split("\n")  # as the lexer counts lines
    if not 1 <= span.line <= len(lines):
        return ""
    line = _shown(lines[span.line - 1])
    start = max(span.col, 1)
    if span.end_line == span.line and span.end_col > start:
        width = span.end_col - start
    else:
        width = 1
    width = max(1, min(width, len(line) - start + 1))
    # a tab before the caret stays a tab, so it lands where the line's does
    pad = "".join(c if c == "\t" else " " for c in line[:start - 1])
    return f"    {line}\n    {pad}{'^' * width}"


class QuotesSource(GradError):
    """A `GradError` about one operation, whose message names it as the
    source wrote it: the text at its span, quoted (`x - mean(x, axis=0)`),
    followed by `rest`, once its source is attached (`with_source`); until
    then (and where the span is more than one line, or long: the caret
    line shows it) by `unquoted`.  (The compiler, which raises it, knows
    the IR's op, `sub`, `broadcast_to` in a gradient, but not the text.)"""

    def __init__(self, unquoted: str, rest: str = "", span: Span | None = None,
                 source: str | None = None, note: str | None = None):
        # (`rest` empty: the whole message, as an unpickled one is built)
        self.unquoted, self.rest = unquoted, rest
        super().__init__(f"{unquoted} {rest}" if rest else unquoted, span, note=note)
        if source is not None:
            self.with_source(source)

    def with_source(self, source: str) -> "GradError":
        if self.source is None and self.rest:
            text = source_text(self.span, source)
            if text is not None:
                self.message = f"`{text}` {self.rest}"
                self.args = (self.message,)
        return super().with_source(source)


QUOTED_LENGTH = 60  # the longest source text a message quotes


def source_text(span: Span, source: str) -> str | None:
    """The source text at `span`, where it is on one line and at most
    QUOTED_LENGTH characters, else None."""
    lines = source.split("\n")  # as the lexer counts lines
    if span is UNKNOWN_SPAN or span.end_line != span.line or not 1 <= span.line <= len(lines):
        return None
    text = lines[span.line - 1][max(span.col, 1) - 1:span.end_col - 1].strip()
    return text if 0 < len(text) <= QUOTED_LENGTH else None


class ArgumentError(GradError, TypeError):
    """A bad runtime argument (dtype, rank, shape, missing param, count),
    raised before any kernel runs.  Its span is the function's definition."""


class RaisedByDriver(GradError):
    """An error a program's driver raises, which knows the arrays and their
    places in the source but not the name the caller called the function
    by: the boundary the error leaves through (`runtime.boundary.leaving`)
    names it, the outermost one last, and gives it the function's
    definition for a span where it has none."""

    names_call = False  # its detail names the call already

    def __init__(self, detail: str, span: Span | None = None):
        self.detail = detail
        super().__init__(detail, span)

    def about_call(self, function: str, span: Span | None) -> None:
        """Say the error is of a call of `function` (as the message names
        a call: `called`), at `span` unless it has a place already."""
        if not self.names_call:
            self.message = f"{function}: {self.detail}"
            self.args = (self.message,)
        if self.span is UNKNOWN_SPAN and span is not None:
            self.span = span


class ArrayTooLarge(RaisedByDriver):
    """An array a call would make (a result, or a value computed on the
    way) that is too large, refused before it is allocated and, where the
    arguments' sizes give it, before any kernel runs."""


class SizeMismatchError(RaisedByDriver, ArgumentError):
    """Arguments whose sizes the program takes equal (or fixed, compiled
    ahead of time for them) that are not."""


class SizeOverflowError(ArrayTooLarge, ArgumentError):
    """An array whose element or byte count no array can have (beyond
    NumPy's signed 64-bit sizes): arguments too large for the program."""


class AllocationError(ArrayTooLarge, MemoryError):
    """An array larger than this machine's (or device's) memory, or one
    whose allocation failed: an `except MemoryError` catches it too."""
