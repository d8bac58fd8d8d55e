"""The runtime side of an ahead-of-time compiled module (`gradc compile`).

Contract: a compiled module holds a literal `SPEC` (its target, each
function's parameter specs, the params it reads, and for each signature
and kind — call, grad, value_and_grad, pullback (arguments and
cotangents in, one cotangent per differentiated argument out) — the names
of its kernel files beside it (a file per kernel, named by a hash of its
text, so that programs running one kernel share its file and its machine
code), the source of a plain-Python driver and its results' dtypes and
shapes (`out_types`, which `dsl.aot_bridge` gives JAX's traced calls);
the values of its const integer, bool and None defaults; and the
functions of the source no signature named) and builds its functions with
`AotModule`, which warns when the `.grad` file it was compiled from, or one
its imports reached, has changed since (`_warn_if_changed`), and makes the
module's `__getattr__` say that a function was not compiled.  Nothing here
imports the parser or the compiler: a call binds and validates its
arguments (`runtime.args`), picks the program by dtype and rank, then by
the fixed sizes its signature gave (`f(f64[3])` and `f(f64[4])` are two
programs), and runs it (a const argument given its default's value and
one left out are one call: the program compiled for either runs it; a
call that gives or leaves out a defaulted parameter otherwise needs a
signature that does the same, and its error says so); kernels load from
files beside the module, whose machine code Numba caches there, so a
process that imports a module compiled with `--sig` neither parses nor
compiles.  An `AotFunction` (and
its `AotGradient`) pickles by reference, as a Python function does: its
module's name, imported again where it is unpickled (and its params
there, that module's); a module not importable by its name is a
`TypeError` when pickled, and so is a stale function (of an earlier
import of its module, before `importlib.reload`), whose error says so.
"""
from __future__ import annotations

import hashlib
import importlib
import itertools
import math
import os
import sys
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any, Collection, Optional, Sequence

import numpy as np

from gradlang.runtime import target as targets
from gradlang.runtime.args import (NONE, NUMPY, SUPPORTED, ParamSpec, bind, call_key,
                                   check_param_sizes, convert, is_dask_array, is_python_number,
                                   static_names)
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, Span, called
from gradlang.runtime.loader import load_kernel_files, make_driver, read_regular_file
from gradlang.runtime.params import ParamStore, guard_params, reads_as_param
from gradlang.runtime.pullback import OutType, Pullback
from gradlang.runtime.recording import TapeError, record, recording_tapes
from gradlang.runtime.signatures import SignatureAttribute, call_signature

KINDS = ("call", "grad", "value_and_grad", "pullback")


class AotModule:
    def __init__(self, name: str, file: str, spec: dict):
        self.name = name
        self.directory = os.path.dirname(os.path.abspath(file))
        for source in ([spec["source"]] if "source" in spec else []) + spec.get("imports", []):
            _warn_if_changed(name, self.directory, *source)
        self.target = targets.get(spec.get("target", targets.DEFAULT))
        self.helpers = self.target.helpers
        self.params = ParamStore([ParamSpec(*p) for p in spec["params"]], name)
        self.functions = {fname: AotFunction(self, fname, fspec)
                          for fname, fspec in spec["functions"].items()}
        self._drivers: dict[tuple, Any] = {}
        # the functions of the source no signature named (none in modules
        # of earlier versions)
        self.uncompiled = tuple(spec.get("uncompiled", ()))

    def export(self, namespace: dict) -> None:
        """Make `namespace` (a compiled module's globals) hold `params`,
        `functions`, and each function under its own name, unless the
        module already uses that name (SPEC, a dunder, ...), so no
        function name, a keyword included, can break the module.  A
        function an earlier run of the module exported (before
        `importlib.reload`) is replaced, or removed where this run has
        none of its name (a module compiled again without it), so that
        reading it says it was not compiled instead of running the old
        program."""
        for fname, value in list(namespace.items()):
            if isinstance(value, AotFunction) and fname not in self.functions:
                del namespace[fname]
        namespace["params"] = self.params
        guard_params(namespace)  # (`m.params = ...` would be read by no function)
        namespace["functions"] = dict(self.functions)
        namespace["__getattr__"] = self._missing  # (the module defines none of its own)
        for fname, function in self.functions.items():
            if isinstance(namespace.get(fname, function), AotFunction):  # not the module's
                namespace[fname] = function

    def _missing(self, name: str):
        """The module's `__getattr__`: an AttributeError that says why a
        function of the source is not there."""
        if name in self.uncompiled:
            raise AttributeError(f"{name}() of {self.name} was not compiled: no --sig of gradc "
                                 "compile named it; add one for it, or load the .grad file "
                                 "with dsl.load")
        raise AttributeError(f"module {self.name!r} has no attribute {name!r}")

    def driver(self, program: dict):
        files = program["kernels"]
        files = (files,) if isinstance(files, str) else tuple(files)  # (earlier: one file)
        key = (files, program["driver"])
        if key not in self._drivers:
            kernels = load_kernel_files([os.path.join(self.directory, f + ".py") for f in files])
            self._drivers[key] = make_driver(program["driver"], kernels, self.helpers)
        return self._drivers[key]


