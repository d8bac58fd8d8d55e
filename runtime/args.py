"""Turning Python call arguments into validated NumPy arrays.

Contract: `bind(name, specs, args, kwargs, span)` returns an ordered
{param name: ndarray} for the arguments the caller passed (parameters left
out fall back to their defaults, which are compile-time constants), or
raises `ArgumentError` before anything runs: too many or missing
arguments, unknown keywords, unsupported dtypes, and arrays whose dtype,
rank or fixed/named dimensions contradict the parameter's annotation.

Python scalars and sequences take the annotated dtype, but for an integer
one (i32, i64, `int`) a bool is refused, as a NumPy bool array is: an
integer parameter is an axis, a size, a count or indices, where NumPy and
PyTorch refuse a bool too.  Unannotated, they
keep NumPy's type, except for a differentiable parameter, which makes them
floats (so `grad(f)(3)` works): f64, or f32 for a Python number (an int,
float or bool) in a call whose float arrays are all f32 (a weakly typed
number, as in NumPy 2 and JAX: `f(x, 0.5)` stays f32 for f32 x); a
Python float for a `const` one is weakly typed too (as its default is).  A
value the dtype cannot hold (2**40 as i32, 1e300 as f32) is refused.
NumPy arrays keep their dtype, and so do other libraries' arrays that
NumPy reads (`__array__`: JAX arrays, CPU torch tensors); one of
non-native byte order ('>f8') is taken as its value in native order, and
a masked array is refused (computing would silently drop its mask).

An annotation may name a dtype kind instead of a dtype (`x: float[n]`,
`KINDS`): it takes an array of any dtype of the kind, as it is (the program
is compiled for that dtype), and Python values as an unannotated parameter
of the kind takes them (a float number weakly typed, a sequence f64; int
values i64).

`None` is an argument only of a `const` parameter of no dtype, as in the
source (`def f(x, axis: const = None)`): it binds as `NONE`, a static
argument like a const integer (`static_names`), whose value, None, picks
and specializes the program as the source's None would.  None for any
other parameter is an `ArgumentError` naming it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from gradlang.runtime.errors import ArgumentError, Span, called, quoted
from gradlang.runtime.recording import THREAD, TapeError, followed_by_a_tape
from gradlang.runtime.target import is_device_array

SUPPORTED = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64",
             np.dtype(np.int32): "i32", np.dtype(np.int64): "i64",
             np.dtype(np.bool_): "bool"}
NUMPY = {v: k for k, v in SUPPORTED.items()}
# Dtype kinds, which an annotation may name for any dtype of the kind: one
# function of `x: float[n]` is compiled for f32 and for f64 arrays alike.
KINDS = {"float": ("f32", "f64"), "int": ("i32", "i64")}
# The annotations of integer and bool values: a `const` scalar of one (or of
# none) is a compile-time value, which picks the program (`static_names`).
INTEGRAL = ("i32", "i64", "int", "bool")
MAX_RANK = 64  # the most axes an array has (NumPy 2's NPY_MAXDIMS)


def admitted(annotated: str) -> tuple[str, ...]:
    """The dtypes an annotation's dtype (a dtype or a kind) takes."""
    return KINDS.get(annotated, (annotated,))


def admits(annotated: Optional[str], dtype: str) -> bool:
    """Whether an annotation's dtype (None: any) takes a value of `dtype`."""
    return annotated is None or dtype in admitted(annotated)


def floating(annotated: Optional[str]) -> bool:
    """Whether an annotation's dtype names floats only (f32, f64, float)."""
    return annotated is not None and set(admitted(annotated)) <= {"f32", "f64"}


def number_dtype(annotated: str) -> str:
    """The dtype a number takes from an annotation (a default, a constant
    result, a Python sequence): the dtype it names, or a kind's widest,
    which a Python number of the kind has (`float`: f64)."""
    return KINDS[annotated][-1] if annotated in KINDS else annotated


def kind_text(annotated: str) -> str:
    """An annotation's dtype for messages: `f32`, `float (f32 or f64)`."""
    return f"{annotated} ({' or '.join(KINDS[annotated])})" if annotated in KINDS else annotated


