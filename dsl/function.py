"""Callable compiled functions and the transforms that make new ones.

Contract: a `Compiled` is called like the `.grad` function it stands for
(NumPy arrays, scalars or sequences in; NumPy arrays out).  On each call it
binds and validates the arguments (`runtime.args`, raising `ArgumentError`
before any kernel runs), looks up the program for the call's dtypes and
pattern of sizes (or its exact sizes, for functions that need them: both in
one bounded cache, `by_pattern`) and, on
a miss, has `compiler.pipeline` build it: each callable's `lower(types)`
returns its IR from the pipeline's first stages (lower, then the
callable's transform), and `pipeline.build_stored` runs the rest, keyed by
`identity()` (what `lower` depends on besides the types: the sources of
the function's modules, its name, the transforms on top) and the types, so
that a later process with the same key loads the stored result.  A repeated
plain call (positional ndarrays only, no tape recording) skips binding and
lookup (`FastPath`).  An integer argument a program uses as a size is
from then on compiled for by value, as a `const` one (`NeedsValue`, then
`by_value`).  `out=` takes buffers in the structure of the result, checked
by `OutSpec` before anything runs, that the kernels write into; Dask array
arguments run block by block (`dsl.dask_bridge`).  Transforms
(`GradFunction` for grad and value_and_grad, `VjpFunction` for a backward
pass, `ForwardPass` and `BackwardPass` for the two halves of a vjp, apart,
`JvpFunction` for forward mode) are themselves `Compiled`, built
from the IR of the function they wrap, so they compose: `grad(grad(f))`
differentiates the gradient's IR.  `vjp` returns the primal output and a
pullback that keeps only the residuals the backward pass reads (copies,
and the sizes it needs: its programs, too, are per pattern of sizes).
"""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np

from dsl.dask_bridge import call_on_dask, chunked_like, is_dask_array, vjp_on_dask
from dsl.lru import Lru, held_by
from gradlang.compiler import ast, pipeline
from gradlang.compiler.ir import Function, StaticScalar, TensorType
from gradlang.compiler.namespace import Namespace, param_reads
from gradlang.compiler.pipeline import Program, build_stored
from gradlang.compiler.shapes import NeedsConcrete, NeedsValue, Sym, computable, evaluate
from gradlang.compiler.vectorize import NotVectorizable, stacked_elements, vectorize
from gradlang.runtime.aot import AotFunction, AotGradient
from gradlang.runtime.args import (NUMPY, SUPPORTED, ParamSpec, bind, cast, check_param_sizes,
                                   const_scalar_names, numeric_array, static_names)
from gradlang.runtime.boundary import leaving
from gradlang.runtime.common import out_of_memory
from gradlang.runtime.errors import (UNKNOWN_SPAN, ArgumentError, ArrayTooLarge, GradError,
                                     SizeMismatchError, called, kind_of, shown)
from gradlang.runtime.forking import ChildSafeLock, cached_attribute
from gradlang.runtime.loader import source_stamp
from gradlang.runtime.params import reads_as_param
from gradlang.runtime.pullback import OutType, Pullback, output_cotangents
from gradlang.runtime.recording import THREAD, record, recording_tapes
from gradlang.runtime.signatures import (DocAttribute, SignatureAttribute, call_signature,
                                         described, header)
from gradlang.runtime.target import Target, is_device_array

Wrt = Union[int, str, Sequence[Union[int, str]]]


def specs_of(fdef: ast.FuncDef) -> tuple[ParamSpec, ...]:
    return tuple(ParamSpec(p.name, p.ann.dtype if p.ann else None,
                           p.ann.dims if p.ann else None, p.is_const,
                           p.default is not None) for p in fdef.params)


def _signature(bound: dict[str, np.ndarray], statics=frozenset()) -> tuple:
    """The exact key of a call: dtypes, shapes, and static values."""
    return tuple((name, a.dtype.str, a.shape) for name, a in bound.items()) + \
        tuple((n, bound[n].item()) for n in sorted(statics))


def _pattern(bound: dict[str, np.ndarray], statics=frozenset()) -> tuple:
    """The size pattern of a call, the key of its symbolic program: dtypes,
    ranks, which sizes are equal (size 1 stays 1, since it broadcasts), and
    static arguments by value.  (Made on every call that misses the fast
    path: plain ints, no symbols.)"""
    sizes: dict[int, int] = {}
    key = []
    for name, a in bound.items():
        if name in statics:
            key.append((name, a.dtype.str, repr(a.item())))
        else:
            key.append((name, a.dtype.str, tuple(
                -1 if d == 1 else sizes.setdefault(d, len(sizes)) for d in a.shape)))
    return ("symbolic", tuple(key))


def _symbolic(bound: dict[str, np.ndarray], statics=frozenset()) -> dict[str, TensorType]:
    """The symbolic types of a call's `_pattern`: equal sizes share a
    symbol; size 1 stays 1."""
    symbols: dict[int, Sym] = {}
    types = {}
    for name, a in bound.items():
        if name in statics:
            types[name] = static_type(a)
            continue
        shape = tuple(1 if d == 1 else symbols.setdefault(d, Sym.named(f"s{len(symbols)}"))
                      for d in a.shape)
        types[name] = TensorType(SUPPORTED[a.dtype], shape)
    return types


def _types(bound: dict[str, np.ndarray], statics=frozenset(),
           shapes: Optional[dict[str, tuple]] = None) -> dict[str, TensorType]:
    shapes = shapes or {}
    return {name: static_type(a) if name in statics
            else TensorType(SUPPORTED[a.dtype], shapes.get(name, tuple(a.shape)))
            for name, a in bound.items()}


def static_type(a) -> StaticScalar:
    return StaticScalar(SUPPORTED[a.dtype], (), a.item())


PROGRAMS = 64  # programs kept per callable and transform (one per size pattern and dtypes)
SHAPES = 256  # answers kept per callable that depend on exact shapes (result types, plans)
_CONCRETE = "needs its sizes"  # a pattern's entry in `by_pattern`'s cache


def by_pattern(cache: Lru, bound: dict[str, np.ndarray], statics: frozenset, lock: Any,
               make: Callable[[dict[str, TensorType]], Any]) -> Any:
    """What `make` makes of the types of arguments like `bound`, kept in
    `cache`: made for their symbolic types (`_symbolic`) and kept under
    their size pattern (`_pattern`), or, where that raises `NeedsConcrete`
    (the function needs its sizes) or a `GradError` (which should name
    real sizes, not symbols), made for their concrete types and kept under
    their signature, the pattern's entry marking it so (each look-up of
    the pattern keeps that mark recent).  Made under `lock`."""
    pattern = _pattern(bound, statics)
    entry = cache.get(pattern)
    if entry is _CONCRETE:
        entry = cache.get(_signature(bound, statics))
    if entry is not None:
        return entry
    with lock:
        entry = cache.get(pattern)
        if entry is None:
            try:
                entry = cache[pattern] = make(_symbolic(bound, statics))
                return entry
            except (NeedsConcrete, GradError):
                cache[pattern] = _CONCRETE
        elif entry is not _CONCRETE:
            return entry
        key = _signature(bound, statics)
        entry = cache.get(key)
        if entry is None:
            entry = cache[key] = make(_types(bound, statics))
        return entry


_NO_KEY = object()  # a key no call has


class FastPath:
    """The programs of plain calls, keyed on the exact arguments.

    Binding, validating and keying a call costs several times what running
    a small program does.  A call whose positional arguments are all plain
    ndarrays or Python floats, with no keywords and no `dsl.Tape` recording
    on this thread, is decided by each array's dtype, shape and strides and
    the floats' places alone (`plain_call_key`: binding gives a float the dtype
    the call's arrays decide, f32 or f64, and the entry converts it so,
    `taking_floats`), as long as the slow path took the arrays as they are:
    binding added nothing but module params and converted nothing, the
    target runs them where they are (not a device target given host
    arrays) and hands its results to the caller as they are, and the
    function has no static (const) arguments, whose values pick programs.
    The module params are read anew at each call (`taking_params`: a
    training step sets them between calls), and one whose dtype, shape or
    strides are not the remembered call's sends the call down the slow
    path, which binds and checks it.
    `remember` keeps such a call's program (its driver for C-contiguous
    arguments when they are), fused with the callable's arrangement of its
    results (`arranged`), in `entries` under that key, and in `programs`
    for calls with `out=`; `Compiled.__call__` looks the key up there
    (first in `latest`).  Anything else takes the slow path, which is what
    validates arguments: a call that raised there was never remembered, so
    raises again.  What the key leaves out cannot
    change the program's results: an array's alignment, writeability or
    byte offset (the kernels' dispatchers type each array as they get it).
    """

    SIZE = 64  # keys kept per callable (each distinct shape is one)

    def __init__(self) -> None:
        self.entries: dict[tuple, Callable] = {}
        # key -> (program, driver, argument names, result shapes), for out=
        self.programs: dict[tuple, tuple] = {}
        # the values of a call bound once (`Compiled.call_known`), params and
        # a transform's inputs among them: their key -> driver; apart, since
        # no plain call passes a param (f(x, w) for f(x) reading w is an error)
        self.bound_runs: dict[tuple, Callable] = {}
        self.latest: tuple[Any, Optional[Callable]] = (_NO_KEY, None)  # the last hit
        # one arranged driver per program and layout, however many shapes it
        # serves (holding the program keeps its id its own)
        self._arranged: dict[tuple[int, bool], tuple[Program, Callable]] = {}

    def remember(self, args: Sequence[Any], bound: dict[str, Any], program: Program,
                 layout: Any, known: bool = False,
                 slow: Optional[Callable] = None,
                 params: Callable[[], dict[str, Any]] = dict) -> None:
        """Keep `program` for calls like this one: plain calls of `args`,
        or with `known` calls bound once whose values `args` are.  `slow`:
        the slow path of a plain call of positional arguments, which an
        entry taking floats or params leaves a value it cannot take to;
        `params()`: the module params' values now, by name, which a plain
        call's binding appends to `args` (`taking_params`)."""
        key = fast_key(args) if known else plain_call_key(args)
        extra = list(bound)[len(args):]
        if key is None or (extra and (known or slow is None)):
            return
        current = params() if extra else {}
        if any(current.get(name) is not bound[name] or type(bound[name]) is not np.ndarray
               for name in extra):
            return  # (a defaulted argument, or a param binding converted)
        floats: dict[int, np.dtype] = {}  # place of a Python float -> the dtype bound
        for k, (b, a) in enumerate(zip(bound.values(), args)):
            if b is a:
                continue
            if type(a) is not float or type(b) is not np.ndarray or b.shape != () \
                    or b.dtype not in (F32, F64):
                return  # converted otherwise (a device copy, an integer annotation)
            floats[k] = b.dtype
        if len(self.entries) + len(self.bound_runs) >= self.SIZE:
            self.entries.clear()
            self.programs.clear()
            self.bound_runs.clear()
        # the key fixes strides, so every call it admits has this layout
        contiguous = all(b.flags.c_contiguous for b in bound.values())
        run = program.run_contiguous if contiguous else program.run
        if known:
            self.bound_runs[key] = run
            return
        which = (id(program), contiguous)
        if which not in self._arranged:
            self._arranged[which] = (program, arranged(run, layout))
        entry = self._arranged[which][1]
        if extra:
            entry = taking_params(entry, {name: bound[name] for name in extra}, params, slow)
        if floats or extra:  # (not for out=: `call_into` keys arrays alone)
            self.entries[key] = taking_floats(entry, floats, slow) if floats else entry
            return
        self.entries[key] = entry
        self.programs[key] = (program, run, tuple(bound), result_shapes(program, bound))


