"""What the bridges to other array libraries (`dsl.torch_bridge`,
`dsl.jax_bridge`) share: which functions they take, their callables'
base class, and how a call of another library's arrays is bound.

Contract: `bridged(f, what)` returns f when it is a function the bridges
can run and differentiate to any order (a `Compiled`: a loaded `.grad`
function or a transform of one), else raises `ArgumentError` (a
gradc-compiled function, which has no IR to differentiate again: the
bridges take one before, first order, `dsl.aot_bridge`) or `TypeError`.
`require(library)` imports an optional library, or raises
`ImportError` naming the extra that installs it; `Bridged` (subclassed
once per library) requires it when made, is its own copy (deep or not),
and pickles as its function (`Compiled.recipe`), bridged again.
`bind_foreign(f, name, args, kwargs, convert)` binds a call whose values
may be the library's arrays (keywords naming module params f reads are
params, the others arguments), each value bound as `convert` makes it an
array, and says which bound names came from the library's arrays (a
list or tuple holding one of them is an `ArgumentError`: NumPy would read
it as a constant, or fail on a traced one).  `widened_halves` casts a
library's half-precision arrays to float32 where f takes float32.
`vary_together(values)` makes JAX values inside `shard_map` vary over the
same manual mesh axes, and says which (`manual_axes` of a value's type);
`weak_number_dtypes` says which weakly typed JAX numbers (a Python float
or int under `jit`) need another dtype to be bound as binding binds a
Python number, and `weak_numbers_as_python` casts them to it (with
jax_enable_x64; without it the bridges bind them in it);
`narrowed_scalars` takes a NumPy f64 (i64) scalar for an f32 (i32)
annotation as its Python number without x64, as `jit` narrows it.
`numbers_as_bound` does all of that for a JAX call, as the JAX bridges
bind it.
"""
from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any, Callable, Optional

import numpy as np

from dsl.function import Compiled, require_function
from gradlang.runtime.args import SUPPORTED
from gradlang.runtime.errors import ArgumentError, called
from gradlang.runtime.signatures import SignatureAttribute, with_keywords


def bridged(f: Any, what: str) -> Compiled:
    return require_function(f, what, aot_ok=False, why=" to differentiate it to any order")


class Bridged:
    """A compiled function `f` as a function of `library`'s arrays; named
    `to_<library>(<f's name>)`.  Made only when `library` is installed."""
    library: str

    def __init__(self, f: Compiled):
        require(self.library)  # a missing library fails here, not mid-call
        self.f = f
        self.__name__ = f"to_{self.library}({f.name})"

    def __repr__(self) -> str:
        return f"<{self.__name__}>"

    @property
    def name(self) -> str:  # (as an error leaving it names the call: `boundary.leaving`)
        return self.__name__

    @property
    def span(self):
        return self.f.span

    def error_sources(self) -> tuple[tuple[str, str], ...]:
        return self.f.error_sources()

    def __deepcopy__(self, memo: dict) -> "Bridged":
        return self  # a function, as f is (`Compiled.__deepcopy__`)

    def __copy__(self) -> "Bridged":
        return self

    def __reduce__(self) -> tuple:
        return type(self), (self.f,)

    __signature__ = SignatureAttribute()

    def call_signature(self) -> Optional[inspect.Signature]:
        """f's, without `out=` (a bridge's call takes no buffers), with each
        module param f reads a keyword-only parameter (`bind_foreign`)."""
        binding = self.binding
        return with_keywords(self.f.call_signature(out=False),
                             [s.name for s in binding.param_specs
                              if s.name not in getattr(binding, "hidden", ())])

    @property
    def binding(self) -> Any:
        """The function `bind_foreign` binds a call with."""
        return self.f


def require(library: str) -> ModuleType:
    try:
        return importlib.import_module(library)
    except ImportError as err:
        raise ImportError(f"this needs {library}, which is not installed: pip install "
                          f"'gradlang[{library}]'") from err


