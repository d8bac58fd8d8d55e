"""`gradc compile`: ahead-of-time compiled Python modules.

Contract: `compile_module(path, out_dir, sigs)` writes `out_dir/NAME.py`
(NAME is the `.grad` file's stem, refused if it would shadow a module
Python or the runtime imports: `SHADOWED`) and beside it one file per distinct
kernel, named by a hash of its text as the JIT's kernel modules are
(`runtime.loader.kernel_module_name`), so that the programs running a
kernel (a function's call and its gradients, other functions, other
modules compiled into the same directory) share it, once every signature
has lowered (a bad one writes nothing).  The module imports only NumPy,
Numba and the `runtime` package (`runtime.aot`), never the parser or
compiler.  It exposes each function as an attribute (`getattr(m,
"lambda")` for a Python keyword) and in `m.functions`; a function named
like one of the module's own names (`params`, `functions`, `SOURCE`,
`SIGNATURES`, `SPEC`, `AotModule`, a dunder) is in `m.functions` only.  Each has `.grad`, `.value_and_grad` and
`.vjp`, and `dsl.grad`, `dsl.value_and_grad`, `dsl.vjp` and `dsl.Tape` take
it (first order), for the signatures given (`f(f64[:], f32[n, 3], i64,
1)`: `:` is any size, a name is a size shared by the axes that name it, an
integer is fixed; a bare integer or True/False is the value of a const
parameter, which the program is compiled for).  Without `--sig` each
function gets f64 arrays of its annotated (else rank-1) shape.  With
`precompile=True` every kernel is compiled now, once, both its serial and
its parallel variant, and Numba's cache beside the module keeps the machine
code, so importing and calling it later compiles nothing.

The module records its source (its path, absolute and from the module's
directory, and its hash): importing it warns when the source it was
compiled from has changed since (`runtime.aot`).  It records each program's
results' dtypes and shapes (`out_types`), the const defaults that pick
programs (`static_defaults`), every default's value and each function's
`__doc__` (for `inspect.signature` and `help()`) and the functions no
signature named, for `runtime.aot`.  No user text (file name, signatures,
function names, defaults, the functions' headers and comments) reaches
the module but inside repr() literals.  The module's first line is
`MARKER`; a file without it is never overwritten unless `force=True`.
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import math
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from dsl.api import Module, load
from dsl.function import Compiled, GradFn, GradFunction, VjpFunction
from gradlang.compiler.builder import MAX_RANK
from gradlang.compiler.codegen import generate, symbolic_reaches
from gradlang.compiler.ir import Function, StaticScalar, TensorType
from gradlang.compiler.library import STDLIB
from gradlang.compiler.lower import REGIONS_OF_SYMBOLIC_AXES
from gradlang.compiler.modules import import_graph
from gradlang.compiler.pipeline import optimize
from gradlang.compiler.shapes import (NeedsConcrete, NeedsValue, Sym, base_of, derivation, evaluate,
                                      made_up)
from gradlang.compiler.source import INTEGER_LITERAL, integer_literal
from gradlang.runtime import target as targets
from gradlang.runtime.args import (INTEGRAL, KINDS, NONE, NUMPY, SUPPORTED, const_scalar_names,
                                     convert, number_dtype)
from gradlang.runtime.common import MAX_SIZE
from gradlang.runtime.errors import UNKNOWN_SPAN, ArgumentError, GradError
from gradlang.runtime.loader import kernel_module_name, read_regular_file, write_atomic
from gradlang.runtime.target import Target

_SIG = re.compile(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.ASCII)
_ARG = re.compile(r"^\s*(f32|f64|i32|i64|bool)\s*(?:\[(.*)\])?\s*$")
_ANY_SIZE = re.compile(r"a\d+")  # the name of the size a ':' stands for
# Module names a compiled module may not take: with its directory on the
# path it would shadow the module that Python, NumPy, Numba or the runtime
# import (`numpy.py` broke every module compiled into the same directory),
# or this distribution's own (`dsl.py` stood in for `dsl`, whose `grad`
# and `Tape` take compiled functions), or the libraries of its bridges and
# parser (`torch.py` stood in for `torch`: `dsl.to_torch` of its functions
# was an AttributeError from inside the bridge).
SHADOWED = frozenset(sys.stdlib_module_names) | {"gradlang", "dsl", "numpy", "numba",
                                                 "llvmlite", "torch", "jax", "jaxlib", "dask",
                                                 "lark"}


class SignatureError(GradError):
    """A `--sig` that cannot be read or does not fit its function."""


class SizesNeeded(SignatureError):
    """A `--sig` leaving symbolic a size that the function needs the value
    of: at the expression that needs it (shown with its line, unlike other
    signature errors, which are about the signature's text)."""


class OutputError(OSError):
    """The module cannot be written where asked: the directory cannot be
    made, or the module file exists and gradc did not write it."""


def parse_sig(text: str, counter=None) -> tuple[str, list[tuple[str, tuple]]]:
    """`f(f64[:], f32[n, 3])` -> ("f", [("f64", (Sym, )), ("f32", (Sym n, 3))])."""
    counter = counter if counter is not None else itertools.count()
    match = _SIG.match(text)
    if not match:
        raise SignatureError(f"cannot read signature {text!r}; write it like "
                             "'f(f64[:], f32[n, 3], i64)'")
    name, body = match.groups()
    named = set(re.findall(r"[A-Za-z_]\w*", body, re.ASCII))  # a ':' names none of them
    args = []
    for part in _split(body):
        literal = part.strip()
        if literal in ("True", "False", "None"):
            args.append(("static", {"True": True, "False": False, "None": None}[literal]))
            continue
        digits = literal[1:] if literal.startswith("-") else literal
        if INTEGER_LITERAL.fullmatch(digits):
            number = _integer(digits, literal, text)
            args.append(("static", -number if literal.startswith("-") else number))
            continue
        arg = _ARG.match(part)
        if not arg:
            kind = literal.split("[")[0].strip()
            hint = (f": a signature gives a dtype, not a kind; write {' or '.join(KINDS[kind])} "
                    f"for {kind} (a --sig for each dtype to serve)" if kind in KINDS else "")
            raise SignatureError(f"cannot read {literal!r} in signature {text!r}{hint}")
        dtype, dims_text = arg.groups()
        dims = []
        for d in ([] if dims_text is None else dims_text.split(",")):
            d = d.strip()
            if d == ":":
                size = next(f"a{k}" for k in counter if f"a{k}" not in named)
                dims.append(Sym.named(size))  # (matches _ANY_SIZE)
            elif INTEGER_LITERAL.fullmatch(d):  # not str.isdigit: '²' is a digit
                dims.append(_integer(d, d, text))
            elif re.fullmatch(r"[A-Za-z_]\w*", d, re.ASCII):
                dims.append(Sym.named(d))
            else:
                raise SignatureError(f"bad dimension {d!r} in signature {text!r}")
        args.append((dtype, tuple(dims)))
    return name, args


def _integer(digits: str, written: str, sig: str) -> int:
    """The integer `digits` (`written` in signature `sig`) spells, as the
    language reads its literals (`1_000`; not `01`, which `f64[01]` took
    as 1), else a `SignatureError` saying why not."""
    try:
        return integer_literal(digits)
    except ValueError as err:
        raise SignatureError(f"cannot read {written!r} in signature {sig!r}: {err}") from None


def _split(body: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in body:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return parts


def default_sig(f: GradFn) -> tuple[str, str]:
    """A signature f can be lowered for, and why its sizes are fixed ("" if
    they are not: the error of the same signature with symbolic sizes):
    annotated parameters as annotated (a const integer given the value 1:
    a count, an axis or an index; a const bool True), the others f64
    arrays sharing one size, of rank 1, else 2, else 0; and if f needs
    concrete sizes for all of those (it slices an axis), the same with
    every named size 4."""
    candidates = []
    for size in (None, 4):
        for unannotated in ("[n]", "[n, n]", ""):
            args = []
            for spec in f.specs:
                if spec.has_default:
                    break
                if spec.const and spec.dtype in INTEGRAL and not spec.dims:
                    args.append("True" if spec.dtype == "bool" else "1")
                    continue
                dtype = number_dtype(spec.dtype or "f64")  # (`float`: f64)
                dims = (f"[{', '.join(map(str, spec.dims))}]" if spec.dims else "") \
                    if spec.dims is not None else unannotated
                if size is not None:
                    dims = re.sub(r"[A-Za-z_]\w*", str(size), dims)
                args.append(dtype + dims)
            candidates.append(f"{f.name}({', '.join(args)})")
    errors: list[str] = []  # why each candidate did not lower
    first: Optional[GradError] = None
    for index, sig in enumerate(candidates):
        name, args = parse_sig(sig)
        try:
            f.lower(_types(f, args, sig))
            fixed = index >= 3 and sig != candidates[index - 3]
            return sig, errors[index - 3] if fixed else ""
        except (GradError, NeedsConcrete, NeedsValue) as err:
            errors.append(_why_not(f, err))
            if first is None and isinstance(err, GradError):
                first = err
    if first is not None:
        # (the error alone blamed an f64 index, say, on arguments the user never
        # gave: gradc chose them)
        first.add_note(f"no --sig, and {f.name}() compiles for none of the signatures gradc "
                       f"gives a function by default (f64 arrays for its unannotated "
                       f"parameters, as {candidates[0]}): give the signature it is called "
                       "with in --sig")
        raise first
    return candidates[0], ""  # lowering it again reports the error


def _why_not(f: GradFn, err: Exception) -> str:
    """Why a default signature of f did not lower: the error's message and
    where it was found (`file:line:col: the size n is used as a number`)."""
    if isinstance(err, GradError):
        span, message = err.span, err.message
    else:
        span, message = err.at(f.span) if isinstance(err, NeedsConcrete) else f.span, str(err)
    return message if span is UNKNOWN_SPAN else f"{span.file}:{span.line}:{span.col}: {message}"


def _types(f: GradFn, args: list[tuple[str, tuple]], sig: str) -> dict[str, TensorType]:
    if len(args) > len(f.specs):
        raise SignatureError(f"signature {sig!r} has {len(args)} arguments; {f.name}() takes "
                             f"{len(f.specs)}", f.span)
    missing = [s.name for s in f.specs[len(args):] if not s.has_default]
    if missing:
        raise SignatureError(f"signature {sig!r} leaves out {', '.join(missing)}", f.span)
    types = {}
    for s, (dtype, dims) in zip(f.specs, args):
        if dtype == "static":
            if not s.const:
                raise SignatureError(f"signature {sig!r} gives a value for {s.name!r}, which "
                                     "is not const", f.span)
            try:  # the value a call would bind, refused as a call's would be
                value = NONE if dims is None and s.takes_none else convert(f.name, s, dims,
                                                                          f.span)
            except ArgumentError as err:
                raise SignatureError(f"signature {sig!r}: {err.message}", f.span) from None
            types[s.name] = StaticScalar(SUPPORTED[value.dtype], (), value.item())
        elif s.const and not dims and dtype in ("i32", "i64", "bool") \
                and (s.dtype is None or s.dtype in INTEGRAL):
            # a call's const integer picks its program by value (args.static_names)
            example = "True" if dtype == "bool" else "1"
            raise SignatureError(f"signature {sig!r} gives {s.name!r} as {dtype}, but it is "
                                 f"const: its value picks the program, so give the value, "
                                 f"e.g. {example}", f.span)
        else:
            t = TensorType(dtype, dims)
            if len(dims) > MAX_RANK:  # (NumPy's limit: no call could pass one)
                raise SignatureError(f"cannot compile {sig!r}: argument {s.name!r} has "
                                     f"{len(dims)} axes, and an array has at most {MAX_RANK}",
                                     f.span)
            if isinstance(t.size, int) and t.size * NUMPY[dtype].itemsize > MAX_SIZE:
                raise SignatureError(f"cannot compile {sig!r}: argument {s.name!r} of type {t} "
                                     "needs more memory than can be addressed", f.span)
            types[s.name] = t
    # A param's size name is the size an argument's annotation gives it
    # (a call checks they agree: args.check_param_sizes), else the size the
    # signature names so (`g(f64[m, k])` for `param b: f64[k]`: it was a
    # size of its own, so x + b did not broadcast; the program checks a
    # call's sizes agree), else one shared by the params alone
    # (`shapes.made_up`: a --sig may name a size p_m).
    in_sig = set(re.findall(r"[A-Za-z_]\w*", sig.partition("(")[2], re.ASCII))
    named = {d.factors[0]: d for t in types.values() if isinstance(t, TensorType)
             for d in t.shape if isinstance(d, Sym) and len(d.factors) == 1
             and d.coef == 1 and d.factors[0] in in_sig}
    named.update({d: types[s.name].shape[axis] for s in reversed(f.specs)
                  if s.name in types and isinstance(types[s.name], TensorType)
                  and len(s.dims or ()) == types[s.name].rank
                  for axis, d in enumerate(s.dims or ()) if isinstance(d, str)})
    for w, spec in zip(f.reads, f.param_specs):
        dims = tuple(d if isinstance(d, int) else named.get(d, made_up(d, "param"))
                     for d in (spec.dims or ()))
        types[w] = TensorType(spec.dtype or "f64", dims)
    return types


def compile_module(path: str, out_dir: str, sigs: Optional[list[str]] = None,
                   target: "Target | str" = targets.DEFAULT, precompile: bool = False,
                   progress=None, force: bool = False,
                   note: Callable[[str], None] = lambda text: None) -> Path:
    """Write the module; without `sigs`, each function's `default_sig`,
    with a `note` for each of those whose sizes are fixed (its module then
    serves no other sizes)."""
    with ahead_of_time():
        return _compile_module(path, out_dir, sigs, target, precompile, progress, force, note)


@contextmanager
def ahead_of_time() -> Iterator[None]:
    """Lowering as for a module compiled ahead of time (`gradc compile`,
    and `gradc show` of what it compiles): a fixed region of an axis of
    symbolic size lowers, checked at run time, since no program can be made
    later for a call's sizes (`lower.REGIONS_OF_SYMBOLIC_AXES`)."""
    token = REGIONS_OF_SYMBOLIC_AXES.set(True)
    try:
        yield
    finally:
        REGIONS_OF_SYMBOLIC_AXES.reset(token)


def _compile_module(path: str, out_dir: str, sigs: Optional[list[str]], target: "Target | str",
                    precompile: bool, progress, force: bool, note: Callable[[str], None]
                    ) -> Path:
    out = Path(out_dir)
    name = Path(path).stem
    if name in ("__main__", "__init__"):
        raise OutputError(f"cannot write a module named {name}: no import reaches a "
                          f"{name}.py as a module of its own ({name} is the script run, "
                          "or its directory's package); rename the .grad file")
    if name in SHADOWED:
        raise OutputError(f"cannot write a module named {name}: in {out} it would stand in "
                          f"for the {name} that Python or gradc's modules import, and they "
                          "would fail to import; rename the .grad file")
    target_file = out / f"{name}.py"
    if target_file.exists() and not force and not written_by_gradc(target_file):
        raise OutputError(f"{target_file} exists and gradc did not write it; choose "
                          "another output directory with -o, or overwrite it with --force")
    module = load(path)
    if out.exists() and not out.is_dir():  # (mkdir would say "File exists")
        raise OutputError(f"the output directory {out} is a file")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create the output directory {out}: {err.strerror}") \
            from None
    functions = module.functions
    sig_texts = sigs
    if not sigs:
        sig_texts = []
        for f in functions.values():
            sig, why = default_sig(f)
            sig_texts.append(sig)
            if why:
                note(f"no --sig, and {f.name}() compiled for no signature of symbolic sizes "
                     f"({why}): it is compiled for {sig} only; give the sizes it is called "
                     "with in --sig (a name for sizes that must agree, an integer for a "
                     "fixed one)")
    target = targets.get(target)
    spec: dict = {"target": target.name,
                  "params": [tuple(module.params.spec(w)) for w in _declared(module)],
                  "functions": {}, "source": _source_stamp(Path(path), out),
                  "imports": _import_stamps(module, out)}
    # (function, kind, argument types, signature, program) to run once
    samples: list[tuple[str, str, dict, str, dict]] = []
    kernel_files: dict[Path, str] = {}
    for text in sig_texts:
        name, args = parse_sig(text)
        f = signed(functions, name, text, path)
        types = _types(f, args, text)
        entry = spec["functions"].setdefault(
            name, {"params": [tuple(s) for s in f.specs], "reads": list(f.reads),
                   "programs": [], "wrt": [], "defaults": static_defaults(f),
                   "default_values": default_values(f), "doc": f.__doc__,
                   # (where its errors are: they named no place)
                   "span": (f.span.file, f.span.line, f.span.col, f.span.end_line,
                            f.span.end_col)})
        key = [(n, np.dtype(NUMPY[t.dtype]).str, t.rank)
               + ((t.value,) if isinstance(t, StaticScalar) else ()) for n, t in types.items()]
        # programs of one key (dtype and rank) differ in their fixed sizes
        sizes = [[d if isinstance(d, int) else None for d in t.shape] for t in types.values()]
        wrt = tuple(n for n, t in types.items() if t.is_float and
                    next(s for s in f.specs + f.param_specs if s.name == n).differentiable)
        transforms: list[tuple[str, Compiled, dict]] = [("call", f, types)]
        if wrt:
            # pullback(args..., cotangents...): what dsl.vjp and dsl.Tape run
            outputs = _lower(f, f, types, args).out_types
            pullback = VjpFunction(f, len(outputs))
            cts = dict(zip(pullback.ct_names, outputs))
            transforms += [("grad", GradFunction(f, wrt, with_value=False), types),
                           ("value_and_grad", GradFunction(f, wrt, with_value=True), types),
                           ("pullback", pullback, {**types, **cts})]
            entry["wrt"].append((key, list(wrt)))
        for kind, fn, fn_types in transforms:
            lowered = _lower(f, fn, fn_types, args)
            optimized = optimize(lowered)
            generated = generate(optimized, target, frozenset(f.reads))
            kernels = []
            for kernel_source in generated.kernel_modules:  # one file per kernel, shared
                kernels.append("_" + kernel_module_name(kernel_source))
                kernel_files[out / f"{kernels[-1]}.py"] = kernel_source
            program = {"kernels": kernels, "driver": generated.driver_source, "sizes": sizes,
                       "outs": out_types(lowered, fn_types)}
            if precompile:
                size = _sample_size(symbolic_reaches(optimized), f, text)
                _samples(fn_types, text, np.empty, size)  # can they be made? (no memory touched)
                samples.append((name, kind, fn_types, text, program, size))
            entry["programs"].append((kind, key, program))
    spec["uncompiled"] = [n for n in functions if n not in spec["functions"]]
    for kernel_file, kernel_source in kernel_files.items():  # every signature worked
        _write(kernel_file, kernel_source)
    _write(target_file, _module_source(path, sig_texts, spec))
    if precompile:
        _precompile(target_file, samples, progress)
    return target_file


def out_types(function: Function, types: dict) -> list:
    """The dtypes and shapes of `function`'s results, for arguments of
    `types`, as a compiled module keeps them (`runtime.aot.AotFunction.
    out_types`): each size an int, or [coef, [[argument, axis], ...]] for
    coef times the sizes of those arguments' axes (every symbolic size is
    a product of the arguments' sizes)."""
    axes: dict[str, list] = {}  # the name of a symbolic size -> [argument, axis] of that size
    for name, t in types.items():
        for axis, d in enumerate(t.shape):
            if isinstance(d, Sym) and d.coef == 1 and len(d.factors) == 1:
                axes.setdefault(d.factors[0], [name, axis])
    return [[t.dtype, [d if isinstance(d, int) else [d.coef, [_axis_of(x, axes) for x in d.factors]]
                       for d in t.shape]] for t in function.out_types]


def _axis_of(factor: str, axes: dict[str, list]) -> list:
    """[argument, axis] of a symbolic size's factor, or [argument, axis, c,
    s, k] for min(ceil(max(0, that size - c) / s), k) (k None: no bound): a
    slice's length (`shapes.derivation`)."""
    made = derivation(factor)
    return axes[factor] if made is None else axes[made[0]] + list(made[1:])


def static_defaults(f: GradFn) -> dict:
    """{name: value} of f's defaulted parameters whose value picks the
    program (a `const` integer, bool or None): a call passing the default
    runs the program compiled for leaving it out, and the other way round
    (`runtime.aot.AotFunction.bind`), as both are one program."""
    statics = const_scalar_names(f.specs)
    return {p.name: p.default.value for p in f.fdef.params
            if p.name in statics and p.default is not None
            and (p.default.value is None or isinstance(p.default.value, (bool, int)))}


def default_values(f: GradFn) -> dict:
    """{name: value} of every default of f, as the source wrote it, for
    its signature (`runtime.aot.AotFunction.call_signature`); a float that
    is no finite number as its text, which `float` reads (SPEC is a
    literal, and `inf` is none)."""
    return {p.name: p.default.value if not isinstance(p.default.value, float)
            or math.isfinite(p.default.value) else repr(p.default.value)
            for p in f.fdef.params if p.default is not None}


def signed(functions: dict[str, GradFn], name: str, sig: str, path: str) -> GradFn:
    """The function a signature names, or `SignatureError`."""
    if name not in functions:
        raise SignatureError(f"signature {sig!r} names no function of {path} "
                             f"(it defines: {', '.join(functions) or 'none'})")
    return functions[name]


def value_needed(f: GradFn, err: NeedsValue) -> SignatureError:
    """A program compiled ahead of time cannot be compiled again for a
    value at call time: the size must be a const parameter (a module
    `param` cannot be one: passed as an argument, it can)."""
    if all(spec.name != err.name for spec in f.specs):  # a `param k: i64` the function reads
        return SignatureError(f"{f.name}() uses the param {err.name!r} as a size or an axis, "
                              "which a program compiled ahead of time cannot take at call "
                              f"time; pass it to {f.name}() as an argument `{err.name}: "
                              "const i64` and give its value in the signature", f.span)
    return SignatureError(f"{f.name}() uses its argument {err.name!r} as a size; to compile "
                          f"it ahead of time, declare it `{err.name}: const i64` and give "
                          "its value in the signature", f.span)


def _lower(f: GradFn, fn: Compiled, types: dict, args: list) -> Function:
    """fn's IR for a signature of f, with errors that say how to fix it."""
    try:
        return fn.lower(types)
    except NeedsValue as err:
        raise value_needed(f, err) from None
    except NeedsConcrete as err:
        raise SizesNeeded(f"{f.name}() cannot be compiled for any size: {err}; give "
                          f"concrete sizes in --sig, e.g. {_with_sizes(f.name, args)}",
                          err.at(f.span)) from None
    except GradError as err:
        consts = [s.name for s, (dtype, dims) in zip(f.specs, args)
                  if s.const and dtype in ("i32", "i64", "bool") and not dims]
        # (a const integer array, such as labels, is no axis nor index: its
        # values are read at run time)
        any_sizes = {d.factors[0] for dtype, dims in args if dtype != "static" for d in dims
                     if isinstance(d, Sym) and _ANY_SIZE.fullmatch(d.factors[0])}
        # (an error of sizes that the ':'s left free: one naming two of them)
        named = set(re.findall(r"\w+", err.message)) & any_sizes
        # (after the note naming the call that reached it, in a called function)
        if consts:
            err.add_note(f"a const integer used as an axis or index needs its value "
                         f"in the signature, e.g. {consts[0]} given as 1")
            raise
        if named:  # (names no caller wrote: "shape [a1, a2]" for the ':'s of f64[:, :])
            listed = sorted(named, key=lambda n: int(n[1:]))
            what = "the sizes ':'s" if len(listed) > 1 else "the size a ':'"
            err.add_note(f"{', '.join(listed)}: {what} of the signature stand"
                         f"{'' if len(listed) > 1 else 's'} for (numbered from a0, in order)")
        if len(named) > 1:
            err.add_note("each ':' in a signature is a size of its own, which need not equal "
                         "any other; name the sizes that must agree, as in f(f64[n], f64[n])")
        raise


def _with_sizes(name: str, args: list, size: int = 128) -> str:
    """The signature `args` (as `parse_sig` reads it) with every symbolic
    size `size`: an example of the concrete signature an error asks for."""
    parts = []
    for dtype, dims in args:
        if dtype == "static":
            parts.append(str(dims))
            continue
        shown = ", ".join(str(d if isinstance(d, int) else size) for d in dims)
        parts.append(f"{dtype}[{shown}]" if dims else dtype)
    return f"{name}({', '.join(parts)})"


def _sample_size(reaches: dict[Sym, int], f: Compiled, sig: str) -> int:
    """The size of every symbol in a program's samples: 3, or what the
    program's fixed regions of symbolic axes need (`symbolic_reaches`);
    a `SignatureError` for a region of an axis that no size makes long
    enough (`_longest`: `x[-3:][3]`), which the search ran after for ever."""
    for d, need in reaches.items():
        longest = _longest(d)
        if longest is not None and longest < need:
            raise SignatureError(f"cannot compile {sig!r}: {f.name}() selects element "
                                 f"{need - 1} of an axis of {d} elements, which no size makes "
                                 f"longer than {longest}", f.span)
    size = 3
    while any(_sample_length(d, size) < need for d, need in reaches.items()):
        size += 1
    return size


def _longest(d: Sym) -> Optional[int]:
    """The most elements an axis of size d has for any sizes of its symbols,
    where each factor is a slice's length of at most k (`shapes.limited`:
    `x[-3:]`, min(n, 3)), else None (it grows with them).  (A slice's
    length is nondecreasing in the size it is of, so where it is, a large
    enough sample reaches it.)"""
    bounds = [made[3] if made else None for made in map(derivation, d.factors)]
    return None if None in bounds else d.coef * math.prod(bounds)


def _sample_length(d, size: int) -> int:
    """An axis of size d in the samples: each symbol `size` (a slice's
    length of one, `shapes.shortened`, max(0, size - c))."""
    if isinstance(d, int):
        return d
    named = {base_of(f) for f in d.factors}
    return evaluate(d, dict.fromkeys(named, size))


def _samples(types: dict, sig: str, make=np.ones, size: int = 3) -> list[np.ndarray]:
    """Small arguments of these types (every symbolic size `size`), to run
    a program on once, made by `make`; `SignatureError` for those NumPy
    cannot make."""
    samples = []
    for t in types.values():
        if isinstance(t, StaticScalar):
            samples.append(np.asarray(t.value, NUMPY[t.dtype]))
            continue
        shape = tuple(_sample_length(d, size) for d in t.shape)
        try:
            samples.append(make(shape, NUMPY[t.dtype]))
        except (ValueError, MemoryError) as err:
            raise SignatureError(f"cannot compile {sig!r} now: it is compiled by running it "
                                 f"once, on arrays of these sizes (a symbolic size as {size}), and "
                                 f"NumPy cannot make one of shape {list(shape)} ({err})") \
                from None
    return samples


def _source_stamp(source: Path, out: Path) -> tuple[str, str, str]:
    """(the source's path from the module's directory, the SHA-256 of its
    bytes, its absolute path): how a compiled module tells that its source
    changed since (`runtime.aot._warn_if_changed`: the file at the absolute
    path is the source while it is there; the relative path finds it where
    the module moved with it)."""
    absolute = source.resolve()
    try:
        where = os.path.relpath(absolute, out.resolve())
    except ValueError:  # another drive (Windows)
        where = str(absolute)
    return where, hashlib.sha256(source.read_bytes()).hexdigest(), str(absolute)


def _import_stamps(module: Module, out: Path) -> list[tuple[str, str, str]]:
    """`_source_stamp` of each `.grad` file the module's imports reach,
    but the standard library's (which changes only with gradlang, whose
    modules are for its own version): an edited import is as stale as an
    edited source."""
    return [_source_stamp(Path(file), out) for file, _, _ in import_graph(module._namespace)[1:]
            if not Path(file).resolve().is_relative_to(STDLIB)]


def _declared(module: Module) -> list[str]:
    return [s for s in module.params._specs]


def _write(path: Path, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as err:
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    _forget_bytecode(path)


def _forget_bytecode(path: Path) -> None:
    """Remove the bytecode Python cached for the module at `path`: Python
    trusts it while the source keeps its size and its mtime in whole
    seconds, so a module compiled again within the second it was imported
    (another constant, the same length) imported, or reloaded, the old code."""
    try:
        os.unlink(importlib.util.cache_from_source(str(path)))
    except (OSError, NotImplementedError):  # none cached, or no cache at all
        pass


MARKER = "# Generated by gradc compile: rewritten by every compile, do not edit."


def written_by_gradc(path: Path) -> bool:
    """Whether the file at `path` is a module `gradc compile` wrote (so it
    may be overwritten), recognized by its first line: a regular file
    (`read_regular_file`: a FIFO there, which a plain open() waits on for
    ever, hung gradc compile; it is none)."""
    data = read_regular_file(path, len(MARKER.encode()) + 1)  # (not all of a large file)
    return data is not None and \
        data.split(b"\n", 1)[0].decode("utf-8", errors="replace") == MARKER


def _module_source(path: str, sigs: list[str], spec: dict) -> str:
    # User text (the file name, signatures, function names) appears only
    # inside repr() literals, never spliced into code or a docstring.
    return (MARKER + "\n"
            '"""An ahead-of-time compiled .grad module (gradc compile).\n\n'
            "SOURCE names the .grad file and SIGNATURES the signatures compiled.\n"
            "Each function is an attribute (getattr(m, 'lambda') for a keyword) and\n"
            "in `functions`; one whose name the module uses itself (params,\n"
            "functions, SOURCE, SIGNATURES, SPEC, AotModule, dunders) is only in\n"
            "`functions`.  Each is callable, with .grad, .value_and_grad and .vjp;\n"
            "`params` holds the values of the module's params.  Needs numpy, numba\n"
            'and the gradlang runtime, not the compiler.\n"""\n'
            "from gradlang.runtime.aot import AotModule\n\n"
            f"SOURCE = {Path(path).name!r}\n"
            f"SIGNATURES = {list(sigs)!r}\n"
            f"SPEC = {spec!r}\n\n"
            "AotModule(__name__, __file__, SPEC).export(globals())\n")


def _precompile(target_file: Path, samples, progress) -> None:
    """Import the module, run every program once on small arrays, then
    compile the other variants of every kernel (parallel; a full sum's
    `_all` and `_all_serial`, which a driver runs for one row, the latter
    on a busy machine) with the serial variant's types."""
    name = f"_gradc_precompile_{abs(hash(str(target_file)))}"
    loader_spec = importlib.util.spec_from_file_location(name, target_file)
    compiled = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(compiled)
    for index, (fname, kind, types, sig, program, size) in enumerate(samples, 1):
        arrays = _samples(types, sig, size=size)  # one program's at a time
        if progress:
            progress(f"[{index}/{len(samples)}] compiling {kind} of {fname}")
        aot = compiled.functions[fname].module
        driver = aot.driver(program)
        driver(*[aot.target.accept(a, f"a sample argument of {fname}()") for a in arrays])
        kernels = driver.__globals__["K"]
        for attr in dir(kernels):
            if attr.endswith("_serial") and not attr.endswith("_all_serial"):
                serial, base = getattr(kernels, attr), attr[:-len("_serial")]
                variants = [getattr(kernels, name) for name in (base, f"{base}_all",
                                                                 f"{base}_all_serial")
                            if hasattr(kernels, name)]
                for signature in serial.signatures:
                    for variant in variants:
                        variant.compile(signature)