@dataclass(frozen=True)
class ParamSpec:
    """A parameter as the runtime checks it; iterable as a plain tuple, so
    compiled modules can hold it as a literal."""

    name: str
    dtype: Optional[str]  # None: any; a kind (KINDS): any of the kind
    dims: Optional[tuple[Union[str, int], ...]]  # None: any rank
    const: bool
    has_default: bool

    def __iter__(self):
        return iter((self.name, self.dtype, self.dims, self.const, self.has_default))

    @property
    def differentiable(self) -> bool:
        return not self.const and (self.dtype is None or floating(self.dtype))

    @property
    def takes_none(self) -> bool:
        """A `const` parameter of no dtype (an axis) takes None, as in the
        source (`compiler.ast.FuncDef.refuses_none`)."""
        return self.const and self.dtype is None


class NoneArgument(np.ndarray):
    """The type of `NONE`: None bound to a `const` parameter, as a 0-d array
    (so that every path that keys, places and passes bound arguments takes
    it as it takes a const integer: a static argument the program receives
    and never reads) whose `item()`, the static value that keys programs and
    that lowering sees (`dsl.function.static_type`), is None."""

    def item(self, *args):
        return None

    def __repr__(self) -> str:
        return "NONE"

    def __reduce__(self):
        return (_none_argument, ())


def _none_argument() -> "NoneArgument":
    return NONE  # (unpickled as the one instance)


NONE = np.zeros((), np.bool_).view(NoneArgument)
NONE.flags.writeable = False


def bind(fn_name: str, specs: Sequence[ParamSpec], args: Sequence[Any],
         kwargs: dict[str, Any], span: Optional[Span] = None,
         numbers: Optional[str] = None) -> dict[str, np.ndarray]:
    """(See the module's contract.)  `numbers`: the float dtype of the weakly
    typed Python numbers; None picks it from the float arrays."""
    if len(args) > len(specs):
        raise ArgumentError(f"{called(fn_name)} takes {len(specs)} argument(s) but {len(args)} "
                            "were given", span)
    given: dict[str, Any] = {s.name: a for s, a in zip(specs, args)}
    for key, value in kwargs.items():
        if not any(s.name == key for s in specs):
            raise ArgumentError(f"{called(fn_name)} has no parameter {key!r}", span)
        if key in given:
            raise ArgumentError(f"{called(fn_name)} got two values for {key!r}", span)
        given[key] = value
    for spec in specs:
        if spec.name not in given and not spec.has_default:
            raise ArgumentError(f"{called(fn_name)} is missing argument {spec.name!r}", span)
    arrays: dict[str, Any] = {}
    weak: list[str] = []
    for spec in specs:
        if spec.name in given:
            value = given[spec.name]
            if value is None and spec.takes_none:
                arrays[spec.name] = NONE
            elif spec.dtype in (None, "float") and is_python_number(value) and (
                    spec.differentiable or spec.const and type(value) is float):
                # (a const's float as well: `s: const = 0.1` in f32 stays f32
                # when 0.1 is passed, as its default does; its ints are axes)
                weak.append(spec.name)
            else:
                arrays[spec.name] = convert(fn_name, spec, value, span)
    if weak:
        # Python numbers are weakly typed, as in NumPy 2 and JAX: f32 with f32 arrays
        floats = {a.dtype for a in arrays.values() if np.dtype(a.dtype).kind == "f"}
        taken = numbers or ("f32" if floats == {np.dtype(np.float32)} else "f64")
        for name in weak:  # (the error of a number f32 cannot hold says why f32)
            where = f"argument {name!r} of {called(fn_name)} (a Python number, {taken} here)"
            number = numeric_array(where, given[name], span, as_float=True)
            arrays[name] = cast(where, number, taken, span)
    out: dict[str, np.ndarray] = {}
    dims: dict[str, tuple[int, str]] = {}
    for spec in specs:
        if spec.name in arrays:
            check_shape(fn_name, spec, arrays[spec.name], dims, span)
            out[spec.name] = arrays[spec.name]
    return out


def is_dask_array(value: Any) -> bool:
    """A Dask array (told by its type's module: dask is not imported)."""
    return type(value).__module__.startswith("dask.array")