def bind_foreign(f: Compiled, name: str, args, kwargs: dict[str, Any],
                 convert: Callable[[Any, str], tuple[Any, Optional[Any]]]
                 ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(f.bind of the call, bound name -> the library's value) for a call
    of the bridge `name`.  `convert(value, where)` gives what to bind for a
    value and the library's array it stands for (None for a constant)."""
    param_names = {s.name for s in f.param_specs}
    # id of the array bound for a library value -> (that array, kept alive so
    # that no other array takes its id, the value)
    foreign: dict[int, tuple[Any, Any]] = {}
    foreign_params: dict[str, Any] = {}

    def bind_value(value, where: str, param: Optional[str] = None):
        if isinstance(value, (list, tuple)) and _holds_library_array(value, convert, where):
            raise ArgumentError(f"{where} is a {type(value).__name__} holding an array of that "
                                "library, which the call would read as a constant (no gradient "
                                "reaches it; a traced one has no values): stack them into one "
                                "array (torch.stack, jnp.stack)", f.span)
        array, library_value = convert(value, where)
        if library_value is not None:
            foreign[id(array)] = (array, library_value)
            if param is not None:
                foreign_params[param] = library_value
        return array

    places = positional_names(f, len(args))
    positional = [bind_value(a, f"argument {places[i]} of {name}") for i, a in enumerate(args)]
    keywords = {k: bind_value(v, f"argument {k!r} of {name}")
                for k, v in kwargs.items() if k not in param_names}
    bound = f.bind(positional, keywords, {k: bind_value(v, f"param {k!r} of {name}", k)
                                          for k, v in kwargs.items() if k in param_names})
    # each library value by the name it was given for: binding may make an
    # array of its own of what it was given (a param validated, hvp's v in
    # wrt's dtype), which the library's value still stands for (a run reads
    # it in the bound dtype)
    given = {**f.by_name(positional), **keywords}
    by_name = {n: foreign[id(given[n])][1] for n in bound
               if n in given and id(given[n]) in foreign and foreign[id(given[n])][0] is given[n]}
    by_name.update({n: foreign_params[n] for n in bound if n in foreign_params})
    return bound, by_name


def positional_names(f: Compiled, count: int) -> list[str]:
    """How a message names each of `count` positional arguments of f: as
    the caller knows its parameter ('x', hvp's 'v'; `Compiled.label`), or
    by its position where f has none for it (one too many, which binding
    refuses).  (Said "argument 0 of to_torch(f)".)  Worked out once per
    count and kept on f: each bridge call asks."""
    known = f.__dict__.setdefault("_positional_names", {})
    names = known.get(count)
    if names is None:
        names = known[count] = _positional_names(f, count)
    return names


def _positional_names(f: Compiled, count: int) -> list[str]:
    names = [str(i) for i in range(count)]
    # (a gradc-compiled function's: its parameters in order, named as written)
    by_position = getattr(f, "by_position", lambda args: dict(enumerate(args)))
    label = getattr(f, "label", repr)
    for spec_index, i in by_position(list(range(count))).items():
        if spec_index < len(f.specs):
            names[i] = label(f.specs[spec_index].name)
    return names


def refuse_extended_dtypes(f: Compiled, name: str, args: tuple, kwargs: dict) -> None:
    """`ArgumentError` (at f's definition, naming the value as `bind_foreign`
    does for the bridge `name`) for a JAX array of one of JAX's own dtypes
    that NumPy has no dtype for (a PRNG key's `key<fry>`), before anything
    asks it for a NumPy dtype (which raised TypeError, or JAX's ValueError
    'canonicalize_dtype called on extended dtype')."""
    import jax
    params = {s.name for s in f.param_specs}
    places = positional_names(f, len(args))
    given = [(f"argument {places[i]} of {name}", a) for i, a in enumerate(args)]
    given += [(f"{'param' if k in params else 'argument'} {k!r} of {name}", v)
              for k, v in kwargs.items()]
    for where, value in given:
        if isinstance(value, jax.Array) and \
                jax.dtypes.issubdtype(value.dtype, jax.dtypes.extended):
            raise ArgumentError(f"{where} is a JAX array of dtype {value.dtype}, which gradlang "
                                "does not take (float32, float64, int32, int64, bool; a PRNG "
                                "key's bits: jax.random.key_data)", f.span)


def widened_halves(f: Compiled, args: tuple, kwargs: dict, half: Callable[[Any], bool],
                   to_float32: Callable[[Any], Any]) -> tuple[tuple, dict]:
    """The arguments with each of the library's float16 and bfloat16
    arrays (`half`) for a parameter of f that takes float32 (annotated so
    or `float`, or not annotated) cast to float32 by the library
    (`to_float32`, which it differentiates: gradients come back in the
    array's own dtype), as a library's losses compute under mixed
    precision: the kernels have no half precision.  Others stay, for
    binding to refuse in their own dtype's words."""
    def widened(value: Any, name: Optional[str]) -> Any:
        if not half(value):
            return value  # (the common case: no spec looked up)
        spec = next((s for s in f.specs + f.param_specs if s.name == name), None)
        return to_float32(value) if spec is None or spec.dtype in (None, "f32", "float") \
            else value
    return (tuple(widened(a, f.specs[i].name if i < len(f.specs) else None)
                  for i, a in enumerate(args)),
            {k: widened(v, k) for k, v in kwargs.items()})


def known_shape(value: Any, where: str, f: Any) -> tuple[int, ...]:
    """The shape of a JAX value bound for `where` (of f: a loaded or a
    gradc-compiled module's function), whose sizes must be known numbers:
    an `ArgumentError` for a symbolic one (jax.export's shape
    polymorphism, `jax.export.symbolic_shape`), which binding cannot
    check and no program is compiled for (it was NumPy's internal
    TypeError "'_DimExpr' object cannot be interpreted as an integer")."""
    shape = tuple(value.shape)
    if all(isinstance(d, (int, np.integer)) for d in shape):
        return shape
    raise ArgumentError(f"{where} has the symbolic shape ({', '.join(map(str, shape))}) of "
                        f"jax.export's shape polymorphism, but {called(f.name)} runs programs "
                        "compiled for known sizes: trace it with concrete shapes",
                        getattr(f, "span", None))


def jax_halves_widened(f: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`widened_halves` of JAX's float16 and bfloat16 arrays (cast by JAX,
    which differentiates the cast), as jax.nn's losses compute a bfloat16
    model's outputs in float32: what `to_jax` of a loaded function and of
    a gradc-compiled one both take."""
    import jax
    import jax.numpy as jnp
    return widened_halves(
        f, args, kwargs,
        lambda v: isinstance(v, jax.Array) and v.dtype in (jnp.float16, jnp.bfloat16),
        lambda v: v.astype(jnp.float32))


def narrowed_scalars(f: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments, where JAX runs without jax_enable_x64, with a NumPy
    f64 (i64) scalar for a parameter annotated f32 (i32) as the Python
    number it holds, which binding takes for that dtype (an integer
    range-checked): JAX narrows such a scalar as it does an array, and
    under `jit` it is an f32 (i32) tracer, taken.  (An eager call refused
    it as "dtype f64, but its annotation says f32", which `jit` of the same
    call took.  Unannotated, a NumPy scalar stays a 64-bit constant, as
    NumPy's.)"""
    specs = {s.name: s.dtype for s in (*f.param_specs, *f.specs)}
    names = [s.name for s in f.specs]

    def narrowed(value: Any, name: Optional[str]) -> Any:
        wide = NARROWED_SCALARS.get(specs.get(name))
        return value.item() if wide is not None and isinstance(value, wide) else value
    return (tuple(narrowed(a, names[i] if i < len(names) else None) for i, a in enumerate(args)),
            {k: narrowed(v, k) for k, v in kwargs.items()})


# a 32-bit annotation -> the NumPy scalar type JAX narrows to it without x64
NARROWED_SCALARS = {"f32": np.float64, "i32": np.int64}


def refuse_64_bit_annotations(f: Any, args, kwargs, weak: dict[int, Any]) -> None:
    """Without jax_enable_x64 JAX holds no 64-bit array, so an array for a
    parameter of f (a loaded or a gradc-compiled module's function)
    annotated f64 or i64 that JAX holds as f32 or i32 (a NumPy f64 or i64
    one too, which JAX narrows) cannot be taken: an `ArgumentError` saying
    so.  (Another dtype, f16 or i16, is no 64-bit one narrowed: the
    binding refuses it as itself.  A weakly typed number, whose id is in
    `weak`, is no array: it is bound as the Python number it stands for,
    `jax.jit(f)(x, 2)` as `f(x, 2)`.)"""
    import jax
    given = {**f.by_name(args), **kwargs}
    for spec in f.specs:
        value = given.get(spec.name)
        what, narrow = _64_BIT.get(spec.dtype, ("", None))
        if isinstance(value, (np.ndarray, jax.Array)) and id(value) not in weak and \
                jax.dtypes.canonicalize_dtype(value.dtype) == narrow:
            raise ArgumentError(f"argument {spec.name!r} of {called(f.name)} is annotated "
                                f"{spec.dtype}, and without jax_enable_x64 JAX makes every "
                                f"{what} array {SUPPORTED[narrow]}; enable it (jax.config.update("
                                f"'jax_enable_x64', True)), or annotate {_KIND_OF[spec.dtype]} "
                                f"(which takes either dtype) or {SUPPORTED[narrow]}", f.span)


# a 64-bit annotation -> what its arrays are, the dtype JAX narrows them to
_64_BIT = {"f64": ("float", np.dtype(np.float32)), "i64": ("integer", np.dtype(np.int32))}
# the kind an annotation of a 64-bit dtype may say instead, which takes JAX's
# 32-bit arrays and NumPy's 64-bit ones alike (`n: int`, `x: float[n]`)
_KIND_OF = {"f64": "`float`", "i64": "`int`"}


def _holds_library_array(sequence: Any, convert: Callable, where: str) -> bool:
    """Whether a (nested) list or tuple holds an array that `convert`
    takes for the library's (a number or NumPy array is not asked)."""
    todo = [sequence]
    while todo:
        value = todo.pop()
        if isinstance(value, (list, tuple)):
            todo.extend(value)
        elif not isinstance(value, (int, float, complex, str, bytes, np.ndarray, np.generic)) \
                and value is not None and convert(value, where)[1] is not None:
            return True
    return False


def vary_together(values) -> tuple[list, frozenset]:
    """JAX `values` each made to vary over every manual mesh axis (of
    shard_map, with check_vma: JAX's default) that any of them varies
    over, and those axes: as JAX's own operations make their operands
    (`jax.lax.pcast` to varying, `pvary` before JAX 0.10, whose transpose
    sums a replicated weight's cotangent over the devices).  Outside
    shard_map, and in a JAX without such types, the values as they are
    and no axes."""
    import jax
    values = list(values)
    typeof = getattr(jax, "typeof", None)
    if typeof is None:
        return values, frozenset()
    own = [manual_axes(typeof(v)) for v in values]
    axes = frozenset().union(*own)
    return [as_varying(v, tuple(axes - o)) if axes - o else v
            for v, o in zip(values, own)], axes


def manual_axes(aval: Any) -> frozenset:
    """The manual mesh axes (of shard_map) over which a value of JAX type
    `aval` varies: JAX 0.10's `mat.varying`, its `vma` before; none for
    other values and versions."""
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return frozenset(getattr(mat, "varying", ()))
    return frozenset(getattr(aval, "vma", ()) or ())


def as_varying(value: Any, axes: tuple) -> Any:
    """JAX `value` typed as varying over the manual mesh `axes` too (no
    work: a cast of its type)."""
    import jax
    if not axes:
        return value
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(value, axes, to="varying")
    return jax.lax.pvary(value, axes)


def numbers_as_bound(f: Any, args: tuple, kwargs: dict
                     ) -> tuple[tuple, dict, dict[int, np.dtype]]:
    """A JAX call's arguments as the JAX bridges bind them, and (without
    jax_enable_x64) the dtype each weakly typed number among them is bound
    in, by id: with x64, those numbers cast (`weak_numbers_as_python`);
    without it, JAX holds no f64 or i64, so such a number is bound in the
    dtype a Python number is (`weak_number_dtypes`), an array annotated
    f64 or i64 is refused (`refuse_64_bit_annotations`: a NumPy f64 one was
    refused as the f32 JAX makes of it), and a NumPy f64 scalar for an f32
    annotation is taken as `jit`'s f32 tracer of it (`narrowed_scalars`)."""
    import jax
    if jax.config.jax_enable_x64:
        return (*weak_numbers_as_python(f, args, kwargs), {})
    weak = weak_number_dtypes(f, args, kwargs)
    refuse_64_bit_annotations(f, args, kwargs, weak)
    return (*narrowed_scalars(f, args, kwargs), weak)


def weak_numbers_as_python(f: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments, where JAX runs with jax_enable_x64, with each weakly
    typed JAX number cast to the dtype binding gives the Python number it
    stands for (`weak_number_dtypes`).  (It was an f64 or i64 array:
    `jax.jit(f)(x, 0.5)` of an f32 x computed in f64 where the eager call
    computed in f32, and a parameter annotated f32 (or i32) refused it.)
    The cast is a JAX operation, so the number's gradient comes back
    through it.  Without x64 JAX cannot hold an f64 or i64 such a number
    needs: the bridges bind it in that dtype instead (`weak_number_dtypes`),
    converting its value where the kernels read it."""
    import jax
    dtypes = weak_number_dtypes(f, args, kwargs)
    if not dtypes:
        return args, kwargs

    def taken(value: Any) -> Any:
        dtype = dtypes.get(id(value))
        return value if dtype is None or not isinstance(value, jax.Array) \
            else value.astype(dtype)
    return tuple(map(taken, args)), {k: taken(v) for k, v in kwargs.items()}


def weak_number_dtypes(f: Any, args: tuple, kwargs: dict) -> dict[int, np.dtype]:
    """id(value) -> the dtype binding gives a Python number (`runtime.args.bind`),
    for each weakly typed JAX number among the call's arguments (a Python
    float or int that `jit` made a tracer, a `jnp.asarray(0.5)`) whose own
    dtype is not that one: a parameter's annotated dtype (f32, f64; i32,
    i64 for an int), else, for a float (to any float parameter but a module
    param) or an int (to a differentiable one), f32 where the call's other
    float arrays are all f32 as JAX holds them (a NumPy f64 is f32 without
    jax_enable_x64), as JAX's own operations take it, and f64 elsewhere.
    (Without x64 such a number is an f32 or i32 tracer: it was refused for
    an f64 or i64 annotation, "enable jax_enable_x64", and an int was an
    i32 array where the eager call took a float, where `jax.jit(f)(x, 2)`
    and `f(x, 2)` must agree.)"""
    import jax
    specs = {s.name: s for s in f.specs}
    names = [s.name for s in f.specs]
    given = [(names[i] if i < len(names) else None, a) for i, a in enumerate(args)]
    given += [(k, v) for k, v in kwargs.items() if k in specs]

    def weak(value: Any) -> bool:
        return isinstance(value, jax.Array) and value.dtype.kind in "fi" and \
            bool(getattr(jax.typeof(value) if hasattr(jax, "typeof") else value.aval,
                         "weak_type", False))

    if not any(weak(v) for _, v in given):
        return {}
    floats = {np.dtype(jax.dtypes.canonicalize_dtype(v.dtype)) for _, v in given
              if isinstance(v, (np.ndarray, jax.Array)) and np.dtype(v.dtype).kind == "f"
              and not weak(v)}
    number = np.float32 if floats == {np.dtype(np.float32)} else np.float64
    annotated = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}
    dtypes: dict[int, np.dtype] = {}
    for name, value in given:
        spec = specs.get(name)
        if spec is None or not weak(value):
            continue
        dtype = annotated.get(spec.dtype)
        if dtype is not None and np.dtype(dtype).kind == "i" and value.dtype.kind != "i":
            dtype = None  # (a float for an integer: binding refuses it as it is)
        if dtype is None and spec.dtype in (None, "float") and (
                value.dtype.kind == "f" or spec.differentiable):
            dtype = number
        if dtype is not None and value.dtype != dtype:
            dtypes[id(value)] = np.dtype(dtype)
    return dtypes