def _warn_if_changed(name: str, directory: str, source: str, digest: str,
                     compiled_from: Optional[str] = None) -> None:
    """Warn when a .grad file module `name` was compiled from (its own, or
    one its imports reached) has changed since: its bytes' SHA-256 is no
    longer `digest` (the module runs what was compiled, not the file).

    The file is the one at `compiled_from`, the absolute path it was
    compiled from, while that is there: a copy of the module's directory
    placed beside another file of the source's name (its relative path
    `source`, from `directory`) is not warned about that file, which is not
    the module's source (a copy of the source, edited, is not either).
    Where that path is gone (the tree moved, or was copied to another
    machine), the file at `source` from the module's directory stands for
    it, and the warning says so; where neither is there (shipped without
    its source), nothing is said.  A module of an earlier gradc records
    no `compiled_from`: `source` alone."""
    here = os.path.normpath(os.path.join(directory, source))
    moved = compiled_from is not None and compiled_from != here
    original = _digest(compiled_from) if moved else None
    if original is not None:  # the very file it was compiled from
        if original != digest:
            _warn(f"{compiled_from} has changed since gradc compiled this module ({name}) from "
                  "it, which runs what was compiled then; compile it again with gradc compile")
        return
    found = _digest(here)
    if found is None or found == digest:
        return
    if not moved:
        _warn(f"{here} has changed since gradc compiled this module ({name}), which runs "
              "what was compiled then; compile it again with gradc compile")
    else:
        _warn(f"{here} differs from the .grad file gradc compiled this module ({name}) from, "
              f"{compiled_from}, which is gone; it is at that file's place beside the module: "
              "if it is that file, moved and edited, compile it again with gradc compile (the "
              "module runs what was compiled then)")


def _digest(path: str) -> Optional[str]:
    """The SHA-256 of a regular file's bytes, None where none is at `path`
    (a FIFO there is not waited on)."""
    data = read_regular_file(Path(path))
    return None if data is None else hashlib.sha256(data).hexdigest()


def _warn(message: str) -> None:
    # (at the compiled module's line that builds the AotModule)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