def is_python_number(value: Any) -> bool:
    """A Python int, float or bool (weakly typed in NumPy 2 and JAX: f32 x
    times True is f32), not a NumPy scalar, which has a dtype of its own."""
    return isinstance(value, (int, float)) and not isinstance(value, np.generic)


def convert(fn_name: str, spec: ParamSpec, value: Any, span,
            where: Optional[str] = None) -> np.ndarray:
    """`value` as the array `spec` takes; `where` names it in errors
    (default: argument NAME of FN())."""
    where = where or f"argument {spec.name!r} of {called(fn_name)}"
    if value is None:
        kind = (f"`const {spec.dtype}`" if spec.const else
                f"an array of dtype {kind_text(spec.dtype)}" if spec.dtype else "an array")
        raise ArgumentError(f"{where} is None, but only a `const` parameter of no dtype (such "
                            f"as `axis: const`) takes None, and it is {kind}", span)
    if is_foreign_array(value):
        value = foreign_array(where, value, span)
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        # An ndarray subclass that asks for it (a `dsl.Tape`'s arrays, tracked by
        # identity) is taken as itself; others as plain ndarrays.
        array = value if getattr(value, "bind_as_is", False) else plain(where, value, span)
        if array.dtype not in SUPPORTED:
            raise ArgumentError(f"{where} has unsupported dtype {array.dtype}; use "
                                "float32, float64, int32, int64 or bool", span)
        if not admits(spec.dtype, SUPPORTED[array.dtype]):
            raise ArgumentError(f"{where} has dtype {SUPPORTED[array.dtype]}, but its "
                                f"annotation says {kind_text(spec.dtype)}", span)
        return array
    if is_device_array(value):
        if spec.const and spec.dtype in INTEGRAL:
            # its value picks the program (an axis, a count): a device
            # array's is not static, and an axis read from one was "not a
            # compile-time integer", said at the sum, not here
            python = "bool" if spec.dtype == "bool" else "int"
            raise ArgumentError(f"{where} is a device array, but a `const {spec.dtype}` is a "
                                "value the call is compiled for: pass it on the host (a "
                                f"Python {python})", span)
        dtype = np.dtype(value.dtype)
        if dtype not in SUPPORTED:
            # (taken without a copy, so not cast here as a host array of
            # its values would be: converted where it lives, by its caller)
            raise ArgumentError(f"{where} is a device array of unsupported dtype {dtype}; use "
                                "float32, float64, int32, int64 or bool (convert it on the "
                                "device first: device arrays are taken without a copy)", span)
        if not admits(spec.dtype, SUPPORTED[dtype]):
            raise ArgumentError(f"{where} has dtype {SUPPORTED[dtype]}, but its annotation "
                                f"says {kind_text(spec.dtype)}", span)
        return value
    as_float = floating(spec.dtype) or (spec.dtype is None and spec.differentiable)
    # the integer dtype it is cast to below (an unannotated integer's: i64)
    integer = "i64" if spec.dtype is None else number_dtype(spec.dtype)
    array = numeric_array(where, value, span, as_float=as_float,
                          integer=integer if integer in ("i32", "i64") else None)
    if array.dtype.kind == "b" and spec.dtype is not None \
            and set(admitted(spec.dtype)) <= {"i32", "i64"}:
        # (as a NumPy bool is, above: an integer parameter is an axis, a
        # size, a count or indices, where True is a slip, such as keepdims
        # passed in its place; NumPy and PyTorch refuse a bool as an axis)
        what = (f"is a bool ({array.item()})", "an integer") if array.ndim == 0 else \
            ("holds bools", "integers")
        raise ArgumentError(f"{where} {what[0]}, but its annotation says "
                            f"{kind_text(spec.dtype)}: pass {what[1]}", span)
    if spec.dtype is not None:
        return cast(where, array, number_dtype(spec.dtype), span)
    if spec.differentiable or array.dtype.kind == "f":
        return array.astype(np.float64)
    if array.dtype.kind in "iu":
        return cast(where, array, "i64", span)
    return array


def is_foreign_array(value: Any) -> bool:
    """Whether `value` is another library's host array, with a dtype of its
    own (`__array__`: a JAX array, a CPU torch tensor), not a NumPy one."""
    return not isinstance(value, (np.ndarray, np.generic)) and hasattr(value, "__array__") \
        and not is_device_array(value)


