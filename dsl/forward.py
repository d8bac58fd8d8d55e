"""Forward mode and Jacobians: `jvp`, `jacfwd`, `jacrev`, `hessian`.

Contract:
- `jvp(f, primals, tangents)` returns `(outputs, output_tangents)`, each
  shaped as f's outputs (as `jax.jvp` does).  `primals` are f's positional
  arguments; `tangents` holds one tangent per primal (None: no tangent),
  or is a dict from argument names or module `param` names to tangents
  (the way to give a param a tangent; the others get none).  A tangent has
  its primal's shape and dtype (a Python number or sequence takes the
  primal's dtype); the tangent of a `const` or non-float argument must be
  None or zero (or JAX's `float0`, of its shape).  Anything else raises
  `ArgumentError` before a kernel runs.
  The program is `compiler.forward.jvp`'s: through grad blocks, it runs
  their transposition.
- `jacfwd(f, wrt)(*args)` and `jacrev(f, wrt)(*args)`: the Jacobian of
  each output with respect to each argument `wrt` names (positions or
  names, params included), of shape `out.shape + arg.shape`; a tuple
  `wrt` gives a tuple per output, and several outputs give one entry per
  output, structured as f structures its outputs.  `jacfwd` runs the jvp
  of every element of the argument at once, and `jacrev` the backward
  pass of every element of an output (`Stacked`, in blocks), or one at a
  time where the stacked values would meet an op with no rule for them
  (`compiler.vectorize`: a gather by a stacked index array) (pick jacfwd
  for few inputs, jacrev for few outputs).  jacfwd's Jacobian may be a
  transposed view.  A plain call (positional NumPy arrays, no tape) that
  ran in one block is remembered by its arguments' dtypes, shapes and
  strides: a later one runs the same programs on the same one-hot values
  with nothing bound or checked again (the suite's jacfwd at n = 100:
  0.0125 ms, where a call took 0.0527).
- `hessian(f, wrt)(*args)`: the Hessian of the sum of f's outputs,
  `jacfwd(grad(f, wrt), wrt)` (forward over reverse): shape
  `arg.shape + arg.shape`; for a tuple `wrt`, `H[i][j]` pairs wrt[i] with
  wrt[j].
- The Jacobians are assembled on the host and returned where f's results
  are: as the target's arrays (device arrays on "cuda"), or NumPy arrays
  where f's module was loaded with `host_results=True`.
- With Dask arrays, `jvp` is lazy, block by block, as a compiled call is
  (`dask_bridge`), and the Jacobians are lazy too: Dask arrays stacked
  from one such `jvp` per element of each `wrt` argument (given by
  position).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from dsl.dask_bridge import DaskBound, chunked_like, is_dask_array, run_on_dask
from dsl.function import (AsFunction, Compiled, FastPath, GradFunction, JvpFunction, Stacked,
                          Wrt, bind_at_defaults, derived, derived_if_made, eagerly, fast_key,
                          holding_nothing, jvp_function, resolve_wrt, results_like,
                          stacked_jvp_function, stacked_vjp_function, torch_compiling,
                          vjp_of_bound)
from dsl.jacobian_function import jacobian_function
from gradlang.runtime.args import MAX_RANK, SUPPORTED, cast, is_foreign_array, numeric_array
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.common import require_host_room
from gradlang.runtime.errors import ArgumentError, called, shown
from gradlang.runtime.recording import THREAD, recording_tapes
from gradlang.runtime.signatures import SignatureAttribute
from gradlang.runtime.target import is_device_array

Tangents = Union[Sequence[Any], Mapping[str, Any]]


def jvp(f: Compiled, primals: Sequence[Any], tangents: Tangents):
    plain = _plain_call(primals, tangents)
    if plain is not None:  # the fast path of a call like one made before
        run = _known_jvp(f, len(primals)).get(fast_key(plain))
        if run is not None:
            return run(*plain)
    if not isinstance(primals, (tuple, list)):
        raise ArgumentError(f"jvp() takes the primals of {called(f.name)} as a tuple, got "
                            f"{type(primals).__name__}", f.span)
    given = _tangents_by_name(f, primals, tangents)
    if any(map(is_dask_array, (*primals, *given.values()))):
        jf, outs = _jvp_on_dask(f, tuple(primals), given)
        return jf.format(outs)
    bound = f.bind(tuple(primals), {})
    chosen: dict[str, Any] = {}
    for name, t in given.items():
        if name not in bound:
            raise _no_such_primal(f, name)
        tangent = _tangent(f, name, bound[name], t)
        if tangent is not None:
            chosen[name] = tangent
    active = [n for n in bound if n in chosen]
    jf = jvp_function(f, active)
    # (arrays only: `_known_jvp` keys by `fast_key`, so an entry taking
    # Python floats would never be found, and would crowd out others)
    outs = _run(jf, {**bound, **dict(zip(jf.tangent_names, (chosen[n] for n in active)))},
                args=plain if plain and fast_key(plain) is not None else ())
    return jf.format(outs)


def _no_such_primal(f: Compiled, name: str) -> ArgumentError:
    if any(spec.name == name for spec in f.specs):  # one with a default
        return ArgumentError(f"jvp() got a tangent for {name!r}, an argument of {called(f.name)} "
                             "that was not passed: pass its value among the primals", f.span)
    return ArgumentError(f"jvp() got a tangent for {name!r}, which {called(f.name)} neither takes "
                         "as an argument nor reads as a param", f.span)


def _plain_call(primals: Any, tangents: Any) -> Optional[tuple]:
    """The primals then the tangents, for the fast path, when both are
    given as sequences of one length and no `dsl.Tape` records on this
    thread.  (Unequal lengths are the slow path's error: joined, `(x, y,
    tx), (ty,)` would be the key of `(x, y), (tx, ty)`.)"""
    if type(primals) in (tuple, list) and type(tangents) in (tuple, list) and \
            len(primals) == len(tangents) and not THREAD.tapes:
        return (*primals, *tangents)
    return None


def _known_jvp(f: Compiled, count: int) -> dict:
    """The fast path's entries of f's jvp along its first `count`
    arguments: where each primal has an array tangent of its own dtype and
    shape, the slow path took the call as `jf(*primals, *tangents)`, and
    `FastPath.remember` kept its program under those arrays' key (which
    fixes everything the slow path checked)."""
    jf = derived_if_made(f, ("jvp", tuple(s.name for s in f.specs[:count])))
    return jf._fast.entries if jf is not None else {}


def _jvp_on_dask(f: Compiled, primals: tuple, given: dict[str, Any]
                 ) -> tuple[JvpFunction, list]:
    """`jvp` with Dask arrays among the primals or tangents: the jvp function
    and its raw outputs, lazy, block by block (`dask_bridge.run_on_dask`).
    A primal and its tangent are split alike: where one is a Dask array, the
    other becomes one with its chunks (a primal in its own dtype)."""
    primals = list(primals)
    names = {k: f.specs[i].name for k, i in enumerate(f.by_position(primals))
             if i < len(f.specs)}  # (as binding places them: hvp's v after f's own)
    for k, p in enumerate(primals):
        t = given.get(names.get(k))
        if is_dask_array(t) and not is_dask_array(p):
            primals[k] = chunked_like(p, t, own_dtype=True)
    bound = DaskBound(f, tuple(primals), {})
    chosen: dict[str, Any] = {}
    for name, t in given.items():
        if name not in bound.values:
            raise _no_such_primal(f, name)
        primal = bound.dask.get(name)
        if t is not None and not is_dask_array(t) and primal is not None:
            t = chunked_like(_tangent(f, name, bound.values[name], t), primal)
        if is_dask_array(t):
            if name not in f.differentiable_names({name: _host_like(bound.values[name])}):
                raise ArgumentError(f"the tangent for {name!r} of {called(f.name)} must be None: "
                                    f"{name!r} is const or not a float", f.span)
            _tangent(f, name, bound.values[name], DaskBound.placeholder(  # shape, dtype
                t, (f"the tangent for {f.label(name)} of {called(f.name)}", f.span)))
            chosen[name] = t
        else:
            tangent = _tangent(f, name, bound.values[name], t)
            if tangent is not None:
                chosen[name] = tangent
    jf = jvp_function(f, [n for n in bound.values if n in chosen])
    for tangent_name, name in zip(jf.tangent_names, jf.active):
        bound.add(tangent_name, chosen[name])
    return jf, run_on_dask(jf, bound)


def _run(f: Compiled, bound: dict[str, Any], host: bool = False, args: tuple = ()) -> tuple:
    """f's raw outputs; on the host when `host` or f's results go there.
    `args`: the positional arguments `bound` holds, for the fast path to
    remember the call (`Compiled.call_bound`)."""
    outs = f.call_bound(bound, args)
    return tuple(f.target.to_host(o) for o in outs) if host or f.host_results else tuple(outs)


def _tangents_by_name(f: Compiled, primals: Sequence[Any], tangents: Tangents
                      ) -> dict[str, Any]:
    if isinstance(tangents, Mapping):
        for name in tangents:
            if not isinstance(name, str):
                raise ArgumentError(f"jvp() tangents given as a dict are keyed by argument "
                                    f"or param names, got {shown(name)}", f.span)
        return {f.named(name): t for name, t in tangents.items()}
    if not isinstance(tangents, (tuple, list)):
        raise ArgumentError("jvp() takes the tangents as a tuple (one per primal) or a dict "
                            f"of names, got {type(tangents).__name__}", f.span)
    if len(tangents) != len(primals):
        raise ArgumentError(f"jvp() got {len(tangents)} tangent(s) for {len(primals)} "
                            f"primal(s) of {called(f.name)}; give one per primal (None: none)",
                            f.span)
    return f.by_name(tangents)  # (placed as the primals are: hvp's v after f's own)


def _tangent(f: Compiled, name: str, primal: Any, t: Any) -> Optional[Any]:
    """`t` checked against its primal: an array of the primal's shape and
    dtype, or None for no tangent (also for the zero tangent of a primal
    that carries none)."""
    where = f"the tangent for {f.label(name)} of {called(f.name)}"
    if t is None:
        return None
    carries = name in f.differentiable_names({name: _host_like(primal)})
    dtype, shape = np.dtype(primal.dtype), tuple(primal.shape)
    if _is_float0(t):  # JAX's zero tangent of an integer: as None, where it has the shape
        if carries:
            raise ArgumentError(f"{where} has dtype float0 (JAX's tangent of an integer or "
                                f"bool); its primal has dtype {SUPPORTED[dtype]}", f.span)
        if tuple(t.shape) != shape:
            raise ArgumentError(f"{where} has shape {list(t.shape)}; its primal has shape "
                                f"{list(shape)}", f.span)
        return None
    if f.target.is_array(t) and not isinstance(t, np.ndarray):
        # a device array, taken as it is (where the target can)
        array = f.accepted(t, where) if carries else f.target.to_host(t)
    else:
        # (a Python integer beyond 64 bits is a float tangent's value, as it
        # is a float argument's: 2**70 was "out of range")
        array = numeric_array(where, t, f.span, as_float=carries)
        if carries and not isinstance(t, (np.ndarray, np.generic)) and not is_foreign_array(t):
            array = cast(where, array, SUPPORTED[dtype], f.span)  # a Python number or sequence
    # (before the shape: a const's primal may be None, bound as a 0-d `NONE`)
    if not carries and np.any(array != 0):
        raise ArgumentError(f"{where} must be None or zero: {f.label(name)} is const or not a "
                            "float, so it carries no tangent", f.span)
    if tuple(array.shape) != shape:
        raise ArgumentError(f"{where} has shape {list(array.shape)}; its primal has shape "
                            f"{list(shape)}", f.span)
    if not carries:
        return None
    if np.dtype(array.dtype) != dtype:
        got = SUPPORTED.get(np.dtype(array.dtype), str(array.dtype))
        raise ArgumentError(f"{where} has dtype {got}; its primal has dtype "
                            f"{SUPPORTED[dtype]}", f.span)
    # a tape's result stays itself, as binding keeps an argument that is one
    # (`runtime.args`): the tape tracking it records the jvp, and one NumPy
    # derived is refused there; a plain copy would be a silent constant
    return t if getattr(t, "bind_as_is", False) else array


def _is_float0(t: Any) -> bool:
    """Whether t is an array of JAX's `float0` (`jax.dtypes.float0`, a
    void dtype of one field so named), which `jax.jvp` takes, and only
    takes, as the tangent of an integer or bool primal: a zero, holding no
    values."""
    dtype = getattr(t, "dtype", None)
    return isinstance(dtype, np.dtype) and dtype.names == ("float0",)


def _host_like(a: Any) -> np.ndarray:
    """An empty host array of a's dtype (what `differentiable_names` reads)."""
    return np.empty(0, np.dtype(a.dtype))


# ---------------------------------------------------------------- Jacobians


def _tangent_columns(x: Any, run, batched: bool = False) -> list:
    """For each element of x in flat order (of each example's x where
    `batched`: `_one_hots`), the output tangents of `run(basis)` (a jvp's
    outputs, then their tangents) for the one-hot tangent of x's shape and
    dtype there."""
    columns = []
    for i in range(_basis_size(x, batched)):
        (basis,) = _one_hots(x, i, i + 1, batched)
        outs = run(basis)
        columns.append(outs[len(outs) // 2:])
    return columns


def _assembled(columns: list, x: Any, stack, batched: bool = False) -> list:
    """Each output's Jacobian from its tangent columns (`stack`: NumPy's or
    Dask's), of shape output shape + x's shape (x's example shape where
    `batched`)."""
    return [stack([c[k] for c in columns], axis=-1).reshape(
        tuple(columns[0][k].shape) + _basis_shape(x, batched)) for k in range(len(columns[0]))]


# At most how many elements the values of one stacked program hold (32 MB
# of f64): a Jacobian's columns (or rows) beyond that many run in blocks.
STACKED_ELEMENTS = 2 ** 22


def _in_blocks(stacked: Stacked, bound: dict[str, Any], one: np.ndarray,
               batched: bool = False) -> Optional[list]:
    """stacked's outputs for each one-hot value shaped like `one` (the
    stacked argument's one value; `_one_hots`), in order, in blocks whose
    stacked values hold at most STACKED_ELEMENTS; None if stacked's
    function has an op that cannot take stacked values."""
    (name,) = stacked.stacked
    per_slice = stacked.per_slice({**bound, name: one})
    if per_slice is None:
        return None
    size = _basis_size(one, batched)
    block = _block_size(size, per_slice)
    return [_run(stacked, {**bound, name: _one_hots(one, i, min(i + block, size), batched)},
                 host=True) for i in range(0, size, block)]


def _block_size(size: int, per_slice: int) -> int:
    """How many of `size` one-hot values one stacked run takes, when each
    adds `per_slice` elements to its values."""
    return max(1, min(size, STACKED_ELEMENTS // max(per_slice, 1)))


def _all_columns(f: Compiled, name: str, bound: dict[str, Any], x: np.ndarray,
                 batched: bool) -> Optional[list[np.ndarray]]:
    """Each output's Jacobian with respect to `name` (x's value), from jvps
    of stacked one-hot tangents (`_in_blocks`); None where the jvp cannot
    stack them."""
    blocks = _in_blocks(stacked_jvp_function(f, name), bound, x, batched)
    if blocks is None:
        return None
    n_out = len(blocks[0]) // 2
    return [_from_columns(np.concatenate([b[n_out + k] for b in blocks]),
                          _basis_shape(x, batched), _jacobian_dtype(blocks[0][k], x))
            for k in range(n_out)]


def _one_block_program(stacked: Stacked, bound: dict[str, Any], extra: dict[str, Any],
                       one: Any) -> Optional[tuple[Any, tuple, tuple]]:
    """The program of `stacked` (of a jvp or a backward pass) for the
    arguments `bound` (given as they are), then `extra`, where its stacked
    argument (one of them) takes every one-hot value shaped like `one` in
    one block (`_in_blocks`), with those values and the extra ones as its
    fixed last arguments (the program, those values, and its outputs for
    `bound`, from the run that checks them); None where it
    takes them in blocks or not at all, where an argument's value picks
    the program (a static one, or an integer giving a size, which `stacked`
    may find where f does not), where it would copy them (a device target),
    or gives a result that is a view of one (which a caller could write
    into)."""
    (name,) = stacked.stacked
    per_slice = stacked.per_slice({**bound, **extra, name: one})
    size = _basis_size(one, False)
    if not size or per_slice is None or _block_size(size, per_slice) < size:
        return None
    fixed = {**extra, name: _one_hots(np.asarray(one), 0, size)}
    if stacked.static_names({**bound, **fixed}):
        return None  # an argument's value picks the program (`by_value`: a size)
    on_target = stacked.on_target({**bound, **fixed})
    if any(v is not a for v, a in zip(on_target.values(), (*bound.values(), *fixed.values()))):
        return None
    program = stacked.program(on_target)
    outs = tuple(program(*on_target.values()))
    if any(np.may_share_memory(o, a) for o in outs for a in fixed.values()):
        return None
    return program, tuple(fixed.values()), outs


def _from_columns(columns: np.ndarray, basis_shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The Jacobian whose columns (one per element of the basis, in flat
    order) `columns` stacks on its axis 0: that axis last, split into
    `basis_shape`, as a transposed view, not a copy."""
    last = columns.transpose((*range(1, columns.ndim), 0))
    return last.reshape(columns.shape[1:] + basis_shape).astype(dtype, copy=False)


def _basis_shape(x: Any, batched: bool) -> tuple:
    """The shape a Jacobian's basis spans: x's, or where `batched` that of
    each of the examples x stacks on its axis 0."""
    return tuple(x.shape[1:] if batched else x.shape)


def _basis_size(x: Any, batched: bool) -> int:
    return int(np.prod(_basis_shape(x, batched)))


def _one_hots(x: np.ndarray, start: int, stop: int, batched: bool = False) -> np.ndarray:
    """The tangents of x's shape and dtype that are 1 at one element (in
    flat order, from `start` to `stop`) and 0 elsewhere, stacked; where
    `batched`, 1 at that element of every example x stacks on axis 0."""
    shape = _basis_shape(x, batched)
    basis = np.zeros((stop - start, int(np.prod(shape))), x.dtype)
    basis[np.arange(stop - start), np.arange(start, stop)] = 1
    basis = basis.reshape((stop - start,) + shape)
    return np.repeat(basis[:, None], x.shape[0], axis=1) if batched else basis


def _column_runner(jf: JvpFunction, bound: dict[str, Any]):
    """run(basis): jf's outputs on the host, with `basis` as the tangent of
    its one active argument.  Every column has the same shapes and dtypes,
    so the first goes the whole way (it may learn an integer's value as a
    size, or be recorded on a tape) and, unless a tape records the call,
    the others run the program it found directly."""
    tangent = jf.tangent_names[0]
    direct = None

    def run(basis: np.ndarray) -> tuple:
        nonlocal direct
        if direct is not None:
            return direct(basis)
        outs = _run(jf, {**bound, tangent: basis}, host=True)
        on_target = jf.on_target({**bound, tangent: basis})
        if not recording_tapes(on_target.values()):
            direct = _direct_runner(jf, on_target, tangent)
        return outs

    return run


def _direct_runner(jf: JvpFunction, on_target: dict[str, Any], tangent: str):
    """run(basis): the outputs, on the host, of the program for `on_target`
    with `basis` in place of the tangent's value."""
    program, values = jf.program(on_target), list(on_target.values())
    slot, where = list(on_target).index(tangent), f"the tangent of {tangent!r}"

    def run(basis: np.ndarray) -> tuple:
        values[slot] = jf.target.accept(basis, where)
        return tuple(jf.target.to_host(o) for o in program(*values))

    return run


def refuse_out(name: str, kwargs: dict[str, Any], span) -> None:
    """Take `out=` from the keywords of a call of a Jacobian (`name`): the
    keyword gives result buffers on every callable (a parameter named `out`
    is passed by position), and a Jacobian, assembled on the host from
    blocks of columns, has no program to write into them, so buffers are
    an `ArgumentError` (None, no buffers, is taken as the other callables
    take it)."""
    if kwargs.pop("out", None) is not None:
        raise ArgumentError(f"{name} takes no out= buffers: its Jacobians are assembled on the "
                            "host from blocks of columns; copy them into yours (a parameter "
                            "named 'out' is passed by position)", span)


class Jacobian(AsFunction):
    """`jacfwd(f, wrt)` or `jacrev(f, wrt)` (`mode`: "fwd" or "rev").
    `batched`: f is a `vmap` mapping every argument `wrt` names, and the
    Jacobians are those of each example (`dsl.mapped.MappedJacobian`):
    each output's example with respect to each argument's, of shape (k,) +
    out example shape + arg example shape."""

    def __init__(self, f: Compiled, wrt: Wrt, mode: str, batched: bool = False,
                 name: Optional[str] = None):
        self.f, self.mode, self.batched = f, mode, batched
        self.single = not isinstance(wrt, (tuple, list))
        self.wrt = resolve_wrt(f, wrt)
        # (`name`: as the caller wrote it, where that is not jac{mode}(f):
        # `hessian(f)`, whose f is grad(f))
        self.name = name or f"jac{mode}({f.name})"
        # plain calls' runs by their arguments' `fast_key` (`_remember`),
        # kept on f: `dsl.jacfwd(f)(x)` makes a new Jacobian at each call
        self._known = derived(f, ("jacobian calls", self.wrt, self.single, mode, batched), dict)

    def error_sources(self) -> tuple[tuple[str, str], ...]:
        return self.f.error_sources()

    def __reduce__(self) -> tuple:  # (for pickle: f, and how it is taken)
        return Jacobian, (self.f, self.wrt[0] if self.single else self.wrt, self.mode,
                          self.batched, self.name)

    __signature__ = SignatureAttribute()

    def call_signature(self) -> Optional[inspect.Signature]:
        return self.f.call_signature()  # (it binds as f binds; out=None: `refuse_out`)

    @user_facing
    def __call__(self, /, *args, **kwargs):
        if torch_compiling():  # (see there)
            return eagerly(type(self).__call__, self, *args, **kwargs)
        if not kwargs and not THREAD.tapes:
            run = self._known.get(fast_key(args))
            if run is not None:
                return run(*args)
        refuse_out(self.name, kwargs, self.f.span)
        if any(map(is_dask_array, (*args, *kwargs.values()))):
            return self._on_dask(args, kwargs)
        bound = bind_at_defaults(self.f, args, kwargs, None, self.wrt)
        if recording_tapes(bound.values()):
            # assembled on the host, from blocks of columns, it would be NumPy
            # work on the tape's results, which the tape refuses to follow: as
            # one program, the call is recorded (and differentiated) whole
            self.require_wrt(bound)
            self._require_room(bound)
            return self.as_function()(*args, **kwargs)
        for name, value in bound.items():  # (refused as named here, not by a stacked program)
            if is_device_array(value):
                self.f.accepted(value, f"argument {self.f.label(name)} of {called(self.name)}")
        jacobians = self.call_bound(bound)
        if not kwargs and not self.batched:
            self._remember(args, bound)
        return jacobians

    def _remember(self, args: tuple, bound: dict[str, Any]) -> None:
        """Keep a plain call's Jacobians, for later calls with arrays of
        the same dtypes, shapes and strides (`fast_key`, which fixes every
        size the call depended on), as runs of the programs its stacked
        jvps (or backward passes) ran, on one-hot tangents (cotangents)
        made once: where the call ran each in one block and f took the
        arguments as given (no params, which may change between calls;
        nothing copied to a device; none static), and no Jacobian is a
        view of those fixed values."""
        key = fast_key(args)
        if key is None or self.f.static_names(bound) or len(bound) != len(args) or \
                any(b is not a for b, a in zip(bound.values(), args)):
            return
        run = (self._forward_run if self.mode == "fwd" else self._reverse_run)(args, bound)
        if run is not None:
            if len(self._known) >= FastPath.SIZE:
                self._known.clear()
            self._known[key] = run

    def _forward_run(self, args: tuple, bound: dict[str, Any]) -> Optional[Callable]:
        """`_remember`'s run in forward mode: per `wrt` argument, the
        stacked jvp on every one-hot tangent of it."""
        runs = []
        for name in self.wrt:
            x, stacked = bound[name], stacked_jvp_function(self.f, name)
            planned = _one_block_program(stacked, bound, {stacked.stacked[0]: x}, x)
            if planned is None:
                return None
            program, fixed, outs = planned
            runs.append((program, fixed, x.shape, [_jacobian_dtype(o, x)
                                                   for o in outs[:len(outs) // 2]]))
        single, arrange = self.single, self.f.format

        def run(*args):
            per_wrt = []
            for program, fixed, basis_shape, dtypes in runs:
                outs, n = program(*args, *fixed), len(dtypes)
                per_wrt.append([_from_columns(outs[n + k], basis_shape, dtypes[k])
                                for k in range(n)])
            return arrange([js[0] if single else js for js in zip(*per_wrt)])
        return run

    def _reverse_run(self, args: tuple, bound: dict[str, Any]) -> Optional[Callable]:
        """`_remember`'s run in reverse mode: per output, the stacked
        backward pass on every one-hot cotangent of it (zero for the
        others)."""
        floats, passes = self._backward_passes(bound)
        runs = []
        for out, sv, zeros in passes:
            planned = _one_block_program(sv, bound, zeros, out)
            if planned is None:
                return None
            runs.append((*planned[:2], [(floats.index(n), out.shape + bound[n].shape,
                                         _jacobian_dtype(out, bound[n])) for n in self.wrt]))
        single, arrange = self.single, self.f.format

        def run(*args):
            per_output = []
            for program, fixed, per_wrt in runs:
                grads = program(*args, *fixed)
                per_output.append([grads[i].reshape(shape).astype(dtype, copy=False)
                                   for i, shape, dtype in per_wrt])
            return arrange([js[0] if single else tuple(js) for js in per_output])
        return run

    def as_function(self) -> Compiled:
        """This Jacobian as a function of its own, for a transform to take
        (`grad`, `jvp`, a Jacobian of it, a bridge): `jacobian_function`."""
        return jacobian_function(self)

    def call_bound(self, bound: dict[str, Any]) -> Any:
        """The Jacobians for f's validated arguments, structured as f's
        outputs."""
        self.require_wrt(bound)
        self._require_room(bound)
        per_output = (self._forward(bound) if self.mode == "fwd" else self._reverse(bound))
        per_output = [[self._placed(j) for j in js] for js in per_output]
        return self.f.format([js[0] if self.single else tuple(js) for js in per_output])

    def results_like(self, bound: dict[str, Any]) -> Any:
        """The Jacobians for f's arguments like `bound`, structured as
        `call_bound` gives them, as arrays of their shapes and dtypes that
        hold no memory, from f's IR without running it (what a batch of no
        examples stacks: `MappedJacobian`)."""
        self.require_wrt(bound)
        per_output = [[holding_nothing(out.shape + _basis_shape(bound[n], self.batched),
                                       _jacobian_dtype(out, bound[n])) for n in self.wrt]
                      for out in results_like(self.f, bound)]
        return self.f.format([js[0] if self.single else tuple(js) for js in per_output])

    def _placed(self, jacobian: np.ndarray) -> Any:
        """`jacobian`, assembled on the host, where f's own results go: the
        target's arrays (a device's), or NumPy's with `host_results`."""
        if self.f.host_results or self.f.target.is_array(jacobian):
            return jacobian
        return self.f.target.accept(jacobian, f"{self.name}'s result")

    def require_wrt(self, bound: dict[str, Any]) -> None:
        """An `ArgumentError` unless f's arguments `bound` give every argument
        `wrt` names, a float (said of this Jacobian, also where a transform
        takes it as a function: `jacobian_function`)."""
        for name in self.wrt:
            if name not in bound:
                raise ArgumentError(f"{self.name}: no value was passed for {name!r}",
                                    self.f.span)
            self._require_float(name, bound[name])

    @property
    def span(self):
        return self.f.span

    def _require_room(self, bound: dict[str, Any]) -> None:
        """Refuse, before anything runs, a Jacobian larger than the host's
        memory (`jacfwd` of a function of a 10**6-vector has 10**12
        entries), or of more axes than an array has (the result's and the
        argument's: NumPy's ValueError as it was made): each is assembled
        there whole."""
        outs = results_like(self.f, bound)  # (by value where a size is an argument's)
        for k, out in enumerate(outs):
            for name in self.wrt:
                x = bound[name]
                what = (f"the Jacobian of {'its result' if len(outs) == 1 else f'result {k}'} "
                        f"with respect to {name!r}")  # (user text: a name, repr'd)
                shape = out.shape + _basis_shape(x, self.batched)
                if len(shape) > MAX_RANK:
                    raise ArgumentError(f"{self.name}: {what} would have {len(shape)} axes (the "
                                        f"result's and then the argument's), but an array has at "
                                        f"most {MAX_RANK}", self.f.span)
                require_host_room(shape, _jacobian_dtype(out, x), what, self.f.span)

    def _require_float(self, name: str, x: Any) -> None:
        require_float(self.name, name, x, self.f.span)

    def _forward(self, bound: dict[str, Any]) -> list[list[np.ndarray]]:
        """[output][wrt] Jacobians: all columns by stacked jvps, else one jvp
        per element of each argument."""
        per_wrt = []
        for name in self.wrt:
            x = bound[name]
            if not isinstance(x, np.ndarray):  # a device array passed in
                x = self.f.target.to_host(x)
            batched = self.batched
            if not x.size:  # an empty argument (or batch): the outputs give the shapes
                # (a batch of none has columns all the same: none run)
                outs = _run(self.f, dict(bound), host=True)
                per_wrt.append([np.zeros(o.shape + _basis_shape(x, batched),
                                         _jacobian_dtype(o, x)) for o in outs])
                continue
            jacobians = _all_columns(self.f, name, bound, x, batched)
            if jacobians is not None:
                per_wrt.append(jacobians)
                continue
            columns = _tangent_columns(x, _column_runner(jvp_function(self.f, [name]), bound),
                                       batched)
            per_wrt.append([j.astype(_jacobian_dtype(c, x)) for j, c in
                            zip(_assembled(columns, x, np.stack, batched), columns[0])])
        return [list(js) for js in zip(*per_wrt)]

    def _on_dask(self, args: tuple, kwargs: dict):
        """Jacobians with Dask arguments, lazy: one `jvp` on Dask per element
        of each `wrt` argument, stacked (in both modes: the values are the
        same, and a Dask jvp needs no pullback's cotangents split by rows)."""
        import dask.array as da
        names = [spec.name for spec in self.f.specs]
        if kwargs or any(n not in names[:len(args)] for n in self.wrt):
            raise ArgumentError(f"{self.name} on Dask arrays takes its arguments by "
                                "position, and differentiates with respect to them only "
                                "(not params)", self.f.span)
        # (a Python number or list as binding converts it: its dtype, weakly typed)
        values = DaskBound(self.f, args, {}).values
        per_wrt = []
        for name in self.wrt:
            x = args[names.index(name)]
            if not is_dask_array(x):
                x = values[name]
            self._require_float(name, x)
            columns = _tangent_columns(
                x, lambda basis: _jvp_on_dask(self.f, args, {name: basis})[1])
            if not columns:  # an empty argument: the outputs give the shapes
                raw = _jvp_on_dask(self.f, args, {})[1]  # (f's outputs, then tangents)
                per_wrt.append([da.zeros(tuple(o.shape) + tuple(x.shape),
                                         _jacobian_dtype(o, x))
                                for o in raw[:len(raw) // 2]])
                continue
            # (an integer or bool output's zero tangents: its Jacobian has x's dtype)
            per_wrt.append([j.astype(_jacobian_dtype(c, x)) for j, c in
                            zip(_assembled(columns, x, da.stack), columns[0])])
        per_output = [list(js) for js in zip(*per_wrt)]
        return self.f.format([js[0] if self.single else tuple(js) for js in per_output])

    def _reverse(self, bound: dict[str, Any]) -> list[list[np.ndarray]]:
        """[output][wrt] Jacobians: all rows by stacked pullbacks, else one
        pullback per element of each output."""
        stacked = self._all_rows(bound)
        if stacked is not None:
            return stacked
        outs, pullback = vjp_of_bound(self.f, bound, host_results=True)
        outs = [self.f.target.to_host(o) for o in outs]
        names = list(bound)
        result = []
        for k, out in enumerate(outs):
            rows = []
            for j in range(_basis_size(out, self.batched)):
                cts = [np.zeros(o.shape, o.dtype) for o in outs]
                (cts[k],) = _one_hots(out, j, j + 1, self.batched)
                grads = pullback(*cts)
                rows.append([grads[names.index(n)][None] for n in self.wrt])
            result.append([self._rows([r[w] for r in rows], out, bound[n])
                           for w, n in enumerate(self.wrt)])
        return result

    def _rows(self, rows: list, out: Any, x: Any) -> np.ndarray:
        """The Jacobian of `out` with respect to `x` from its rows in blocks
        (each of shape (rows, *x.shape)), one row per element of out in
        flat order (of each example of out where `batched`)."""
        shape, dtype = tuple(out.shape) + _basis_shape(x, self.batched), _jacobian_dtype(out, x)
        if not rows:
            return np.zeros(shape, dtype)
        jacobian = np.concatenate(rows)
        if self.batched:  # the examples' axis first
            jacobian = np.moveaxis(jacobian, 0, 1)
        return jacobian.reshape(shape).astype(dtype, copy=False)

    def _backward_passes(self, bound: dict[str, Any]) -> tuple[list[str], list[tuple]]:
        """The names of f's float arguments in `bound`, and for each of f's
        outputs there (f run once, on the host): the output, the stacked
        backward pass of its cotangent, and zero cotangents of every output."""
        outs = _run(self.f, bound, host=True)
        passes = []
        for k, out in enumerate(outs):
            sv = stacked_vjp_function(self.f, len(outs), k)
            passes.append((out, sv, {c: np.zeros(o.shape, o.dtype)
                                     for c, o in zip(sv.inner.ct_names, outs)}))
        return self.f.differentiable_names(bound), passes

    def _all_rows(self, bound: dict[str, Any]) -> Optional[list[list[np.ndarray]]]:
        """[output][wrt] Jacobians, each output's from backward passes of
        its stacked one-hot cotangents (`_in_blocks`); None where the
        backward pass cannot stack them."""
        floats, passes = self._backward_passes(bound)
        result = []
        for out, sv, zeros in passes:
            blocks = (_in_blocks(sv, {**bound, **zeros}, np.asarray(out), self.batched)
                      if out.size else [])
            if blocks is None:
                return None
            result.append([self._rows([b[floats.index(n)] for b in blocks], out, bound[n])
                           for n in self.wrt])
        return result


def require_float(jacobian: str, name: str, x: Any, span) -> None:
    """An `ArgumentError` (of the Jacobian the caller named `jacobian`)
    unless x, the argument `name` it is taken with respect to, is a
    float."""
    dtype = np.dtype(x.dtype)
    if dtype.kind != "f":
        raise ArgumentError(f"{jacobian}: cannot differentiate with respect to "
                            f"{name!r}: it has dtype {SUPPORTED.get(dtype, str(dtype))}", span)


def _jacobian_dtype(out: Any, x: Any) -> np.dtype:
    """A float output's Jacobian has its dtype; an integer or bool output's
    (zero: a pullback gives it x's dtype) has x's, in both modes."""
    return np.dtype(out.dtype) if np.dtype(out.dtype).kind == "f" else np.dtype(x.dtype)


def jacfwd(f: Compiled, wrt: Wrt = 0) -> Jacobian:
    return _jacobian(f, wrt, "fwd")


def jacrev(f: Compiled, wrt: Wrt = 0) -> Jacobian:
    return _jacobian(f, wrt, "rev")


def hessian(gradient: GradFunction, wrt: Wrt = 0) -> Jacobian:
    """`gradient`: grad(f, wrt), shared with `dsl.grad`'s programs; the
    Jacobian is named `hessian(f)`, as the caller wrote it (its errors
    said jacfwd(grad(f)))."""
    return _jacobian(gradient, wrt, "fwd", f"hessian({gradient.inner.name})")


def _jacobian(f: Compiled, wrt: Wrt, mode: str, name: Optional[str] = None) -> Jacobian:
    """f's Jacobian in `mode`, made once per `wrt` and kept on f, as
    `dsl.grad`'s functions are (`derived`): `dsl.jacfwd(f)(x)` at every
    call made and checked a new one (2.3 of the suite's 15.6 us at n =
    100).  A position or name as given is the key (an exact int: a bool
    or a NumPy integer goes through `resolve_wrt`, which refuses or
    converts it), else the names it resolves to."""
    if type(wrt) in (int, str):
        return derived(f, ("jacobian", mode, wrt, name),
                       lambda: Jacobian(f, wrt, mode, name=name))
    names, single = resolve_wrt(f, wrt), not isinstance(wrt, (tuple, list))
    return derived(f, ("jacobian", mode, names, single, name),
                   lambda: Jacobian(f, wrt, mode, name=name))