class AotFunction:
    """A compiled function: call it, or its `.grad` / `.value_and_grad`
    (the gradient of the sum of its outputs w.r.t. every float argument
    and param it reads), or `.vjp`.  It offers what `dsl.grad`,
    `dsl.value_and_grad`, `dsl.vjp` and `dsl.Tape` need of a function
    (`name`, `specs`, `param_specs`, `span`, `differentiable_names`,
    `gradient`, `vjp`), first order only: there is no IR to differentiate
    again."""

    def __init__(self, module: AotModule, name: str, spec: dict):
        self.module = module
        self.name = self.__name__ = name
        # its definition in the .grad file it was compiled from, which its
        # errors name (no caret line: the source is not read); none in a
        # module of an earlier version
        self.span = Span(*spec["span"]) if "span" in spec else None
        self.specs = tuple(ParamSpec(*p) for p in spec["params"])
        # const integers of no width, which a NumPy i32 may be given for
        # (`_narrow_statics`: found once, for a call of arrays to pay nothing)
        self.widthless_consts = tuple(s.name for s in self.specs
                                      if s.const and s.dtype in (None, "int"))
        self.reads = tuple(spec["reads"])
        self.param_specs = tuple(module.params.spec(w) for w in self.reads)
        # (kind, dtype and rank of each argument) -> the programs compiled for
        # it, which differ in their fixed sizes
        self.programs: dict[tuple, list[dict]] = {}
        for kind, sig, program in spec["programs"]:
            self.programs.setdefault((kind, tuple(tuple(a) for a in sig)), []).append(program)
        self.wrt = {tuple(tuple(a) for a in sig): tuple(names)
                    for sig, names in spec["wrt"]}
        # {name: value} of the defaulted parameters whose value picks the
        # program (none in modules of earlier versions)
        self.defaults = dict(spec.get("defaults", {}))
        # every default's value as the source wrote it, for the signature (a
        # float that is no finite number as its text: SPEC is a literal)
        self.default_values = {n: float(v) if isinstance(v, str) else v
                               for n, v in spec.get("default_values", {}).items()}
        self.__doc__ = spec.get("doc") or f"{name}() of the gradc-compiled module {module.name}"

    @property
    def target(self):
        return self.module.target

    def bind(self, args, kwargs, params: Optional[dict[str, Any]] = None
             ) -> dict[str, np.ndarray]:
        """The validated arguments and the module params the function
        reads, each from `params` when given there (as the bridges pass
        tensors for them), else the module's value."""
        self._refuse_dask(args, kwargs)
        bound = self._bind(args, kwargs, params=params)
        numbers = any(map(is_python_number, args)) or any(map(is_python_number, kwargs.values()))
        narrow = self._narrow_statics(bound)
        if (numbers or self.defaults or narrow) and not self._compiled(bound):
            # a Python number is weakly typed: f32 beside f32 arrays, or f64
            # where only that was compiled (as every Python number once was);
            # a const parameter's default picks one program whether given or
            # left out; (only such a call looks: a call of arrays pays nothing)
            candidates = [bound] + ([self._bind(args, kwargs, numbers="f64", params=params)]
                                    if numbers else [])
            for candidate in candidates:
                for form in self._default_forms(candidate):
                    for widened in ([form, self._widened(form, narrow)] if narrow else [form]):
                        if self._compiled(widened):
                            return widened
        return bound

    def _narrow_statics(self, bound: dict[str, np.ndarray]) -> tuple[str, ...]:
        """The const integers of `bound` that are NumPy integers of another
        width than i64 (`np.int32(0)` for an axis) where the parameter
        names no width: its value alone picks the program (it is a
        constant of it, as in `dsl.load`'s), and a signature gives it as a
        Python int, i64, so no --sig could compile one of i32."""
        return tuple(n for n in self.widthless_consts
                     if n in bound and np.ndim(bound[n]) == 0
                     and np.dtype(bound[n].dtype) == np.int32)

    @staticmethod
    def _widened(bound: dict[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
        """`bound` with the integers `names` (those it still has) as i64."""
        return {n: a.astype(np.int64) if n in names else a for n, a in bound.items()}

    def _refuse_dask(self, args, kwargs) -> None:
        """A Dask argument is an ArgumentError: NumPy would compute it
        whole, in memory, and return NumPy arrays where `dsl.load`'s
        function returns lazy Dask arrays, block by block (the split into
        blocks needs the compiler)."""
        for name, value in itertools.chain(self.by_name(args).items(), kwargs.items()):
            if is_dask_array(value):
                raise ArgumentError(
                    f"argument {name!r} of {self.name}() is a Dask array, which a gradc-compiled "
                    "module does not split into blocks (that needs the compiler): load the "
                    f".grad file with dsl.load for lazy Dask results, or pass {name}.compute()")

    def _default_forms(self, bound: dict[str, np.ndarray]):
        """`bound` with each const argument that has its default's value
        (`self.defaults`) given or left out, every way: each the same
        call, which the program compiled for any of them runs."""
        at_default = [n for n, value in self.defaults.items()
                      if n not in bound or _is_value(bound[n], value)]
        order = [s.name for s in self.specs] + list(self.reads)
        specs = {s.name: s for s in self.specs}
        for given in itertools.product((False, True), repeat=len(at_default)):
            form = dict(bound)
            for n, give in zip(at_default, given):
                if not give:
                    form.pop(n, None)
                elif n not in form:
                    value = self.defaults[n]
                    form[n] = NONE if value is None else convert(self.name, specs[n], value, None)
            yield {n: form[n] for n in order if n in form}

    def _bind(self, args, kwargs, numbers: Optional[str] = None,
              params: Optional[dict[str, Any]] = None) -> dict[str, np.ndarray]:
        bound = bind(self.name, self.specs, args, kwargs, numbers=numbers)
        for w in self.reads:
            bound[w] = self.module.params.validate(w, params[w]) if params and w in params \
                else self.module.params.require(w, self.name)
        check_param_sizes(self.name, self.specs, [self.module.params.spec(w) for w in self.reads],
                          bound, None)
        return bound

    def by_name(self, args: Sequence[Any]) -> dict[str, Any]:
        """A call's positional values by the name of their parameter."""
        return {s.name: a for s, a in zip(self.specs, args)}

    def differentiable_names(self, bound: dict[str, np.ndarray]) -> list[str]:
        """The arguments that get a gradient: those the module was compiled
        to differentiate for this call's signature."""
        return list(self.wrt.get(self._signature(bound), ()))

    def _compiled(self, bound: dict[str, np.ndarray]) -> bool:
        """Whether a program was compiled for the signature of `bound`."""
        sig = self._signature(bound)
        return any(s == sig for _, s in self.programs)

    def _signature(self, bound: dict[str, np.ndarray]) -> tuple:
        return call_key(bound, static_names(self.specs, bound))

    def _program(self, kind: str, sig: tuple, arrays: dict[str, Any]) -> dict:
        """The program of this kind for arguments `arrays`, of signature
        `sig`: the first compiled for their dtypes and ranks whose fixed
        sizes they have."""
        programs = self.programs.get((kind, sig))
        if programs is None and kind != "call" and (("call", sig) in self.programs):
            if self.wrt.get(sig):
                raise ArgumentError(f"{self.name}() was compiled without a {kind} program; "
                                    "compile it again with this version of gradc")
            raise ArgumentError(f"{self.name}() has no float arguments to differentiate")
        shapes = [tuple(a.shape) for a in arrays.values()]
        for program in programs or ():
            sizes = program.get("sizes")  # (none in modules of earlier versions)
            if sizes is None or all(d is None or d == size for dims, shape in zip(sizes, shapes)
                                    for d, size in zip(dims, shape)):
                return program
        have = [self._describe(s, p.get("sizes")) for (k, s), ps in self.programs.items()
                if k == kind for p in ps]
        raise ArgumentError(f"{self.name}() was compiled for {', '.join(sorted(set(have)))}; "
                            f"this call is {self._describe(sig, shapes)}; add it with "
                            f"gradc compile --sig{self._defaults_note(kind, sig)}")

    def _defaults_note(self, kind: str, sig: tuple) -> str:
        """Why a call differing from a compiled signature only in the
        defaulted parameters it passes is not served: a default that is
        not const is a constant of the program compiled without it, and an
        argument (differentiated) of the one compiled with it.  (A const
        default, `self.defaults`, is served given or left out, `bind`: a
        call it differs in has another value, which no note would help.)"""
        defaulted = {s.name for s in self.specs if s.has_default} - set(self.defaults)
        passed = {n for n, *_ in sig}
        if any(k == kind and {n for n, *_ in compiled} == passed for k, compiled in self.programs):
            return ""  # (a program passing the same ones: the call differs elsewhere)
        for k, compiled in self.programs:
            names = {n for n, *_ in compiled}
            common = names & passed  # (given alike, else the note would mislead)
            alike = {a for a in compiled if a[0] in common} == {a for a in sig if a[0] in common}
            if k == kind and names != passed and names ^ passed <= defaulted and alike:
                what = ("leaves out " + ", ".join(sorted(names - passed)) if names - passed
                        else "passes " + ", ".join(sorted(passed - names)))
                return (f" (this call {what}: a signature serves only calls that pass the "
                        "defaulted parameters it gives)")
        return ""

    def out_types(self, kind: str, arrays: dict[str, Any]) -> list[tuple[np.dtype, tuple]]:
        """The dtype and shape of each result of the program of this kind
        for arguments `arrays` (anything with a shape and a dtype: the
        stand-ins of a traced call), without running it."""
        program = self._program(kind, self._signature(arrays), arrays)
        if "outs" not in program:
            raise ArgumentError(f"{self.name}() was compiled by an earlier gradc, whose modules "
                                "do not say their results' shapes; compile it again")
        shapes = {n: tuple(a.shape) for n, a in arrays.items()}
        return [(NUMPY[dtype], tuple(d if isinstance(d, int) else
                                     d[0] * math.prod(_axis_size(shapes, f) for f in d[1])
                                     for d in dims))
                for dtype, dims in program["outs"]]

    def _on_target(self, bound: dict[str, np.ndarray]) -> dict[str, Any]:
        accept = self.module.target.accept
        statics = static_names(self.specs, bound)  # their values pick the program: on the host
        return {n: a if n in statics else accept(a, self.what_is(n)) for n, a in bound.items()}

    def what_is(self, name: str) -> str:
        """How a refusal of the value bound to `name` names it: a module
        param as the param the function reads (the caller passed no such
        argument: a device array of the wrong layout set as one was said
        to be "argument 'w'"), else as the argument."""
        if reads_as_param(name, self.specs, self.reads):
            return f"param {name!r} read by {self.name}()"
        return f"argument {name!r} of {self.name}()"

    def _run(self, kind: str, arrays: dict[str, Any]):
        sig = self._signature(arrays)
        outs = self.module.driver(self._program(kind, sig, arrays))(*arrays.values())
        return outs, sig

    def _describe(self, sig: Sequence, sizes: Optional[Sequence] = None) -> str:
        """A signature as text: each argument's dtype and sizes (from
        `sizes`, one per axis: an int, or None for any) or value."""
        sizes = sizes or [[None] * ndim for _, _, ndim, *_ in sig]
        # (the module params a signature binds are no arguments of the call)
        params = {s.name for s in self.param_specs}
        parts = [repr(rest[0]) if rest else
                 SUPPORTED.get(np.dtype(dt), dt)
                 + ("[" + ", ".join(":" if d is None else str(d) for d in dims) + "]"
                    if ndim else "")
                 for (name, dt, ndim, *rest), dims in zip(sig, sizes) if name not in params]
        return f"{self.name}({', '.join(parts)})"

    @user_facing
    def __call__(self, /, *args, **kwargs):
        """Run it; record the call on every active `dsl.Tape` that watches
        one of its arguments (keeping a pullback)."""
        arrays = self._on_target(self.bind(args, kwargs))
        tapes = recording_tapes(arrays.values())
        if tapes:
            outs = record(tapes, self, arrays, *self._vjp_bound(arrays))
        else:
            outs, _ = self._run("call", arrays)
        return outs[0] if len(outs) == 1 else tuple(outs)

    __signature__ = SignatureAttribute()

    def call_signature(self, out: bool = False) -> "Optional[inspect.Signature]":
        """The signature of its call (`runtime.signatures`): its parameters,
        with their defaults (no `out=`: its call takes no buffers)."""
        return call_signature(self.specs, self.default_values)

    @cached_property
    def grad(self) -> "AotGradient":
        """Its gradient w.r.t. every argument it was compiled to
        differentiate: `m.f.grad(x, y)`, as `dsl.grad(m.f, wrt=...)` of
        all of them."""
        return self.gradient(None, single=False, with_value=False)

    @cached_property
    def value_and_grad(self) -> "AotGradient":
        """(its value, `grad`)."""
        return self.gradient(None, single=False, with_value=True)

    @cached_property
    def vjp(self) -> "AotVjp":
        """(outputs, pullback), as `dsl.vjp` gives them: `m.f.vjp(x, y)`."""
        return AotVjp(self)

    def gradient(self, wrt: Optional[tuple[str, ...]], single: bool,
                 with_value: bool) -> "AotGradient":
        """The compiled gradient w.r.t. `wrt` (names; None: every argument
        it was compiled to differentiate), as `dsl.grad` gives it."""
        return AotGradient(self, wrt, single, with_value)


    def _vjp_bound(self, arrays: dict[str, Any], read_in_place: Collection[str] = ()):
        """(outputs, Pullback).  The pullback program takes the arguments
        and the cotangents (it runs the forward part again), and the
        pullback holds copies of the arguments, as a loaded function's
        holds copies of its residuals: its caller may write into one
        before calling it (the next batch into its buffer, an optimizer's
        step into a param).  Those named `read_in_place` it reads where
        they are: a caller that calls it at once, or whose library
        refuses a change to them (torch's saved tensors)."""
        outs, sig = self._run("call", arrays)
        backward = self.module.driver(self._program("pullback", sig, arrays))
        out_types = [OutType(tuple(o.shape), SUPPORTED[np.dtype(o.dtype)]) for o in outs]
        values = [self.module.helpers.copy(a)
                  if n not in read_in_place and self.target.is_array(a) else a
                  for n, a in arrays.items()]
        return outs, Pullback(self.name, backward, values, out_types, list(arrays),
                              self.wrt[sig], self.target, about=self)

    def __repr__(self) -> str:
        return f"<compiled .grad function {self.name}>"

    def __reduce__(self) -> tuple:
        module = sys.modules.get(self.module.name)
        functions = getattr(module, "functions", None)
        current = functions.get(self.name) if isinstance(functions, dict) else None
        if current is self:
            return imported_function, (self.module.name, self.name)
        what = (f"cannot pickle {self.name}() of the gradc-compiled module {self.module.name!r}: "
                "it pickles by reference, as a Python function does, and")
        if isinstance(current, AotFunction) or hasattr(module, "SPEC"):
            # the module imported under that name is a compiled one, whose
            # functions were made again: this one is an earlier import's
            now = (f"pickle the current one, {self.module.name}.functions[{self.name!r}]"
                   if current is not None else
                   f"{self.module.name} has no {self.name}() now (compiled again without it)")
            raise TypeError(f"{what} this one is stale: its module was imported again since "
                            f"(importlib.reload), which made its functions anew; {now}")
        raise TypeError(f"{what} that module is not imported under that name (import it by "
                        "its name, not from its file)")


class _FirstOrderPullback(Pullback):
    """The pullback of an AOT vjp a `dsl.Tape` recorded: its cotangents
    are first order (no IR to differentiate again), so calling it while
    a tape records on its call's arguments or on the cotangents is a
    `TapeError`, where plain cotangents would be constants to the tape
    and a gradient through them silently wrong."""

    def __init__(self, inner: Pullback, arguments: tuple):
        self.__dict__.update(inner.__dict__)
        self._arguments = arguments

    def _run(self, residuals: tuple, cts: tuple) -> tuple:
        given = [c for ct in cts for c in (ct if type(ct) is tuple else (ct,))]  # (a tuple of them)
        if recording_tapes((*self._arguments, *given)):
            raise TapeError(f"the pullback of {called(self.name)} (a gradc-compiled module, "
                            "whose gradients are first order) was called while a Tape records "
                            "its arguments: the tape cannot follow its cotangents; call it "
                            "after the tape's block, or load the .grad file with dsl.load")
        return super()._run(residuals, cts)


class AotVjp:
    """`f.vjp` of an `AotFunction` f: called as f is, it gives (outputs,
    pullback), as `dsl.vjp` does."""

    __signature__ = SignatureAttribute()

    def __init__(self, f: AotFunction):
        self.f = f
        self.name = f.name  # (its errors are f's call's, as `user_facing` names them)
        self.__name__ = f"vjp({f.name})"
        self.__doc__ = (f"{self.__name__}: (outputs, pullback) of {f.name}(), called with its "
                        f"arguments:\n\n{f.__doc__}")

    @user_facing
    def __call__(self, /, *args, **kwargs):
        f = self.f
        arrays = f._on_target(f.bind(args, kwargs))
        outs, pullback = f._vjp_bound(arrays)
        tapes = recording_tapes(arrays.values())
        if tapes:
            # a vjp of watched arrays is a call of f, as `__call__` records
            # one: its plain results were constants to the tape, which then
            # silently missed f's derivative
            outs = record(tapes, f, arrays, outs, pullback)
            pullback = _FirstOrderPullback(pullback, tuple(arrays.values()))
        return (outs[0] if len(outs) == 1 else tuple(outs)), pullback

    def call_signature(self, out: bool = False) -> "Optional[inspect.Signature]":
        return self.f.call_signature()

    @property
    def span(self):
        return self.f.span

    def __repr__(self) -> str:
        return f"<{self.__name__} of a compiled .grad module>"

    def __reduce__(self) -> tuple:
        return getattr, (self.f, "vjp")


def _is_value(array: np.ndarray, value: Any) -> bool:
    """Whether a bound static argument is `value` (a default: an int, a
    bool or None), of its kind (True is not 1)."""
    if value is None or array is NONE:
        return value is None and array is NONE
    kind = "b" if isinstance(value, bool) else "iu"
    return np.ndim(array) == 0 and np.dtype(array.dtype).kind in kind and array.item() == value


def imported_function(module: str, name: str) -> AotFunction:
    """Function `name` of the compiled module imported as `module`."""
    return importlib.import_module(module).functions[name]


class AotGradient:
    """`dsl.grad` / `dsl.value_and_grad` of an `AotFunction`: runs its
    compiled gradient program and keeps the gradients asked for."""

    __signature__ = SignatureAttribute()

    def __init__(self, f: AotFunction, wrt: Optional[tuple[str, ...]], single: bool,
                 with_value: bool):
        self.f, self.wrt, self.single, self.with_value = f, wrt, single, with_value
        self.name = self.__name__ = f"{self.kind}({f.name})"
        what = "value and gradient" if with_value else "gradient"
        among = "every argument it was compiled to differentiate" if wrt is None \
            else ", ".join(wrt)
        self.__doc__ = (f"{self.name}: the {what} of {f.name}() w.r.t. {among}; it takes the "
                        f"arguments of {f.name}():\n\n{f.__doc__}")

    def call_signature(self, out: bool = False) -> "Optional[inspect.Signature]":
        return self.f.call_signature()  # (it binds as f binds)

    @property
    def span(self):
        return self.f.span  # (where its errors are: they named no place)

    @user_facing
    def __call__(self, /, *args, **kwargs):
        return self.call_bound(self.f._on_target(self.f.bind(args, kwargs)))

    def call_bound(self, arrays: dict[str, Any]):
        """The gradients (and values) for arguments `arrays`, bound and
        on the target, arranged as the call returns them."""
        outs, sig = self.f._run(self.kind, arrays)
        return self.arrange(outs, sig)

    @property
    def kind(self) -> str:
        """The kind of the programs it runs."""
        return "value_and_grad" if self.with_value else "grad"

    def arrange(self, outs: Sequence, sig: tuple):
        """The results `outs` of its program for a call of signature `sig`
        (arrays, or what stands for them) as the call returns them."""
        compiled = self.f.wrt[sig]
        n = len(compiled)
        values, grads = outs[:len(outs) - n], dict(zip(compiled, outs[len(outs) - n:]))
        wanted = compiled if self.wrt is None else self.wrt
        missing = [w for w in wanted if w not in grads]
        if missing:
            raise ArgumentError(f"{self.f.name}() was compiled with gradients w.r.t. "
                                f"{', '.join(compiled)} for {self.f._describe(sig)}, not "
                                f"w.r.t. {', '.join(map(repr, missing))}")
        picked = [grads[w] for w in wanted]
        result = picked[0] if self.single or (self.wrt is None and len(picked) == 1) \
            else tuple(picked)
        if not self.with_value:
            return result
        return (values[0] if len(values) == 1 else tuple(values)), result

    def __repr__(self) -> str:
        return f"<{self.name} of a compiled .grad module>"

    def __reduce__(self) -> tuple:
        return AotGradient, (self.f, self.wrt, self.single, self.with_value)


def _axis_size(shapes: dict[str, tuple], factor: list) -> int:
    """A factor of a result's size (`dsl.aot`'s `out_types`): [argument,
    axis], that axis's size, or [argument, axis, c, s, k], min(ceil(max(0,
    it - c) / s), k) (k None: no bound), a slice's length
    (`compiler.shapes.derivation`); [argument, axis, c] in modules of
    earlier versions, max(0, it - c)."""
    name, axis, *made = factor
    less, every, upto = made + [0, 1, None][len(made):]
    length = -(-max(0, shapes[name][axis] - less) // every)
    return length if upto is None else min(length, upto)