def foreign_array(where: str, value: Any, span=None) -> np.ndarray:
    """Another library's array with a dtype of its own (a JAX array, a CPU
    torch tensor: `__array__`) as NumPy's, keeping that dtype, as NumPy
    does (an f32 one was made f64, as Python values are); one that NumPy
    cannot read (a torch tensor that requires grad, a JAX tracer) is an
    `ArgumentError` naming the bridge that takes it."""
    try:
        return np.asarray(value)
    except Exception as err:  # noqa: BLE001 (the library's own error: its message says why)
        hint = _BRIDGES.get(type(value).__module__.split(".")[0], "")
        raise ArgumentError(f"{where} cannot be read as a NumPy array ({quoted(err)}){hint}",
                            span) from None


# a library whose arrays NumPy may be unable to read -> the bridge to call through
_BRIDGES = {"torch": "; call the function through dsl.to_torch(f), which autograd records",
            "jax": "; call the function through dsl.to_jax(f), which JAX transforms"}


def numeric_array(where: str, value: Any, span=None, as_float: bool = False,
                  integer: Optional[str] = None) -> np.ndarray:
    """`np.asarray(value)` for a Python number or a rectangular (nested)
    sequence of them, or a NumPy array; anything else (text, ragged lists,
    complex numbers, whose imaginary part a cast would drop) raises
    `ArgumentError` saying what `where` is.  NumPy arrays as `plain`
    takes them (one of a dtype other than bool, integer, float or complex,
    such as object, refused as an unsupported dtype), other libraries' as
    `foreign_array` does.  Python integers
    beyond 64 bits (which NumPy holds as objects) are refused, unless
    `as_float` (a value for a float): then they are f64s, as `float()`
    makes them; for the `integer` dtype the value is cast to (`cast`),
    refused as out of its range, as `cast` refuses 2**63 (which NumPy
    holds as a uint64), not as a width that says nothing of the range."""
    if isinstance(value, (np.ndarray, np.generic)):
        value = plain(where, value, span)
        if value.dtype.kind not in "biufc":
            # (before the walk below for Python integers beyond 64 bits, which an
            # object array of small ones would pass: said to hold such integers)
            raise ArgumentError(f"{where} has unsupported dtype {value.dtype}; use float32, "
                                "float64, int32, int64 or bool", span)
    elif is_foreign_array(value):  # (its library's refusal, a tensor that requires grad, said so)
        value = foreign_array(where, value, span)
    elif isinstance(value, (list, tuple)) and "dask.array" in sys.modules \
            and _holds(value, is_dask_array):
        # np.asarray would compute the Dask arrays whole, in this process,
        # and the call would run in memory: not what a Dask call promises
        raise ArgumentError(f"{where} is a {type(value).__name__} holding a Dask array, which the "
                            "call would compute whole into memory: stack them into one Dask "
                            "array (da.stack) to run block by block", span)
    elif isinstance(value, (list, tuple)) and THREAD.tapes and _holds(value, followed_by_a_tape):
        # np.asarray copies their values: a constant to the tape, whose
        # gradient then silently missed what flows through them
        raise TapeError(f"{where} is a {type(value).__name__} holding an array a recording "
                        "dsl.Tape follows (watched, a recorded call's result, or computed from "
                        "one), of which the call would take a copy that the tape cannot follow: "
                        "pass each array as an argument (stacking them in the .grad module), "
                        "or np.asarray(...) of the list to make it a constant on purpose", span)
    if value is None:  # (said "is not numeric: got NoneType")
        raise ArgumentError(f"{where} is None, where an array or a number goes", span)
    try:
        array = np.asarray(value)
    except MemoryError:  # (an AllocationError where it leaves: `runtime.boundary`)
        raise
    except Exception as err:  # noqa: BLE001 (an element's own refusal: its message says why)
        # (not only NumPy's ValueError and TypeError: a list holding a torch
        # tensor that requires grad raised torch's RuntimeError as it was read)
        if "inhomogeneous" in str(err):  # (NumPy's three sentences about its detected shape)
            raise ArgumentError(f"{where} is not an array: its nested sequences are ragged "
                                "(of different lengths or depths)", span) from None
        raise ArgumentError(f"{where} is not an array: {quoted(err)}", span) from None
    if array.dtype == object and array.size and all(isinstance(v, int) for v in array.flat):
        if integer is not None and not as_float:
            raise integer_out_of_range(where, integer, span)
        if not as_float:
            raise ArgumentError(f"{where} is out of range: it holds an integer beyond 64 bits",
                                span)
        try:
            return array.astype(np.float64)
        except OverflowError:
            raise ArgumentError(f"{where} is out of range for f64: it holds an integer beyond "
                                f"{np.finfo(np.float64).max:.7g}", span) from None
    if array.dtype.kind == "c":
        raise ArgumentError(f"{where} is complex; gradlang computes with real numbers", span)
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise ArgumentError(f"{where} is not numeric: got {type(value).__name__}", span)
    return array