def fast_key(args: Sequence[Any]) -> Optional[tuple]:
    """The fast path's key of positional arguments, None unless all are
    plain ndarrays (subclasses, a Tape's arrays, bind as they are)."""
    key: tuple = ()  # flat: a tuple of tuples costs a third more to build
    for a in args:
        if type(a) is not np.ndarray:
            return None
        key += (a.dtype, a.shape, a.strides)
    return key


def by_keyword_order(args: tuple, kwargs: dict[str, Any], order: tuple[str, ...]
                     ) -> tuple[tuple, dict[str, Any]]:
    """(args, kwargs) as all positional arguments where the keywords name
    exactly the parameters after the positional ones, each once, so that
    such a call takes the fast path (`FastPath`) as one by position does;
    else as given.  out= stays a keyword (result buffers, or an error where
    `out` is also a parameter's name)."""
    start, end = len(args), len(args) + len(kwargs)
    if end > len(order) or "out" in kwargs:
        return args, kwargs
    try:
        return args + tuple(kwargs[name] for name in order[start:end]), {}
    except KeyError:  # a keyword for another parameter (bound, or refused, as it is)
        return args, kwargs


def torch_compiling() -> bool:
    """Whether this call runs where torch.compile's dynamo compiles the
    frames called: tracing a model that calls a loaded function itself
    (not its `dsl.to_torch`; a constant there), or running one of its
    frames it could not trace, whose callees it compiles still (its
    eval-frame callback set).  Only where torch is imported (`import dsl`
    never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if torch.compiler.is_compiling():  # (the test dynamo traces: it knows no callback's)
        return True
    # (a private function: a torch without it is taken as not compiling,
    # where the public is_compiling above said so)
    callback = getattr(sys.modules.get("torch._C._dynamo.eval_frame"),
                       "get_eval_frame_callback", None)
    return callback is not None and callback() not in (None, False)


def eagerly(call: Callable, *args, **kwargs) -> Any:
    """call(*args, **kwargs) run by Python, its frames not compiled by
    torch.compile's dynamo (a graph break, as for any function it cannot
    trace), where `torch_compiling`: it traced binding, NumPy and the
    kernels with its fake tensors, and raised its InternalTorchDynamoError
    ("Cannot interpret 'torch.float32' as a data type") where the same call
    outside torch.compile reads CPU tensors as constants (or says to call
    it through `dsl.to_torch`, for one that requires grad)."""
    if not _UNCOMPILED:
        import torch
        _UNCOMPILED.append(torch.compiler.disable(lambda c, a, k: c(*a, **k)))
    return _UNCOMPILED[0](call, args, kwargs)


_UNCOMPILED: list = []  # `eagerly`'s call, made once torch is imported


def plain_call_key(args: Sequence[Any]) -> Optional[tuple]:
    """`fast_key` of a plain call, where a Python float may stand too (its
    type in the key: `FastPath`)."""
    key: tuple = ()
    for a in args:
        kind = type(a)
        if kind is np.ndarray:
            key += (a.dtype, a.shape, a.strides)
        elif kind is float:
            key += (float,)
        else:
            return None
    return key


F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
_F32_MAX = float(np.finfo(np.float32).max)


def taking_floats(entry: Callable, floats: dict[int, np.dtype], slow: Callable) -> Callable:
    """`entry`, for calls with Python floats at the places of `floats`,
    each taken as a 0-d array of its dtype there, as binding took it; a call
    with a finite float beyond f32 where f32 is bound goes to `slow`, whose
    binding refuses it."""
    places = tuple((k, dtype, dtype == F32) for k, dtype in floats.items())

    def taking(*args):
        values = list(args)
        for k, dtype, narrow in places:
            value = values[k]
            if narrow and _F32_MAX < abs(value) < np.inf:
                return slow(*args)
            values[k] = np.array(value, dtype)
        return entry(*values)
    return taking


def taking_params(entry: Callable, like: dict[str, np.ndarray],
                  params: Callable[[], dict[str, Any]], slow: Callable) -> Callable:
    """`entry`, for calls whose binding appends the module params `like`
    names (in order) to the positional arguments: their values now, when
    each is an ndarray of the dtype, shape and strides of its value in
    `like`; else the call goes to `slow` (a param set to another shape, or
    unset, is bound and refused there)."""
    names = tuple(like)
    kinds = tuple((a.dtype, a.shape, a.strides) for a in like.values())

    def taking(*args):
        now = params()
        values = [now.get(name) for name in names]
        for value, kind in zip(values, kinds):
            if type(value) is not np.ndarray or (value.dtype, value.shape, value.strides) != kind:
                return slow(*args)
        return entry(*args, *values)
    return taking


def arranged(run: Callable, layout: Any) -> Callable:
    """One function: `run`'s results (a tuple) arranged as `layout`, a
    result index or a nested tuple of them (what a callable's `format`
    makes of `(0, 1, ...)`)."""
    if isinstance(layout, tuple) and layout == tuple(range(len(layout))):
        return run  # the results as they come

    def source(item: Any) -> str:
        if isinstance(item, int):
            return f"o[{item}]"
        return "(" + "".join(source(i) + ", " for i in item) + ")"
    namespace = {"run": run}
    exec(f"def entry(*a):\n    o = run(*a)\n    return {source(layout)}\n", namespace)
    return namespace["entry"]


class Compiled:
    """Base of every callable: binding, the per-signature program cache.
    A copy of one (deep or not) is itself, as of a Python function; it
    pickles as its `recipe`."""

    name: str
    specs: tuple[ParamSpec, ...]
    param_specs: tuple[ParamSpec, ...] = ()  # module params it reads
    # arguments a transform adds that its caller never passes (a Jacobian's
    # one-hot tangents): they carry no gradient, and a pullback has no
    # cotangent for them
    hidden: frozenset = frozenset()
    target: Target

    def __init__(self) -> None:
        self._programs = Lru(PROGRAMS)
        self._lock = ChildSafeLock(reentrant=True)
        self._fast = FastPath()
        self._out_specs = Lru(PROGRAMS)  # by id(program): each holds its program
        self._by_value: set[str] = set()  # see `by_value`

    # what inspect.signature says: `call_signature()`, where a class gives one
    __signature__ = SignatureAttribute()

    def call_signature(self, out: bool = True) -> Optional[inspect.Signature]:
        """The signature of its call (`runtime.signatures`), with the
        keyword-only `out=None` where `out` (a bridge's call takes none);
        None, for `(*args, **kwargs)`, where its class gives none (the
        transforms that are no callable of the API) or none is exact."""
        return None

    def __deepcopy__(self, memo: dict) -> "Compiled":
        # itself, as a Python function is: a deep copy of what holds one (a
        # torch module's, for an average of its weights) shares it
        return self

    def __copy__(self) -> "Compiled":
        return self

    def __reduce__(self) -> tuple:
        # each class gives its own recipe: one inherited would rebuild its base
        if "recipe" not in type(self).__dict__:
            raise TypeError(f"cannot pickle a {type(self).__name__}: its class gives no recipe "
                            "to make it again in another process (Compiled.recipe)")
        return self.recipe()

    def recipe(self) -> tuple:
        """(a function, its arguments) that make this callable again in
        another process, for pickle: its inner callable (ending at a
        module's function, which pickles as its module and its name) and
        the arguments of the transform on top, by the function that makes
        it (the one `dsl.grad` calls, so that it is the one already made
        there, where there is one).  Nothing compiled: it compiles there
        on first call (from that process's kernel store)."""
        raise NotImplementedError

    def module_params(self) -> dict[str, np.ndarray]:
        """The values of the module params it reads that are set, which a
        call that leaves them out takes (as they are now)."""
        return {}

    def defaults(self) -> dict[str, Any]:
        """Its parameters' defaults, by name, as written (Python numbers):
        what a call that leaves one out takes (`with_defaults`)."""
        return {}

    # subclasses: the IR for a signature, and how to shape the results
    def lower(self, types: dict[str, TensorType]) -> Function:
        raise NotImplementedError

    def format(self, outs: Sequence[np.ndarray]) -> Any:
        """Arrange the program's results for the caller; only arranges
        (picks, groups in tuples): the fast path applies it to indices."""
        raise NotImplementedError

    def identity(self) -> tuple:
        """Plain values naming everything `lower` depends on besides the
        types (this callable's own fields, its inner callable's identity),
        so that equal identities and types lower to equal IR."""
        raise NotImplementedError

    def build(self, types: dict[str, TensorType]) -> Program:
        key = (source_stamp(sys.modules["dsl"]), self.identity(), tuple(types.items()))
        return build_stored(key, lambda: self.lower(types), self.target)

    def bind(self, args, kwargs, params: Optional[dict[str, Any]] = None
             ) -> dict[str, np.ndarray]:
        """The validated arguments.  A module's function (`GradFn`) adds
        the module params it reads, each from `params` when given there
        (validated against its declaration), else the module's value; a
        transform passes `params` on to the function it transforms."""
        return bind(self.name, self.specs, args, kwargs, self.span)

    @property
    def primal(self) -> Compiled:
        """The function a transform's chain starts from (itself where it
        is no transform: `Derived` asks its inner one)."""
        return self

    @property
    def span(self):
        return None

    def error_sources(self) -> tuple[tuple[str, str], ...]:
        """(file, text) of the .grad files its errors' spans may name, for
        their caret lines (`gradlang.runtime.boundary`)."""
        return ()

    def program(self, bound: dict[str, np.ndarray]) -> Program:
        """The program for these arguments: lowered with symbolic sizes (one
        program for every call with the same dtypes, ranks and pattern of
        equal sizes), or with concrete sizes when the function needs them
        (`by_pattern`)."""
        return by_pattern(self._programs, bound, self.static_names(bound), self._lock,
                          self.build)

    def by_position(self, args: Sequence[Any]) -> dict[int, Any]:
        """A call's positional arguments by the position in `specs` of the
        parameter each is for."""
        return dict(enumerate(args))

    def by_name(self, args: Sequence[Any]) -> dict[str, Any]:
        """A call's positional values (arguments, or a value for each, such
        as jvp's tangents) by the name of the parameter each is for."""
        return {self.specs[i].name: a for i, a in self.by_position(args).items()
                if i < len(self.specs)}

    def label(self, name: str) -> str:
        """How an error names the parameter `name`: as the caller knows it
        (a transform's own parameter, such as hvp's v, has a name of its
        own that no function's parameter can take)."""
        return repr(name)

    def named(self, label: str) -> str:
        """The parameter a caller names `label` (`label`'s inverse, for a
        name without quotes: hvp's "v")."""
        return label

    def static_names(self, bound: dict[str, np.ndarray]) -> frozenset:
        return static_names(self.specs, bound, frozenset(self._by_value))

    def retrying_by_value(self, bound: dict[str, np.ndarray], run: Callable[[], Any],
                          refuse: Optional[Callable[[str], None]] = None) -> Any:
        """run(), and again after `by_value` each time a program needs the
        value of another integer argument (`arange(a, b)`, a stride per
        axis: one at a time); run must place the arguments anew: those
        then stay on the host.  `refuse(name)`, first, raises where that
        argument's value cannot be known (a bridge's tensor or tracer, a
        Dask array)."""
        while True:
            try:
                return run()
            except NeedsValue as need:
                if need.name in self._by_value and need.name in self.static_names(bound):
                    raise  # compiled for its value, yet asked again
                # (one already compiled for by value, now passed where its
                # value is not on the host, a device array: by_value's
                # ArgumentError, not this NeedsValue escaping)
                if refuse is not None:
                    refuse(need.name)
                self.by_value(need, bound)

    def by_value(self, need: NeedsValue, bound: dict[str, np.ndarray]) -> None:
        """From now on, compile for the value of the integer argument a
        program uses as a size (as for a `const` one)."""
        self._by_value.add(need.name)
        if need.name not in self.static_names(bound):
            # (not static: a device array; it said "gives a size" of an
            # axis too, and not what the caller passed or should)
            raise ArgumentError(f"argument {need.name!r} of {called(self.name)} is a device "
                                "array, but its value sets a shape, an axis or a count, which "
                                "the call is compiled for: pass it on the host (a Python int)",
                                self.span)

    host_results: bool = False  # device targets: copy results to NumPy

    def __call__(self, /, *args, **kwargs):
        # The fast path first, inline: each step here costs a measurable
        # part of a small call (so no `@user_facing` wrapper either).
        try:
            if kwargs and self.keyword_order is not None:
                args, kwargs = by_keyword_order(args, kwargs, self.keyword_order)
            fast = self._fast
            if fast.entries and not THREAD.tapes:
                if not kwargs:
                    key = plain_call_key(args)
                    latest = fast.latest
                    if key == latest[0]:  # comparing costs a third of hashing
                        return latest[1](*args)
                    run = fast.entries.get(key)
                    if run is not None:
                        fast.latest = (key, run)  # one tuple: threads never see a mix
                        return run(*args)
                elif len(kwargs) == 1 and kwargs.get("out") is not None \
                        and not self.out_is_a_parameter:
                    result = self.call_into(args, kwargs["out"])
                    if result is not None:
                        return result
            if torch_compiling():
                return eagerly(self.call_slow, args, kwargs)
            return self.call_slow(args, kwargs)
        except GradError as err:
            raise leaving(err, self)
        except MemoryError as err:  # (one the driver could not foresee)
            raise leaving(out_of_memory(err), self)

    # the parameters a keyword argument names, in the order of the places
    # they would take by position, where binding one by keyword binds it as
    # at that place (None: not so, as hvp's v, which binds from the end)
    keyword_order: Optional[tuple[str, ...]] = None

    @cached_attribute
    def out_is_a_parameter(self) -> bool:
        """Whether the function has a parameter named `out`, which then
        takes only a positional argument (`out=` gives result buffers)."""
        return any(s.name == "out" for s in self.specs)

    def call_slow(self, args: tuple, kwargs: dict) -> Any:
        out = kwargs.pop("out", None)  # the buffers for the results (`OutSpec`)
        if out is not None and self.out_is_a_parameter and \
                "out" not in [s.name for s in self.specs[:len(args)]]:
            raise ArgumentError(f"{called(self.name)} has a parameter named 'out', but out= gives "
                                "buffers for its results: pass 'out' by position", self.span)
        if out is None and any(map(is_dask_array, (*args, *kwargs.values()))):
            if recording_tapes((*args, *kwargs.values())):
                # (its result, lazy, would be no recorded call's: the tape's
                # gradient then said only "not computed by a recorded call")
                raise ArgumentError(f"{called(self.name)} on Dask arrays is not recorded by the "
                                    "dsl.Tape watching one of its arguments (a Dask call is "
                                    "lazy): take dsl.grad or dsl.vjp of it, which run on Dask",
                                    self.span)
            return call_on_dask(self, args, kwargs)
        outs = self.call_bound(self.bind(args, kwargs), () if kwargs else args, out)
        if self.host_results:  # (a recorded call's are on the host already: kept)
            outs = tuple(self.target.to_host(o) for o in outs)
        return self.format(outs)

    def on_target(self, bound: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arguments where the kernels run (host arrays copied to a
        device target once; its own arrays stay).  A static (const)
        argument stays on the host: its value picks the program."""
        statics = self.static_names(bound)
        return {n: a if n in statics else self.accepted(a, self.what_is(n))
                for n, a in bound.items()}

    def what_is(self, name: str) -> str:
        """How a refusal of the value bound to `name` names it: a module
        param as the param its function reads (the caller passed no such
        argument), else as the caller knows the argument (`label`)."""
        if self.is_module_param(name):
            return f"param {name!r} read by {called(self.name)}"
        return f"argument {self.label(name)} of {called(self.name)}"

    def is_module_param(self, name: str) -> bool:
        """Whether the value bound to `name` is a module param's (one the
        caller passed no argument for), not an argument's."""
        return reads_as_param(name, self.specs, {s.name for s in self.param_specs})

    def accepted(self, value: Any, what: str) -> Any:
        """`self.target.accept(value, what)`, its refusal pointing at the
        function's definition, as `bind`'s do (the target knows no source)."""
        try:
            return self.target.accept(value, what)
        except ArgumentError as err:
            if err.span is UNKNOWN_SPAN:
                err.span = self.span
            raise

    def call_bound(self, bound: dict[str, np.ndarray], args: Sequence[Any] = (),
                   out: Any = None, known: bool = False) -> tuple[np.ndarray, ...]:
        """Run on validated arguments; record the call on every active
        `dsl.Tape` that watches one of them (keeping a pullback).  `args`:
        the positional arguments `bound` came from, if the call had no
        keywords (the fast path may then remember the program), or with
        `known` the values of `bound` (`call_known`'s); `out`: the
        caller's buffers for the results, shaped like them (`OutSpec`)."""
        return self.retrying_by_value(bound, lambda: self._call_bound(bound, args, out, known))

    def call_known(self, bound: dict[str, Any]) -> tuple:
        """`call_bound(bound)`, for a caller that binds once and runs many
        times (a bridge's operation in a traced graph): the program the
        fast path keeps for arguments of these dtypes, shapes and strides
        (`FastPath`) runs them where it has one, and else `call_bound`
        gives it one."""
        args = tuple(bound.values())
        if not THREAD.tapes:
            run = self._fast.bound_runs.get(fast_key(args))
            if run is not None:
                return run(*args)
        return self.call_bound(bound, args, known=True)

    def _call_bound(self, bound: dict[str, np.ndarray], args: Sequence[Any],
                    out: Any, known: bool = False) -> tuple[np.ndarray, ...]:
        on_target = self.on_target(bound)
        # A tape tracks the arrays the caller holds: a host array it watches
        # is copied to a device target here, and with `host_results` the
        # caller gets host copies of the results, which the tape must track.
        tapes = recording_tapes(bound.values())
        if tapes:
            if out is not None:
                raise ArgumentError(f"{called(self.name)} takes no out= while a Tape records the "
                                    "call: the tape's results are arrays of its own", self.span)
            outs, pullback = vjp_bound(self, on_target, self.host_results)
            if self.host_results:
                outs = tuple(self.target.to_host(o) for o in outs)
            return record(tapes, self, bound, outs, pullback)
        program = self.program(on_target)
        if args and not self.host_results and not self.static_names(on_target):
            layout = self.format(tuple(range(len(program.out_types))))
            self._fast.remember(args, on_target, program, layout, known,
                                lambda *a: self.call_slow(a, {}), params=self.module_params)
        if out is not None:
            return self.out_spec(program).run_into(program.run, on_target, out,
                                                   result_shapes(program, on_target))
        return program(*on_target.values())

    def out_spec(self, program: Program) -> "OutSpec":
        spec = self._out_specs.get(id(program))
        if spec is None:  # (a spec holds its program: its id is not reused while kept)
            spec = self._out_specs[id(program)] = OutSpec(self, program)
        return spec

    def call_into(self, args: tuple, out: Any) -> Any:
        """A plain call with `out=` whose arguments the fast path knows:
        only the buffers are checked; None if it does not know them."""
        known = self._fast.programs.get(fast_key(args))
        if known is None:
            return None
        program, run, names, shapes = known
        return self.format(self.out_spec(program).run_into(run, dict(zip(names, args)), out,
                                                           shapes))

    def differentiable_names(self, bound: dict[str, np.ndarray]) -> list[str]:
        specs = {s.name: s for s in self.specs + self.param_specs}
        return [n for n, a in bound.items() if a.dtype.kind == "f" and n not in self.hidden
                and (n not in specs or specs[n].differentiable)]

    def lower_as(self, bound: dict[str, np.ndarray], shapes: dict[str, tuple]) -> Function:
        """The IR for arguments like `bound`, but with these (symbolic)
        shapes for some of them, by name."""
        return self.lower(_types(bound, self.static_names(bound), shapes))

    def ir(self, /, *args, **kwargs) -> Function:
        """The optimized IR this call would run (for inspection)."""
        bound = self.bind(args, kwargs)
        return self.retrying_by_value(bound, lambda: self.program(bound).ir)


class Derived(Compiled):
    """A callable derived from another, `inner` (a transform of it): its
    parameters, the target it runs on and where its results go are
    inner's, and its errors point at inner's definition."""

    def __init__(self, inner: Compiled):
        super().__init__()
        self.inner = inner
        self.specs, self.param_specs = inner.specs, inner.param_specs
        self.hidden = inner.hidden
        self.target, self.host_results = inner.target, inner.host_results

    @property
    def span(self):
        return self.inner.span

    @property
    def primal(self) -> Compiled:
        return self.inner.primal

    def defaults(self) -> dict[str, Any]:
        return self.inner.defaults()  # (its parameters are inner's)

    def error_sources(self) -> tuple[tuple[str, str], ...]:
        return self.inner.error_sources()

    def module_params(self) -> dict[str, np.ndarray]:
        return self.inner.module_params()


class GradFunction(Derived):
    """`grad(f, wrt)` and `value_and_grad(f, wrt)`: the gradient of the sum
    of f's outputs with respect to the parameters named by `wrt`; with
    `has_aux` (as JAX's), of the first output's sum, f's other outputs
    returned beside it: `(grads, aux)` and `((value, aux), grads)`, aux
    the second output, or a tuple of the others where there are more."""

    __doc__ = DocAttribute(__doc__)  # an instance's: what it is, f's own (`describe`)

    def __init__(self, inner: Compiled, wrt: Wrt, with_value: bool, has_aux: bool = False):
        super().__init__(inner)
        self.with_value, self.has_aux = with_value, has_aux
        self.single = not isinstance(wrt, (tuple, list))
        self.wrt = resolve_wrt(inner, wrt)
        kind = "value_and_grad" if with_value else "grad"
        self.name = f"{kind}({inner.name})"
        self.keyword_order = inner.keyword_order  # (it binds as inner binds)

    def recipe(self) -> tuple:
        return grad_function, (self.inner, self.wrt[0] if self.single else self.wrt,
                               self.with_value, self.has_aux)

    def bind(self, args, kwargs, params=None) -> dict[str, np.ndarray]:
        return bind_at_defaults(self.inner, args, kwargs, params, self.wrt)

    def call_signature(self, out: bool = True) -> Optional[inspect.Signature]:
        return self.inner.call_signature(out)  # (it binds as inner binds)

    def describe(self) -> str:
        what = "value and gradient" if self.with_value else "gradient"
        return (f"{self.name}: the {what} of {called(self.inner.name)} w.r.t. "
                f"{', '.join(self.wrt)}; it takes the arguments of {called(self.inner.name)}:"
                f"\n\n{self.inner.__doc__ or ''}").rstrip()

    def by_position(self, args: Sequence[Any]) -> dict[int, Any]:
        return self.inner.by_position(args)  # (it binds as inner binds)

    def label(self, name: str) -> str:
        return self.inner.label(name)

    def named(self, label: str) -> str:
        return self.inner.named(label)

    def lower(self, types: dict[str, TensorType]) -> Function:
        names = list(types)
        indices = []
        for w in self.wrt:
            if w not in types:
                raise ArgumentError(f"cannot differentiate {called(self.inner.name)} with respect "
                                    f"to {w!r}: no value was passed for it", self.span)
            if not types[w].is_float:
                raise ArgumentError(f"cannot differentiate {called(self.inner.name)} with respect "
                                    f"to {w!r}: it has dtype {types[w].dtype}, and only "
                                    "floats carry gradients", self.span)
            indices.append(names.index(w))
        fn = self.inner.lower(types)
        if self.has_aux and len(fn.outputs) < 2:
            raise ArgumentError(f"{self.name} with has_aux=True needs a function of two or "
                                f"more results (the first differentiated, the others "
                                f"auxiliary), but {called(self.inner.name)} has one", self.span)
        gradient = pipeline.grad_of_sum(fn, indices, self.with_value, first_only=self.has_aux)
        if not self.has_aux or self.with_value:
            return gradient
        # grad's outputs are what it returns, in its order, (grads, aux): a
        # transform of it differentiates them, a pullback takes their
        # cotangents (grad_of_sum gives the aux outputs first)
        n_aux = len(fn.outputs) - 1
        return Function(gradient.name, gradient.params, gradient.eqns,
                        tuple(gradient.outputs[n_aux:]) + tuple(gradient.outputs[:n_aux]))

    def identity(self) -> tuple:
        return ("grad", self.inner.identity(), self.wrt, self.with_value, self.has_aux)

    def format(self, outs):
        n = len(self.wrt)
        if self.has_aux and not self.with_value:  # (grads..., aux...): no value
            grads, values = outs[:n], (None, *outs[n:])
        else:  # (values..., grads...)
            grads, values = outs[len(outs) - n:], outs[:len(outs) - n]
        grads = grads[0] if self.single else tuple(grads)
        if not self.has_aux:
            return (self.inner.format(values), grads) if self.with_value else grads
        value, *aux = self.inner.format(values)
        aux = aux[0] if len(aux) == 1 else tuple(aux)
        return ((value, aux), grads) if self.with_value else (grads, aux)


class OutSpec:
    """What `out=` must be for one program: arrays (or None, for a result
    to allocate) in the structure of the callable's results, each of its
    result's dtype and shape, C-contiguous, writeable, a plain NumPy array
    (on a target that takes buffers: `Target.takes_out_buffers`), and
    overlapping no argument and no other buffer, since kernels read
    arguments after writing results.
    `buffers` checks a caller's `out` (raising `ArgumentError` naming the
    buffer, before any kernel runs) and returns one buffer or None per
    program output, as the driver takes them; `run_into` runs a driver
    into them.  A buffer of an ndarray subclass (a memmap) is written as a
    plain view of its memory: drivers reshape buffers, and a subclass may
    reshape otherwise (an `np.matrix` stays 2-D, and a kernel then wrote
    past its end)."""

    def __init__(self, f: Compiled, program: Program):
        results = program.out_types
        self.f = f
        self.layout = f.format(tuple(range(len(results))))
        self.dtypes = tuple(NUMPY[r.dtype] for r in results)
        self.flat = self.layout == tuple(range(len(results)))
        self.program = program  # held: its id keys the callable's cache

    def run_into(self, run: Callable, bound: dict[str, np.ndarray], out: Any,
                 shapes: tuple[tuple[int, ...], ...]) -> tuple:
        """`run(*bound.values(), out=...)` into the caller's buffers `out`
        (checked by `buffers`); its results, the caller's buffers among
        them as the objects the caller gave."""
        given = self.buffers(out, bound, shapes)
        views = tuple(b if b is None or type(b) is np.ndarray else b.view(np.ndarray)
                      for b in given)
        try:
            results = run(*bound.values(), out=views)
        except GradError as err:
            # An error only the values show (an index out of range) is found
            # as the kernels run, after earlier ones wrote their results into
            # the caller's buffers: said, else the caller took them as intact.
            # Not for the driver's own checks of the arguments' sizes, which
            # refuse the call before any kernel runs (where the sizes give
            # the array: `ArrayTooLarge`)
            if not isinstance(err, (ArrayTooLarge, SizeMismatchError)):
                err.add_note(self._written_before(given))
            raise
        return tuple(r if b is None else b for r, b in zip(results, given))

    def _written_before(self, given: Sequence[Any]) -> str:
        """The note of an error raised as the kernels ran into `given`."""
        where = ", ".join(self._where(i) for i, b in enumerate(given) if b is not None)
        return (f"the call stopped as its kernels ran: {where} may hold results written before "
                "the error; keep a copy where a failed call must leave them as they were")

    def buffers(self, out: Any, bound: dict[str, np.ndarray],
                shapes: tuple[tuple[int, ...], ...]) -> tuple:
        """`shapes`: the results' (`result_shapes` of these arguments)."""
        if self.flat and type(out) is tuple and len(out) == len(self.dtypes):
            given = list(out)
        else:
            given = [None] * len(self.dtypes)
            self._place(self.layout, out, given, ())
        for i, buffer in enumerate(given):
            if buffer is None:
                continue
            if not self.f.target.takes_out_buffers:
                self._fail(i, f"is a buffer, but on the {self.f.target.name} target a call "
                              "allocates its results itself: pass None (or no out=)")
            plain = type(buffer) is np.ndarray or (  # a Tape's array is not: it is tracked,
                isinstance(buffer, np.ndarray) and not getattr(buffer, "bind_as_is", False)
                and not isinstance(buffer, np.ma.MaskedArray))  # nor a masked one's mask
            if not plain:
                self._fail(i, f"must be a NumPy array, got {type(buffer).__name__}")
            if buffer.dtype != self.dtypes[i]:
                # (a byte-swapped buffer said "has dtype >f8, but that result is
                # float64", which reads as the same dtype)
                swapped = buffer.dtype.newbyteorder("=") == self.dtypes[i]
                self._fail(i, f"has dtype {buffer.dtype}, but that result is {self.dtypes[i]}"
                              + (" in native byte order, as kernels write it" if swapped else ""))
            if buffer.shape != shapes[i]:
                self._fail(i, f"has shape {list(buffer.shape)}, but that result has shape "
                              f"{list(shapes[i])}")
            flags = buffer.flags
            if not (flags.c_contiguous and flags.writeable):
                self._fail(i, "must be C-contiguous and writeable" + _frozen_by_a_tape(buffer))
            for name, array in bound.items():
                if np.may_share_memory(buffer, array):
                    # (as the caller knows it: hvp's v, not its '$v'; a module
                    # param as one, the caller having passed no argument for it)
                    what = (f"param {name!r}, which it reads" if self.f.is_module_param(name)
                            else f"argument {self.f.label(name)}")
                    self._fail(i, f"overlaps {what}: results are written while arguments "
                                  "are still read")
            for k in range(i):
                if given[k] is not None and np.may_share_memory(buffer, given[k]):
                    self._fail(i, f"overlaps {self._where(k)}: each result needs memory of "
                                  "its own")
        return tuple(given)

    def _place(self, item: Any, value: Any, given: list, path: tuple) -> None:
        if isinstance(item, int):
            given[item] = value
        elif isinstance(value, (tuple, list)) and len(value) == len(item):
            for k, (i, v) in enumerate(zip(item, value)):
                self._place(i, v, given, path + (k,))
        elif value is not None:
            got = type(value).__name__
            if isinstance(value, (tuple, list)):
                got = f"a {got} of {len(value)}"
            where = "out" + "".join(f"[{k}]" for k in path)
            raise ArgumentError(f"out= of {called(self.f.name)} takes arrays in the structure of "
                                f"its result, {describe_layout(self.layout)}; {where} is {got}",
                                self.f.span)

    def _where(self, index: int, item: Any = None, path: str = "out") -> str:
        """Where result `index` goes in `out`, as the caller wrote it."""
        item = self.layout if item is None else item
        if isinstance(item, int):
            return path if item == index else ""
        for k, i in enumerate(item):
            found = self._where(index, i, f"{path}[{k}]")
            if found:
                return found
        return ""

    def _fail(self, index: int, message: str) -> None:
        raise ArgumentError(f"{self._where(index)} of {called(self.f.name)} {message}",
                            self.f.span)


def _frozen_by_a_tape(buffer: np.ndarray) -> str:
    """Why `buffer` is read-only, when a recording `dsl.Tape` made it so
    (it tracks the memory; `Tape._freeze`): else nothing to add."""
    if buffer.flags.writeable or not any(
            t._recording and t.tracks_memory_of(buffer) for t in THREAD.tapes):
        return ""
    return (": it is read-only while a recording dsl.Tape tracks it (a write would "
            "silently change the gradient)")


def result_shapes(program: Program, bound: dict[str, np.ndarray]) -> tuple:
    """The shapes of the program's results for these arguments."""
    sizes: dict[str, int] = {}
    for param, array in zip(program.in_types, bound.values()):
        for d, size in zip(param.shape, np.shape(array)):
            if isinstance(d, Sym) and d.coef == 1 and len(d.factors) == 1:
                sizes[d.factors[0]] = size
    return tuple(tuple(evaluate(d, sizes) for d in r.shape) for r in program.out_types)


def describe_layout(layout: Any) -> str:
    """A result structure as the caller sees it: "(array, (array, array))"."""
    if isinstance(layout, int):
        return "array"
    parts = [describe_layout(i) for i in layout]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


class AsFunction:
    """What a transform takes as the function `as_function` gives (a
    Jacobian: `dsl.forward.Jacobian`, `dsl.mapped.MappedJacobian`)."""

    def as_function(self) -> "Compiled":
        raise NotImplementedError


def require_function(f: Any, what: str, aot_ok: bool = True, why: str = "") -> Any:
    """f, if `what` (an API's name) can take it: a function of a loaded
    .grad module, or of a gradc-compiled one where `aot_ok` (else `what`
    needs the function's IR: `why` says for what).  Anything else is an
    ArgumentError (a TypeError too), as is a compiled module's function
    that cannot do.  A Jacobian is taken as its compiled form
    (`as_function`)."""
    if isinstance(f, AsFunction):
        f = f.as_function()
    if isinstance(f, Compiled) or (aot_ok and isinstance(f, AotFunction)):
        return f
    if isinstance(f, AotGradient):  # (no program of its derivative was compiled)
        f, why = f.f, f" to differentiate {f.name} (a second derivative)"
    if isinstance(f, AotFunction):
        raise needs_ir(f"{what}()", f, why)
    hint = ("; Python code is not traced: write it in the .grad module, or chain compiled "
            "calls under a dsl.Tape" if callable(f) else "")
    raise ArgumentError(f"{what}() takes a function of a loaded .grad module, got "
                        f"{kind_of(f)}{hint}")


def flag_option(value: Any, function: str, name: str) -> bool:
    """The option `name` of `function`, which is True or False: anything
    else is an `ArgumentError` (host_results="no" was taken as true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{function}()'s {name} is True or False, got {shown(value)}")
    return bool(value)


def needs_ir(what: str, f: AotFunction, why: str = "") -> ArgumentError:
    """The error of `what` (a transform, a bridge's rule) of a function of a
    gradc-compiled module, which has no program for it."""
    return ArgumentError(f"{what} needs the IR of {called(f.name)}{why}, and a function of a "
                         "gradc-compiled module has only its compiled programs (call, grad, "
                         "value_and_grad, pullback); load the .grad file with dsl.load for this")


def bind_at_defaults(f: Compiled, args, kwargs: dict[str, Any], params, wrt: Sequence[str]
                     ) -> dict[str, Any]:
    """f's arguments bound (`f.bind`), where the call leaves out a
    parameter that `wrt` differentiates with respect to and that has a
    default, with the default passed for it (as a Python number passed
    for it is bound: the value and dtype a call that leaves it out
    computes with, `parameter_number`'s rule, weakly typed where
    unannotated): a transform differentiates at the default value, as the
    language's `grad(f, wrt=1)(x)` does (it was an `ArgumentError`, "no
    value was passed for it")."""
    bound = f.bind(args, kwargs, params)
    defaults = f.defaults()
    left_out = {name: defaults[name] for name in wrt if name not in bound and name in defaults}
    return f.bind(args, {**kwargs, **left_out}, params) if left_out else bound


def resolve_wrt(f: Compiled, wrt: Wrt, option: str = "wrt") -> tuple[str, ...]:
    """The parameter names `wrt` picks (positions, negative from the end,
    or names), checked to be differentiable; errors call it `option`
    (`argnums` where the caller gave that name)."""
    items = wrt if isinstance(wrt, (tuple, list)) else (wrt,)
    if not items:
        raise ArgumentError(f"{option} must name at least one parameter", f.span)
    names = []
    for w in items:
        if isinstance(w, np.integer):  # a position from NumPy (np.arange, argmax)
            w = int(w)
        if isinstance(w, bool) or not isinstance(w, (int, str)):
            raise ArgumentError(f"{option} entries are parameter positions or names, got "
                                f"{shown(w)}", f.span)
        if isinstance(w, int):
            # (negative from the last parameter, as JAX's argnums and torch.func's)
            if not -len(f.specs) <= w < len(f.specs):
                raise ArgumentError(f"{option}={shown(w)} is out of range: {called(f.name)} has "
                                    f"{len(f.specs)} parameter(s)", f.span)
            spec = f.specs[w]
        else:
            # (as the caller names it: hvp's v, which jvp's tangents and vmap take
            # by that name, was "no parameter 'v'" here)
            name = f.named(w) if isinstance(f, Compiled) else w
            spec = next((s for s in f.specs + f.param_specs if s.name == name), None)
            if spec is None:
                raise ArgumentError(f"{called(f.name)} has no parameter {shown(w)} and reads no "
                                    f"param {shown(w)}", f.span)
        if not spec.differentiable:
            why = "const" if spec.const else f"of dtype {spec.dtype}"
            label = f.label(spec.name) if isinstance(f, Compiled) else repr(spec.name)
            raise ArgumentError(f"cannot differentiate {called(f.name)} with respect to "
                                f"{label}: it is {why}", f.span)
        names.append(spec.name)
    return tuple(names)


def vjp(f: Compiled, /, *args, **kwargs):
    if any(map(is_dask_array, (*args, *kwargs.values()))):
        return vjp_on_dask(f, args, kwargs, backward_function)
    bound = f.bind(args, kwargs)
    outs, pullback = vjp_of_bound(f, bound, f.host_results)
    if f.host_results:
        outs = tuple(f.target.to_host(o) for o in outs)
    tapes = recording_tapes(bound.values())
    if tapes:
        # a vjp of watched arrays is a call of f, as `Compiled.call_bound`
        # records one: its plain results were constants to the tape, so a
        # gradient through them silently missed f's derivative
        outs = record(tapes, f, bound, outs, pullback)
        pullback = _RecordedPullback(pullback, f, bound)
    return f.format(outs), pullback


class _RecordedPullback(Pullback):
    """The pullback of a vjp a `dsl.Tape` recorded: called while a tape
    records on f's arguments or the cotangents, it runs f's backward pass
    as a compiled call (`backward_function`), which the tape records, so
    that a gradient through the cotangents it gives follows them back (as
    a nested tape's backward passes are recorded); otherwise it is the
    plain pullback it wraps."""

    def __init__(self, inner: Pullback, f: Compiled, bound: dict[str, Any]):
        self.__dict__.update(inner.__dict__)
        self._f, self._bound = f, bound

    def _run(self, residuals: tuple, cts: tuple) -> tuple:
        cts = output_cotangents(self.name, cts, len(self._out_types))
        if not recording_tapes((*self._bound.values(), *cts)):
            return super()._run(residuals, cts)
        backward = backward_function(self._f, len(cts))
        with_cts = dict(self._bound)
        for k, (name, ct, t) in enumerate(zip(backward.ct_names, cts, self._out_types)):
            # (a tracked cotangent as itself, which the tape follows; others
            # as the plain pullback takes them)
            with_cts[name] = ct if recording_tapes((ct,)) else self._cotangent(k, ct, t)
        grads = dict(zip(self._float_args, backward.call_bound(with_cts)))
        return tuple(grads.get(n) for n in self._arg_names)


def vjp_of_bound(f: Compiled, bound: dict[str, np.ndarray], host_results: bool = False):
    """(raw outputs, Pullback) on bound host arguments (`split_of_bound`)."""
    entry, results = _split_run(f, bound, host_results)
    outs = results[:entry.n_out]
    return outs, entry.pullback(f, outs, results[entry.n_out:], host_results)


def split_of_bound(f: Compiled, bound: dict[str, np.ndarray]):
    """(raw outputs, residuals, a Pullback reading none: `reading` or
    `call_reading` them) on bound host arguments: for a library that holds
    the residuals itself.  The pullback is made once per output shapes."""
    entry, results = _split_run(f, bound, False)
    outs = results[:entry.n_out]
    return outs, results[entry.n_out:], entry.pullback(f, outs)


def _split_run(f: Compiled, bound: dict[str, np.ndarray], host_results: bool):
    """(the `_VjpEntry` of the call, its forward pass's results), compiled
    for the value of an integer argument that a program uses as a size.
    Like `FastPath`, a call whose arguments are plain ndarrays, bound as
    they are where the kernels run (no device copy, no static argument),
    is decided by their names, dtypes, shapes and strides alone."""
    fast = f.__dict__.setdefault("_vjp_fast", {})
    values = bound.values()
    arrays = None if host_results else fast_key(values)
    key = None if arrays is None else (tuple(bound), arrays)
    entry = fast.get(key)
    if entry is not None:
        return entry, entry.fwd(*values)

    def run():
        on_target = f.on_target(bound)
        entry = vjp_entry(f, on_target)
        return entry, on_target, entry.fwd(*on_target.values())
    entry, on_target, results = f.retrying_by_value(bound, run)
    if key is not None and not entry.static \
            and all(a is b for a, b in zip(values, on_target.values())):
        if len(fast) >= FastPath.SIZE:
            fast.clear()
        fast[key] = entry
    return entry, results


class _VjpEntry:
    """The split programs of one size pattern of f (or one signature, where
    f needs its sizes; `static`: picked by the value of a static argument)
    and what a `Pullback` of them needs."""

    def __init__(self, fwd: Callable, bwd: Callable, n_out: int, out_types: Sequence,
                 names: Sequence[str], float_args: Sequence[str], static: bool):
        self.fwd, self.bwd, self.n_out, self.out_types = fwd, bwd, n_out, tuple(out_types)
        self.names, self.float_args, self.static = names, float_args, static
        # outputs of symbolic sizes: a pullback checks cotangents against its
        # call's, the output types made once per shapes of the outputs
        self.symbolic = any(not isinstance(d, int) for t in out_types for d in t.shape)
        self._sized = Lru(FastPath.SIZE)  # output shapes -> their OutTypes
        self._reading_none = Lru(FastPath.SIZE)  # output shapes -> a Pullback

    def pullback(self, f: Compiled, outs: Sequence, residuals: Optional[Sequence] = None,
                 host_results: bool = False) -> Pullback:
        """The Pullback of the call whose outputs are `outs`, reading
        `residuals` (None: reading none, which holds nothing of a call, so
        one serves every call of these output shapes)."""
        shapes = tuple([o.shape for o in outs]) if self.symbolic else None
        if residuals is None and not host_results:
            made = self._reading_none.get(shapes)
            if made is None:
                made = self._reading_none[shapes] = self.pullback(f, outs, ())
            return made
        out_types = self.out_types
        if shapes is not None:
            out_types = self._sized.get(shapes)
            if out_types is None:
                out_types = self._sized[shapes] = tuple(
                    OutType(tuple(s), t.dtype) for s, t in zip(shapes, self.out_types))
        return Pullback(f.name, self.bwd, residuals or (), out_types,
                        [n for n in self.names if n not in f.hidden], self.float_args, f.target,
                        host_results, about=f)


VJP_PROGRAMS = 32  # split programs kept per function (one per size pattern and dtypes)


def vjp_entry(f: Compiled, bound: dict[str, np.ndarray]) -> _VjpEntry:
    """The split programs for validated arguments like `bound`: the
    forward keeps only the residuals its backward reads.  As
    `Compiled.program` (`by_pattern`): one entry per size pattern (the
    backward binds the sizes it needs from its residuals,
    `pipeline.carrying_sizes`), or per signature where f needs its sizes."""
    statics = f.static_names(bound)
    return by_pattern(held_by(f, "_vjp_programs", VJP_PROGRAMS), bound, statics, f._lock,
                      lambda types: _split_entry(f, bound, statics, types))


def _split_entry(f: Compiled, bound: dict[str, np.ndarray], statics: frozenset,
                 types: dict[str, TensorType]) -> _VjpEntry:
    names = list(types)
    float_args = f.differentiable_names(bound)
    fn = f.lower(types)
    fwd, bwd = pipeline.vjp_programs(fn, [names.index(n) for n in float_args], f.target)
    return _VjpEntry(fwd, bwd, len(fn.outputs), fn.out_types, names, float_args, bool(statics))


def vjp_bound(f: Compiled, bound: dict[str, np.ndarray], host_results: bool = False):
    """(raw outputs, Pullback) on validated arguments where the kernels
    run (the pullback's results come back to NumPy when `host_results`)."""
    entry = vjp_entry(f, bound)
    results = entry.fwd(*bound.values())
    outs = results[:entry.n_out]
    return outs, entry.pullback(f, outs, results[entry.n_out:], host_results)


def result_types(f: Compiled, bound: dict[str, Any]) -> tuple[tuple[tuple, np.dtype], ...]:
    """The (shape, dtype) of each of f's results for arguments like
    `bound` (any arrays of their shapes and dtypes), from its IR, without
    running it: what a library tracing f (JAX) must know in advance.
    Raises `NeedsValue` for an integer argument used as a size that is
    not yet compiled by value (`Compiled.by_value`)."""
    statics = f.static_names(bound)
    cache = held_by(f, "_result_types", SHAPES)
    key = _signature(bound, statics)
    found = cache.get(key)
    if found is None:
        found = cache[key] = tuple((tuple(t.shape), np.dtype(NUMPY[t.dtype]))
                                   for t in f.lower(_types(bound, statics)).out_types)
    return found


def holding_nothing(shape: tuple, dtype: Any) -> np.ndarray:
    """An array of zeros of this shape and dtype that holds no memory (a
    read-only view of one zero): for its shape and dtype alone, however
    large."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def results_like(f: Compiled, bound: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """f's results for arguments like `bound`, as arrays of their shapes
    and dtypes that hold no memory (`holding_nothing`), from its IR,
    without running it: what a batch of no examples stacks (compiled by
    value where a size is an integer argument's, as a call would)."""
    types = f.retrying_by_value(bound, lambda: result_types(f, bound))
    return tuple(holding_nothing(shape, dtype) for shape, dtype in types)


def program_result_types(f: Compiled, bound: dict[str, Any]) -> tuple:
    """`result_types` as the program a call on `bound` runs
    (`Compiled.program`) gives them: lowered for the call's pattern of
    sizes (its results' sizes then evaluated at the call's), or for its
    sizes where f needs those.  f's results have the same types either way;
    the residuals a `ForwardPass` keeps may not (known sizes may simplify
    differently), and one of those may have a size known only when the
    program runs (the trips of a loop over `range(n)` for an argument n):
    that size stays a `Sym`, as in `result_types`."""
    statics = f.static_names(bound)
    types = _symbolic(bound, statics)
    symbolic = symbolic_result_types(
        f, bound, {n: t.shape for n, t in types.items() if n not in statics})
    if symbolic is None:
        return result_types(f, bound)
    sizes = {d.factors[0]: size for n, t in types.items() if n not in statics
             for d, size in zip(t.shape, bound[n].shape) if isinstance(d, Sym)}
    return tuple((tuple(evaluate(d, sizes) if computable(d, sizes) else d for d in shape), dtype)
                 for shape, dtype in symbolic[1])


def symbolic_result_types(f: Compiled, bound: dict[str, Any],
                          shapes: dict[str, tuple]) -> Optional[tuple]:
    """(f's argument types, the (shape, dtype) of each result) for
    arguments like `bound` but with the `shapes` given by name, whose
    sizes may be symbols (`Sym`: a tracer's, torch's dynamic shapes); the
    results' sizes are expressions in them.  None where f does not lower
    so (it needs concrete sizes, or a shape rule fails on symbols it cannot
    tell equal).  Raises `NeedsValue` as `result_types`."""
    types = _types(bound, f.static_names(bound), shapes)
    # (a static argument's str is its dtype alone: its value is part of the key)
    key = tuple((n, str(t), repr(getattr(t, "value", None))) for n, t in types.items())
    cache = held_by(f, "_symbolic_result_types", SHAPES)
    found = cache.get(key, _UNKNOWN)
    if found is _UNKNOWN:
        try:
            outs = tuple((tuple(t.shape), np.dtype(NUMPY[t.dtype]))
                         for t in f.lower(types).out_types)
            found = (types, outs)
        except (NeedsConcrete, GradError):
            found = None
        cache[key] = found
    return found


_UNKNOWN = object()  # (None is an answer: f does not lower on symbols)


def _extra_names(inner: Compiled, stem: str, count: int) -> tuple[str, ...]:
    """`count` names for the arguments a transform adds to `inner` (its
    cotangents, its tangents), apart from inner's own, which has such names
    too when it is a transform itself (a tape inside two others, a jvp of a
    jvp): stem0, stem1, ..., then $stem0, ..."""
    taken = {s.name for s in inner.specs + inner.param_specs}
    prefix = stem
    while any(n.startswith(prefix) for n in taken):
        prefix = "$" + prefix
    return tuple(f"{prefix}{i}" for i in range(count))


class VjpFunction(Derived):
    """(args..., cotangents...) -> one cotangent per float argument (or per
    float argument named in `wrt`, in the signature's order): the backward
    pass as a function of its own, so that a `Tape` computing a gradient
    inside an outer tape records it, and the outer tape can differentiate
    it (second order)."""

    def __init__(self, inner: Compiled, n_outputs: int, wrt: Optional[tuple[str, ...]] = None):
        super().__init__(inner)
        self.n_outputs, self.wrt = n_outputs, wrt
        self.name = f"vjp({inner.name})"
        self.ct_names = _extra_names(inner, "$ct", n_outputs)
        self.param_specs = inner.param_specs + tuple(
            ParamSpec(n, None, None, False, False) for n in self.ct_names)

    def recipe(self) -> tuple:
        return backward_function, (self.inner, self.n_outputs, self.wrt)

    def lower(self, types: dict[str, TensorType]) -> Function:
        inner_types = {n: t for n, t in types.items() if n not in self.ct_names}
        return pipeline.pullback(self.inner.lower(inner_types),
                                 _float_positions(self.inner, inner_types, self.wrt))

    def identity(self) -> tuple:
        return ("vjp", self.inner.identity(), self.ct_names, self.wrt)

    def format(self, outs):
        return tuple(outs)


def _float_positions(f: Compiled, types: dict[str, TensorType],
                     wrt: Optional[tuple[str, ...]] = None) -> list[int]:
    """The positions in `types` of f's arguments with a gradient (those
    named in `wrt`, if given)."""
    floats = f.differentiable_names({n: np.empty(0, NUMPY[t.dtype]) for n, t in types.items()})
    return [list(types).index(n) for n in floats if wrt is None or n in wrt]


class ForwardPass(Derived):
    """args... -> (f's results..., residuals...): f's forward pass keeping
    the values its backward pass (`BackwardPass`) reads, but for f's
    arguments, which that reads itself (`pipeline.vjp_passes`).  A library
    that holds the residuals (a torch graph) then differentiates a call
    without computing its forward again (a `VjpFunction` computes it)."""

    def __init__(self, inner: Compiled):
        super().__init__(inner)
        self.name = inner.name  # (its errors are f's)

    def recipe(self) -> tuple:
        return forward_pass_function, (self.inner,)

    def lower(self, types: dict[str, TensorType]) -> Function:
        fn = self.inner.lower(types)
        return pipeline.vjp_passes(fn, _float_positions(self.inner, types))[0]

    def identity(self) -> tuple:
        return ("forward pass", self.inner.identity())

    def format(self, outs):
        return tuple(outs)


class BackwardPass(Derived):
    """(args..., residuals..., cotangents...) -> one cotangent per float
    argument: f's backward pass reading `n_residuals` residuals of its
    `ForwardPass` (named `residual_names`) and `n_outputs` cotangents."""

    def __init__(self, inner: Compiled, n_outputs: int, n_residuals: int):
        super().__init__(inner)
        self.name = f"vjp({inner.name})"
        self.residual_names = _extra_names(inner, "$r", n_residuals)
        self.ct_names = _extra_names(inner, "$ct", n_outputs)
        self.param_specs = inner.param_specs + tuple(
            ParamSpec(n, None, None, False, False) for n in self.residual_names + self.ct_names)

    def recipe(self) -> tuple:
        return backward_pass_function, (self.inner, len(self.ct_names), len(self.residual_names))

    def lower(self, types: dict[str, TensorType]) -> Function:
        extra = self.residual_names + self.ct_names
        inner_types = {n: t for n, t in types.items() if n not in extra}
        fn = self.inner.lower(inner_types)
        backward = pipeline.vjp_passes(fn, _float_positions(self.inner, inner_types))[1]
        if len(backward.params) != len(types):  # (the forward pass lowered otherwise)
            raise ArgumentError(f"{called(self.inner.name)}'s forward pass kept other "
                                "residuals than its backward pass reads", self.span)
        return backward

    def identity(self) -> tuple:
        return ("backward pass", self.inner.identity(), self.residual_names, self.ct_names)

    def format(self, outs):
        return tuple(outs)


def derived(f: Any, key: tuple, make: Callable[[], Any]) -> Any:
    """The transform of `f` named by `key` (a gradient, a VJP, a jvp, ...),
    made once and kept on `f` (which it references, so it lives as long):
    its programs then compile once, for every call, bridge and check that
    asks for it."""
    made = f.__dict__.setdefault("_derived", {})
    if key not in made:
        made[key] = make()
    return made[key]


def derived_if_made(f: Any, key: tuple) -> Any:
    """What `derived` keeps under `key`, or None."""
    return f.__dict__.get("_derived", {}).get(key)


def grad_function(f: "Compiled | AotFunction", wrt: Wrt, with_value: bool,
                  has_aux: bool = False) -> Any:
    """`grad(f, wrt)` (or `value_and_grad`), one per function, arguments and
    kind: `wrt` is resolved first, so 0 and "x" share one.  A gradc-compiled
    function's is its compiled gradient (`AotGradient`)."""
    names, single = resolve_wrt(f, wrt), not isinstance(wrt, (tuple, list))
    if isinstance(f, AotFunction):
        if has_aux:
            raise ArgumentError(f"has_aux=True takes a function of a loaded .grad module; "
                                f"{called(f.name)} was compiled by gradc compile, whose "
                                "gradients are of the sum of every result")
        return derived(f, ("grad", names, single, with_value),
                       lambda: f.gradient(names, single, with_value))
    key = ("grad", names, single, with_value) + (("aux",) if has_aux else ())
    return derived(f, key, lambda: GradFunction(f, wrt, with_value, has_aux))


def jvp_function(f: Compiled, active: Sequence[str]) -> "JvpFunction":
    """One `JvpFunction` per (function, arguments with tangents)."""
    return derived(f, ("jvp", tuple(active)), lambda: JvpFunction(f, active))


def stacked_jvp_function(f: Compiled, name: str) -> Stacked:
    """f's jvp along argument `name` for stacked tangents (`Stacked`): one
    per (function, argument)."""
    def make() -> Stacked:
        jf = jvp_function(f, [name])
        return Stacked(jf, [jf.tangent_names[0]], "tangents")
    return derived(f, ("stacked jvp", name), make)


def stacked_vjp_function(f: Compiled, n_outputs: int, output: int,
                         wrt: Optional[tuple[str, ...]] = None) -> Stacked:
    """f's backward pass (`backward_function`) for stacked cotangents of
    its output `output`: one per (function, outputs, output, wrt)."""
    def make() -> Stacked:
        vf = backward_function(f, n_outputs, wrt)
        return Stacked(vf, [vf.ct_names[output]], "all")
    return derived(f, ("stacked vjp", n_outputs, output) + ((wrt,) if wrt else ()), make)


def batched_function(f: Compiled, names: Sequence[str]) -> Stacked:
    """f for stacked values of its arguments `names` at once, every output
    stacked (`Stacked`): a vmap of f, one per (function, arguments)."""
    return derived(f, ("batched", tuple(names)), lambda: Stacked(f, names, "all"))


def backward_function(f: Compiled, n_outputs: int,
                      wrt: Optional[tuple[str, ...]] = None) -> VjpFunction:
    """f's backward pass as a function of its own (`VjpFunction`), giving
    the cotangents of the float arguments `wrt` (None: all of them), one
    per function, number of outputs and `wrt`, so that its programs
    compile once."""
    key = ("vjp", n_outputs) if wrt is None else ("vjp wrt", n_outputs, wrt)
    return derived(f, key, lambda: VjpFunction(f, n_outputs, wrt))


def forward_pass_function(f: Compiled) -> ForwardPass:
    """f's forward pass keeping its residuals (`ForwardPass`), one per function."""
    return derived(f, ("forward pass",), lambda: ForwardPass(f))


def backward_pass_function(f: Compiled, n_outputs: int, n_residuals: int) -> BackwardPass:
    """f's backward pass reading its forward pass's residuals
    (`BackwardPass`), one per function and numbers of outputs and residuals."""
    return derived(f, ("backward pass", n_outputs, n_residuals),
                   lambda: BackwardPass(f, n_outputs, n_residuals))


class JvpFunction(Derived):
    """(args..., tangents of `active`...) -> (outputs..., output tangents...):
    forward mode (`pipeline.jvp`) along the arguments named `active`."""

    def __init__(self, inner: Compiled, active: Sequence[str]):
        super().__init__(inner)
        self.active = tuple(active)
        self.name = f"jvp({inner.name})"
        self.tangent_names = _extra_names(inner, "$t", len(self.active))
        self.param_specs = inner.param_specs + tuple(
            ParamSpec(n, None, None, False, False) for n in self.tangent_names)

    def recipe(self) -> tuple:
        return jvp_function, (self.inner, self.active)

    def lower(self, types: dict[str, TensorType]) -> Function:
        inner_types = {n: t for n, t in types.items() if n not in self.tangent_names}
        names = list(inner_types)
        return pipeline.jvp(self.inner.lower(inner_types), [names.index(n) for n in self.active])

    def identity(self) -> tuple:
        return ("jvp", self.inner.identity(), self.active, self.tangent_names)

    def format(self, outs):
        n = len(outs) // 2
        return self.inner.format(outs[:n]), self.inner.format(outs[n:])


class NotStacked(ArgumentError, NotVectorizable):
    """A `Stacked` function that cannot be one program (an op with no rule
    for stacked values, a stacked argument used as a size): an error where
    a program is needed, but a `vmap` of it runs it once per example."""


class Stacked(Derived):
    """`inner` for k values of its arguments `names` at once
    (`compiler.vectorize`): each of them takes a leading axis of size k,
    and so do the outputs `which` names ("tangents": a jvp's second half,
    "all"); the others are inner's own.  Lowering raises `NotVectorizable`
    where an op on the way has no rule for stacked values."""

    def __init__(self, inner: Compiled, names: Sequence[str], which: str):
        super().__init__(inner)
        self.stacked, self.which = tuple(names), which
        self.name = f"stacked {inner.name}"
        self._plans = Lru(SHAPES)  # signature -> (stacks, per_slice)

    def recipe(self) -> tuple:
        return Stacked, (self.inner, self.stacked, self.which)

    def stacks(self, bound: dict[str, np.ndarray]) -> bool:
        """For arguments `bound` holding one value of each stacked argument
        (no leading axis): whether inner can be stacked (every op on the
        way has a rule for stacked values)."""
        return self._plan(bound)[0]

    def per_slice(self, bound: dict[str, np.ndarray]) -> Optional[int]:
        """Like `stacks`: the elements the stacked program's values hold for
        each stacked value, or None if inner cannot be stacked or a size
        is known only when it runs (a loop's trip count), so that what a
        stacked value costs is not known."""
        return self._plan(bound)[1]

    def _plan(self, bound: dict[str, np.ndarray]) -> tuple[bool, Optional[int]]:
        """(`stacks`, `per_slice`), worked out from inner's IR once per
        signature."""
        try:
            return self.retrying_by_value(bound, lambda: self._planned(bound))
        except NotStacked:  # a stacked argument gives a size (`by_value`)
            return False, None

    def by_value(self, need: NeedsValue, bound: dict[str, np.ndarray]) -> None:
        """A stacked argument used as a size picks a program for each of its
        values, so no one program stacks them: `NotStacked`."""
        if need.name in self.stacked:
            raise self._sized(need.name)
        super().by_value(need, bound)

    def _sized(self, name: str, why: str = "has a value for each example and gives a size"
               ) -> "NotStacked":
        return NotStacked(f"argument {name!r} of {called(self.name)} {why}, so no one program "
                          "takes them all: it runs one example at a time, where it can (not "
                          "for a transform, a tape or Dask arrays)", self.span)

    def _planned(self, bound: dict[str, np.ndarray]) -> tuple[bool, Optional[int]]:
        statics = self.static_names(bound)
        if statics & set(self.stacked):  # a const scalar per example: a program each
            return False, None
        key = _signature(bound, statics)
        plan = self._plans.get(key)
        if plan is None:
            slots = self._slots(bound)
            try:  # either raises where a rule is missing (a vmap's inside inner too)
                fn = self.inner.lower(_types(bound, statics))
                vectorize(fn, slots, (), 1)
            except NotVectorizable:
                plan = (False, None)
            else:
                try:
                    plan = (True, int(stacked_elements(fn, slots)))
                except NeedsConcrete:
                    plan = (True, None)
            self._plans[key] = plan
        return plan

    def _slots(self, names: Iterable[str]) -> list[int]:
        order = list(names)
        return [order.index(n) for n in self.stacked]

    def lower(self, types: dict[str, TensorType]) -> Function:
        k = types[self.stacked[0]].shape[0]
        for name in const_scalar_names(self.inner.specs).intersection(self.stacked):
            if types[name].rank == 1 and types[name].dtype in ("i32", "i64", "bool"):
                raise self._sized(name, "is a const scalar for each example, whose value "
                                        "picks the program")
        try:
            fn = self.inner.lower({n: TensorType(t.dtype, t.shape[1:]) if n in self.stacked
                                   else t for n, t in types.items()})
        except NeedsValue as need:
            if need.name in self.stacked:
                raise self._sized(need.name) from None
            raise
        n = len(fn.outputs)
        outputs = range(n // 2, n) if self.which == "tangents" else range(n)
        return vectorize(fn, self._slots(types), outputs, k)

    def identity(self) -> tuple:
        return ("stacked", self.inner.identity(), self.stacked, self.which)

    def format(self, outs):
        return tuple(outs)


class Select(Derived):
    """One output of another function."""

    def __init__(self, inner: Compiled, index: int):
        super().__init__(inner)
        self.index = index
        self.name = f"{inner.name}[{index}]"

    def recipe(self) -> tuple:
        return Select, (self.inner, self.index)

    def lower(self, types: dict[str, TensorType]) -> Function:
        return pipeline.select(self.inner.lower(types), self.index)

    def identity(self) -> tuple:
        return ("select", self.inner.identity(), self.index)

    def format(self, outs):
        return outs[0]


class Directional(Derived):
    """x, v -> grad_x <inner(x), v>: one more order of directional
    derivative of `inner` (whose single output has x's shape) along the
    argument named `vname`."""

    def __init__(self, inner: Compiled, wrt: str, vname: str):
        super().__init__(inner)
        self.wrt, self.vname = wrt, vname
        self.name = f"d({inner.name})"

    def recipe(self) -> tuple:
        return Directional, (self.inner, self.wrt, self.vname)

    def lower(self, types: dict[str, TensorType]) -> Function:
        if not types[self.wrt].is_float:
            raise ArgumentError(f"cannot differentiate w.r.t. {self.wrt!r}: not a float",
                                self.span)
        fn = self.inner.lower({n: t for n, t in types.items() if n != self.vname})
        return pipeline.directional(fn, types, self.wrt, self.vname)

    def identity(self) -> tuple:
        return ("directional", self.inner.identity(), self.wrt, self.vname)

    def format(self, outs):
        return outs[0]


class HvpFunction(Directional):
    """`hvp(f, wrt)(args..., v)`: the Hessian of sum(f) w.r.t. argument
    `wrt`, times v (reverse over reverse: H^T v, for H = `hessian(f)`,
    which differs from H v = jvp(grad(f)) where a grad block that is no
    function's derivative leaves H not symmetric).  A host v of another dtype is
    converted to wrt's, as a pullback's cotangent is (values beyond it
    refused), where jvp refuses a tangent of another dtype."""

    def __init__(self, inner: Compiled, wrt: Union[int, str]):
        if isinstance(wrt, (tuple, list)):
            raise ArgumentError("hvp() differentiates w.r.t. one parameter; give wrt as a "
                                "position or a name", inner.span)
        (name,) = resolve_wrt(inner, wrt)
        vname = "$v"
        while any(s.name == vname for s in inner.specs):  # an hvp of an hvp: a v of its own
            vname += "'"
        super().__init__(GradFunction(inner, name, with_value=False), name, vname)
        self.name = f"hvp({inner.name})"
        # (public: a vmap of it says it where an argument is missing)
        self.arguments_note = f"{self.name} takes the arguments of {called(inner.name)}, then v"
        # v is a parameter too, the last (`vmap` maps it by this position)
        self.specs = inner.specs + (ParamSpec(vname, None, None, False, False),)

    def recipe(self) -> tuple:
        return HvpFunction, (self.inner.inner, self.wrt)  # (inner: its gradient)

    def by_position(self, args: Sequence[Any]) -> dict[int, Any]:
        """v is the last argument given, after those of inner's (some
        defaulted ones of its may be left out)."""
        if not args:
            return {}
        return {**dict(enumerate(args[:-1])), len(self.specs) - 1: args[-1]}

    def label(self, name: str) -> str:
        return "v" if name == self.vname else self.inner.label(name)

    def named(self, label: str) -> str:
        # (unless inner has a "v" of its own, which keeps its name)
        own = {s.name for s in self.inner.specs + self.param_specs}
        return self.vname if label == "v" and "v" not in own else self.inner.named(label)

    def bind(self, args, kwargs, params=None) -> dict[str, np.ndarray]:
        if "v" in kwargs and self.named("v") == self.vname:  # (hvp(f)(x, w, v=t))
            kwargs = dict(kwargs)
            args = (*args, kwargs.pop("v"))
        if not args:
            raise ArgumentError(self.arguments_note, self.span)
        try:
            bound = self.inner.bind(args[:-1], kwargs, params)
        except ArgumentError as err:  # v was taken from the end: say so
            err.note = err.note or self.arguments_note
            raise
        if self.wrt not in bound:
            raise ArgumentError(f"no value was passed for {self.wrt!r}", self.span)
        x, v = bound[self.wrt], args[-1]
        dtype = SUPPORTED[np.dtype(x.dtype)]
        if np.dtype(x.dtype).kind != "f":  # (before v is converted to its dtype, and refused)
            raise ArgumentError(f"cannot differentiate {called(self.inner.inner.name)} with "
                                f"respect to {self.wrt!r}: it has dtype {dtype}, and only "
                                "floats carry gradients", self.span)
        if not is_device_array(v):
            where = f"v of {self.name}"
            # (as_float: a Python integer beyond 64 bits is a float's value, as
            # an argument's is, not "out of range")
            converted = cast(where, numeric_array(where, v, self.span, as_float=True), dtype,
                             self.span)
            # a tape's result stays itself (in its own dtype, which the program
            # takes as it takes a device array's), as binding keeps an argument
            # that is one: the tape tracking it records the call (a converted
            # copy would be a silent constant)
            v = v if getattr(v, "bind_as_is", False) else converted
        elif SUPPORTED.get(np.dtype(v.dtype)) != dtype:
            # (taken as it is, without a copy: it could not be checked against
            # wrt's dtype as a host v is)
            raise ArgumentError(f"{self.name}: v is a device array of dtype "
                                f"{SUPPORTED.get(np.dtype(v.dtype), v.dtype)}, but {self.wrt!r} "
                                f"has dtype {dtype}: convert it first (device arrays are "
                                "taken as they are)", self.span)
        if v.shape != x.shape:
            raise ArgumentError(f"{self.name}: v has shape {list(v.shape)}, but {self.wrt!r} "
                                f"has shape {list(x.shape)}", self.span)
        bound[self.vname] = v
        return bound

    def call_slow(self, args: tuple, kwargs: dict) -> Any:
        # on Dask arrays, v is split as its argument is, whichever of them
        # is the Dask array (as jvp splits a primal and its tangent)
        k = next((i for i, s in enumerate(self.specs) if s.name == self.wrt), None)
        if args and self.wrt in kwargs:
            x = kwargs[self.wrt]
        elif k is not None and k < len(args) - 1:
            x = args[k]
        else:  # a param, or not given (bind says so)
            return super().call_slow(args, kwargs)
        v = args[-1]
        if is_dask_array(x) and not is_dask_array(v):
            v = chunked_like(v, x)
        elif is_dask_array(v) and not is_dask_array(x):
            x = chunked_like(x, v, own_dtype=True)
        if is_dask_array(v) and is_dask_array(x) and x.dtype.kind == "f" \
                and v.dtype != x.dtype:
            # converted to wrt's dtype as a host v is (binding could convert
            # only its stand-in, which would then stand for no Dask array);
            # (x's dtype asked of a Dask array only: a torch tensor's was
            # NumPy's TypeError "Cannot interpret 'torch.float32' as a data type")
            v = v.astype(x.dtype)
        if self.wrt in kwargs:
            kwargs = {**kwargs, self.wrt: x}
        else:
            args = args[:k] + (x,) + args[k + 1:]
        return super().call_slow(args[:-1] + (v,), kwargs)




def describe_function(source: str, fdef: ast.FuncDef) -> str:
    """The `__doc__` of function `fdef` of `source` (a module loaded, or
    compiled by gradc): its header, where it is defined, its comments."""
    head, comments = header(source, fdef.span.line)
    return described(head, comments, f"{fdef.span.file}:{fdef.span.line}")


def function_of(module: Any, name: str) -> "GradFn":
    """The function `name` of a loaded module (`dsl.api.Module`)."""
    return module.functions[name]


def module_sources(namespace: Namespace) -> tuple[tuple[str, str], ...]:
    """(file, source) of a namespace's module and of every module it
    reaches through imports, sorted."""
    seen: dict[int, Namespace] = {}
    todo = [namespace]
    while todo:
        ns = todo.pop()
        if id(ns) not in seen:
            seen[id(ns)] = ns
            todo += list(ns.modules.values()) + [home for _, home in ns.functions.values()]
    return tuple(sorted((ns.module.file, ns.module.source) for ns in seen.values()))


class GradFn(Compiled):
    """A function of a loaded `.grad` module (`dsl.api.Module`)."""

    __doc__ = DocAttribute(__doc__)  # an instance's: its header and comments (`describe`)

    def __init__(self, module: Any, namespace: Namespace, fdef: ast.FuncDef,
                 host_results: bool = False):
        super().__init__()
        self.target, self.host_results = module.target, host_results
        self.fdef = fdef
        self.name = fdef.name
        self.__name__ = fdef.name
        self.specs = specs_of(fdef)
        self.keyword_order = tuple(s.name for s in self.specs)
        self.reads = param_reads(fdef, namespace)
        self.param_specs = tuple(module.params.spec(w) for w in self.reads)
        self._module = module
        self._namespace = namespace
        self._params = module.params

    def recipe(self) -> tuple:
        return function_of, (self._module, self.name)

    def call_signature(self, out: bool = True) -> Optional[inspect.Signature]:
        return call_signature(self.specs, self.defaults(), out)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default.value for p in self.fdef.params if p.default is not None}

    def describe(self) -> str:
        """Its `__doc__`: its `def` line as written, where, and the `#`
        comments above it (`runtime.signatures.header`)."""
        return describe_function(self._namespace.functions[self.name][1].module.source,
                                 self.fdef)

    @property
    def span(self):
        return self.fdef.span

    def error_sources(self) -> tuple[tuple[str, str], ...]:
        return module_sources(self._namespace)

    def bind(self, args, kwargs, params=None) -> dict[str, np.ndarray]:
        for key in kwargs:  # (said only "h() has no parameter 'w'")
            if key in self.reads and not any(s.name == key for s in self.specs):
                raise ArgumentError(f"{called(self.name)} has no parameter {key!r}: {key!r} is "
                                    "a param of its module, which it reads where it is set: "
                                    f"module.params[{key!r}] = value", self.span)
        bound = super().bind(args, kwargs)
        for w in self.reads:
            bound[w] = self._params.validate(w, params[w], self.span) if params and w in params \
                else self._params.require(w, self.name, self.span)
        check_param_sizes(self.name, self.specs, self.param_specs, bound, self.span)
        return bound

    def module_params(self) -> dict[str, np.ndarray]:
        return {w: self._params[w] for w in self.reads if w in self._params}

    def lower(self, types: dict[str, TensorType]) -> Function:
        # the namespace of the module that defines it (it may be imported)
        home = self._namespace.functions[self.name][1]
        return pipeline.lower_entry(home, self.fdef, types)

    def identity(self) -> tuple:
        return ("function", self.name, module_sources(self._namespace))

    def format(self, outs):
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        return f"<.grad function {self.name} from {self.fdef.span.file}>"