def _holds(sequence: Any, found: Callable[[Any], bool], depth: int = 1) -> bool:
    """Whether a (nested) list or tuple holds a value `found` picks (a
    Dask array), within the `MAX_RANK` levels an array can have: one
    nested deeper is no array (np.asarray says so), and walking it whole,
    10**5 levels, was a RecursionError."""
    for v in sequence:
        kind = type(v)
        if kind is float or kind is int:  # (most of a long list: skipped first)
            continue
        if found(v) or (isinstance(v, (list, tuple)) and depth < MAX_RANK
                        and _holds(v, found, depth + 1)):
            return True
    return False


def plain(where: str, value: Any, span=None) -> np.ndarray:
    """A NumPy array or scalar as a plain ndarray in native byte order (a
    copy if it was not), which the kernels compute with; a masked array
    raises `ArgumentError` (as JAX does): its mask would be dropped, and
    the values under it computed with.  (A masked array exists only once
    its class is, in numpy.ma.core: asking for `np.ma` would import numpy.ma,
    6-10 ms, and while another thread imports it, it can be there without
    its names.)"""
    masked = getattr(sys.modules.get("numpy.ma.core"), "MaskedArray", None)
    if masked is not None and isinstance(value, masked):
        raise ArgumentError(f"{where} is a masked array, and gradlang would ignore its mask; "
                            "pass a.filled(value) or a.data", span)
    array = np.asarray(value)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def integer_out_of_range(where: str, dtype: str, span) -> ArgumentError:
    """The error of a value beyond what integer `dtype` holds."""
    info = np.iinfo(NUMPY[dtype])
    return ArgumentError(f"{where} is out of range for {dtype}: its values must lie in "
                         f"[{info.min}, {info.max}]", span)


def cast(where: str, array: np.ndarray, dtype: str, span) -> np.ndarray:
    """`array` (from Python values) as `dtype`, refusing values that dtype
    cannot hold, which NumPy would silently wrap or truncate.  An array
    of that dtype already is returned as it is (nothing to check or copy)."""
    if array.dtype == NUMPY[dtype]:
        return array
    if dtype in ("i32", "i64", "bool") and array.dtype.kind == "f":
        whole = np.isfinite(array) & (np.floor(array) == array)
        if not np.all(whole):
            bad = array[~whole].flat[0].item()  # (the first: `n=2.5` said nothing of 2.5)
            raise ArgumentError(f"{where} must hold {dtype} values (whole numbers), not "
                                f"{bad!r}", span)
    # bools (0 or 1) fit every integer type; NumPy cannot compare one with 2**63
    if dtype in ("i32", "i64") and array.size and array.dtype.kind != "b":
        info = np.iinfo(NUMPY[dtype])
        # `>= max + 1`: a float near 2**63 rounds, so `> max` could miss it
        if array.min() < info.min or array.max() >= info.max + 1:
            raise integer_out_of_range(where, dtype, span)
    if dtype == "bool" and array.dtype.kind != "b":
        if not np.all((array == 0) | (array == 1)):
            raise ArgumentError(f"{where} must hold bool values (0 or 1)", span)
    # overflow is refused below; underflow rounds to a subnormal or zero, as
    # in NumPy by default (the caller's np.errstate must not decide a binding)
    with np.errstate(over="ignore", under="ignore"):
        result = array.astype(NUMPY[dtype])
    if result.dtype.kind == "f" and array.dtype.kind == "f" and \
            result.dtype.itemsize < array.dtype.itemsize and \
            np.any(np.isinf(result) & np.isfinite(array)):
        info = np.finfo(result.dtype)
        raise ArgumentError(f"{where} is out of range for {dtype}: its finite values must lie "
                            f"in [{info.min:.7g}, {info.max:.7g}]", span)
    return result


def check_shape(fn_name: str, spec: ParamSpec, array, dims: dict[str, tuple[int, str]],
                span, where: Optional[str] = None) -> None:
    if spec.dims is not None:
        check_dims(where or f"argument {spec.name!r} of {called(fn_name)}",
                   annotation_text(spec.dtype, spec.dims), spec.dims, tuple(array.shape), dims,
                   ArgumentError, span, bound_by=f"for {spec.name!r}")


def check_param_sizes(fn_name: str, specs: Sequence[ParamSpec], params: Sequence[ParamSpec],
                      bound: dict[str, Any], span) -> None:
    """The size names of the module params a call reads (`params`, bound
    with the arguments in `bound`) agree with each other and with those of
    the arguments' annotations, as equal names within the annotations do:
    `param b: f32[h]` has the size `param w: f32[d, h]` gives h."""
    if not any(isinstance(d, str) for p in params for d in p.dims or ()):
        return
    dims: dict[str, tuple[int, str]] = {}
    for spec in specs:
        if spec.name in bound:
            check_shape(fn_name, spec, bound[spec.name], dims, span)
    for spec in params:
        check_shape(fn_name, spec, bound[spec.name], dims, span, f"param {spec.name!r}")


def annotation_text(dtype: Optional[str], dims) -> str:
    """An annotation as its source writes it: `f64[n, 3]`, `[n]`, `f32`."""
    return f"{dtype or ''}[{', '.join(map(str, dims))}]" if dims else str(dtype)


def check_dims(where: str, annotation: str, dims_ann, shape, bound: dict[str, tuple[Any, str]],
               error=ArgumentError, span=None, bound_by: Optional[str] = None) -> None:
    """A value's shape (`where` names the value in errors) against its
    annotation's dimensions: the rank, fixed sizes, and named sizes.  A
    name in `bound` (name -> (size, who bound it: "for 'x'")) must have
    its size; one not in it is bound here, `bound_by` saying by whom
    (default: "on its axis K", for a function's result)."""
    if len(shape) != len(dims_ann):
        raise error(f"{where} has rank {len(shape)} (shape {list(shape)}), but its "
                    f"annotation {annotation} has rank {len(dims_ann)}", span)
    for axis, (dim, size) in enumerate(zip(dims_ann, shape)):
        if isinstance(dim, int):
            if size != dim:
                raise error(f"{where} has size {size} on axis {axis}, but its annotation "
                            f"says {dim}", span)
        elif dim not in bound:
            bound[dim] = (size, bound_by or f"on its axis {axis}")
        elif bound[dim][0] != size:
            known, by = bound[dim]
            raise error(f"{where} has size {size} on axis {axis}, but its annotation says "
                        f"{dim}, which is {known} {by}", span)


def const_scalar_names(specs: Sequence[ParamSpec]) -> set[str]:
    """The `const` parameters that may be integer or bool scalars, whose
    values then pick the program."""
    return {s.name for s in specs if s.const and (s.dtype is None or s.dtype in INTEGRAL)}


def static_names(specs: Sequence[ParamSpec], bound: dict,
                 by_value: frozenset = frozenset()) -> frozenset:
    """The `const` integer and bool scalars of a call (and None, `NONE`), and
    those named in `by_value` (integer arguments a program uses as sizes):
    compile-time values (an axis, an index, a count), so programs are
    specialized on their values."""
    consts = const_scalar_names(specs) | by_value
    return frozenset(n for n in consts if n in bound and not is_device_array(bound[n])
                     and np.ndim(bound[n]) == 0 and np.dtype(bound[n].dtype).kind in "biu")


def call_key(bound: dict, statics: frozenset) -> tuple:
    """What picks a compiled-ahead program: each argument's dtype and rank,
    and the values of static arguments."""
    return tuple((n, np.dtype(a.dtype).str, len(a.shape))
                 + ((a.item(),) if n in statics else ())  # (NONE.item() is None)
                 for n, a in bound.items())
