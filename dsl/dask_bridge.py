"""Compiled functions called with Dask arrays: lazy, block by block.

Contract: `call_on_dask(f, args, kwargs)` (what a compiled function's call
does when a Dask array is among its arguments) returns f's results as Dask
arrays, computing nothing.  The *batch* arguments are the Dask arrays
chunked along axis 0 (or, if none is, the first Dask array with an axis
over whose rows f splits, in one block: any computes the same; a call
whose Dask arrays are all 0-d is an `ArgumentError`) and every
other Dask array with as many rows, n: their axis 0 is the batch, their
row blocks are made the same as the first's, their other axes one chunk
each.  Every other argument (NumPy, or a Dask array of another length, a
parameter vector) goes to every block.  An elementwise function (all its
batch arguments of one shape) keeps the first's chunks, along every axis.
The compiler splits f over the rows (`compiler.batching.split_rows`, which
raises `GradError` naming the op that mixes rows, with a note where f is
the derivative of a function that splits on its own): each block runs the
compiled row-wise part, a program of its own; its partials (sums and
maxima over the batch, parameter gradients among them) are combined
pairwise in a tree and then finished once (`combine`, small: run by the
IR's NumPy interpreter).  Row-wise
results are Dask arrays with the batch's row blocks; the others have one
block.  A row block holding other rows than its array's chunks say (a
wrong shape given to `da.from_delayed`) is an `ArgumentError` when its
task runs.  What a block's task carries is the block's rows, the arguments
sent to every block and the block function's IR, compiled once per
process (a worker's own, served from its kernel cache), never a pickled
program; dask is imported only when Dask arrays are passed.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gradlang.compiler.batching import BATCH, REDUCED_ROW_BY_ROW, split_rows, with_sizes
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import print_function
from gradlang.compiler.pipeline import build, optimize
from gradlang.compiler.shapes import NeedsConcrete, NeedsValue, Sym, evaluate
from gradlang.runtime.args import NUMPY, SUPPORTED, is_dask_array, numeric_array
from gradlang.runtime.boundary import leaving
from gradlang.runtime.errors import ArgumentError, GradError, called
from gradlang.runtime.pullback import OutType, host_cotangent, output_cotangents
from dsl.lru import held_by

if TYPE_CHECKING:
    from dsl.function import Compiled


def chunked_like(value: Any, like: Any, own_dtype: bool = False) -> Any:
    """value (an in-memory array, number or sequence) as a Dask array of
    like's chunks and like's dtype (a tangent or vector split as the
    argument it goes with), or its own (`own_dtype`: an argument split as
    its tangent or vector, which binding converts as any argument; in
    like's, an f64 argument with an f32 tangent computed in f32); value
    itself where it is not an array of like's shape, for binding to say
    what is wrong."""
    import dask.array as da
    try:
        array = np.asarray(value) if own_dtype else np.asarray(value, like.dtype)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 (binding says what is wrong with it)
        # ragged, not numbers, or holding a torch tensor that requires grad
        # (whose RuntimeError leaked from here)
        return value
    if array.shape != like.shape:
        return value
    return da.from_array(array, chunks=like.chunks)


def placeholder(shape: tuple, dtype) -> np.ndarray:
    """An array of this shape and dtype that owns no memory of its size
    (every element is one zero), for checking and keying a call on values
    that are not NumPy arrays (Dask's, JAX's tracers)."""
    return np.lib.stride_tricks.as_strided(np.zeros((), dtype), shape, (0,) * len(shape))


class DaskBound:
    """A call's arguments bound with placeholders (of the shapes and
    dtypes, owning no memory) for its Dask arrays; `whole`: the names of
    those that go whole to every block whatever their rows (a cotangent
    of a result that is not row by row)."""

    def __init__(self, f: Compiled, args, kwargs):
        stand_ins: dict[int, Any] = {}
        # (a Dask array that cannot be bound is refused as binding refuses an
        # argument: named, at the function's definition)
        names = {k: f.specs[i].name for k, i in enumerate(f.by_position(list(args)))
                 if i < len(f.specs)}
        self.values = f.bind(
            [self._placeholder(a, stand_ins, _argument(f, names.get(k, k)))
             for k, a in enumerate(args)],
            {k: self._placeholder(v, stand_ins, _argument(f, k)) for k, v in kwargs.items()})
        self.dask = {n: stand_ins[id(a)] for n, a in self.values.items() if id(a) in stand_ins}
        self.whole: set[str] = set()
        # a const integer or bool scalar's value picks the program, and the
        # stand-in's is 0, not the array's; a const array (labels) is data,
        # split over the rows as any argument
        for spec in f.specs:
            if spec.name in self.dask and spec.name in f.static_names(self.values):
                raise _value_refusal(f, spec.name, "is `const`" if spec.const else "gives a size")

    @staticmethod
    def placeholder(value, where: tuple = ("a value", None)) -> Any:
        """A Dask array's stand-in (its shape and dtype, no memory); `where`
        (what the value is, the span of an error) as `_placeholder` takes it."""
        return DaskBound._placeholder(value, {}, where)

    @staticmethod
    def _placeholder(value, stand_ins: dict, where: tuple = ("a value", None)):
        """The stand-in of `value` if it is a Dask array (kept in
        `stand_ins` by its id), else `value`; an `ArgumentError` for a Dask
        array that cannot be bound, saying what it is and where (`where`:
        `_argument`'s (text, span))."""
        if not is_dask_array(value):
            return value
        what, span = where
        if any(np.isnan(d) for d in value.shape):
            raise ArgumentError(f"{what} is a Dask array of unknown chunk sizes (shape "
                                f"{value.shape}, from a boolean mask or the like), which cannot "
                                "be bound to a signature; call its compute_chunk_sizes() first",
                                span)
        if isinstance(getattr(value, "_meta", None), np.ma.MaskedArray):
            raise ArgumentError(f"{what} is a masked Dask array (shape {list(value.shape)}), "
                                "which cannot be bound: its mask would be ignored; pass "
                                "da.ma.filled(a, value) or da.ma.getdata(a)", span)
        # native byte order, as binding makes an in-memory array (binding would
        # convert the stand-in, which would then stand for no Dask array)
        if not value.dtype.isnative:
            value = value.astype(value.dtype.newbyteorder("="))
        stand_in = placeholder(value.shape, value.dtype)
        stand_ins[id(stand_in)] = value
        return stand_in

    def copy(self) -> "DaskBound":
        twin = object.__new__(DaskBound)
        twin.values, twin.dask, twin.whole = dict(self.values), dict(self.dask), set(self.whole)
        return twin

    def add(self, name: str, value, whole: bool = False) -> None:
        stand_ins: dict[int, Any] = {}
        self.values[name] = self._placeholder(value, stand_ins)
        if stand_ins:
            self.dask[name] = value
            if whole:
                self.whole.add(name)


def _value_refusal(f: Compiled, name: str, why: str) -> ArgumentError:
    """The `ArgumentError` of a Dask array for an argument whose value the
    program is compiled for (`why`: a `const`, one that gives a size),
    which its stand-in's 0 would silently stand for."""
    return ArgumentError(f"argument {name!r} of {called(f.name)} {why}: its value is needed to "
                        "compile the call, and a Dask array's is not known until computed; "
                        "pass it computed (.compute())", f.span)


def _argument(f: Compiled, name: Any) -> tuple[str, Any]:
    """(how an error names f's argument `name` (a parameter's name, or
    the position of an extra one), f's definition): an `ArgumentError`'s
    place, as binding gives it."""
    if isinstance(name, int):
        return f"argument {name} of {called(f.name)}", f.span
    return f.what_is(name), f.span


def call_on_dask(f: Compiled, args, kwargs):
    return f.format(run_on_dask(f, DaskBound(f, args, kwargs)))


def vjp_on_dask(f: Compiled, args, kwargs, backward_function: Callable):
    """(outputs, pullback) as `dsl.vjp` gives them, on Dask arrays: the
    pullback runs f's backward pass as a function of its own
    (`backward_function(f, n_outputs)`), block by block, on the arguments
    and the cotangents, which it takes as the in-memory one does or as
    Dask arrays (`_cotangent`): a row-wise output's split as its rows, any
    other's whole to every block."""
    bound = DaskBound(f, args, kwargs)
    outs = run_on_dask(f, bound)
    batch_rows, _, _, plan = _layout(f, bound)
    by_rows, n = plan.split.row_outputs, sum(batch_rows)

    def pullback(*cts):
        try:
            return pulled_back(cts)
        except GradError as err:
            raise leaving(err, f)  # (at f's definition, with its source)

    def pulled_back(cts: tuple) -> tuple:
        backward = backward_function(f, len(outs))
        cts = output_cotangents(f.name, cts, len(outs))
        with_cts = bound.copy()
        for k, (name, ct, out, rows) in enumerate(zip(backward.ct_names, cts, outs, by_rows)):
            where = f"cotangent {k} of the pullback of {called(f.name)}"
            if rows and out.shape[0] != n:  # (its cotangent's blocks would not be the batch's)
                raise ArgumentError(f"{where}: output {k} has {out.shape[0]} rows, the batch's "
                                    f"{n} merged with the axis after them (a reshape); on "
                                    "Dask arrays a pullback takes cotangents of outputs whose "
                                    "axis 0 is the batch's: reshape the output back",
                                    f.span)
            with_cts.add(name, _cotangent(where, ct, out, rows), whole=not rows)
        grads = iter(run_on_dask(backward, with_cts))
        floats = set(f.differentiable_names(bound.values))
        return tuple(next(grads) if n in floats else None for n in bound.values)

    return f.format(outs), pullback


def _cotangent(where: str, ct: Any, out: Any, rows: bool) -> Any:
    """The cotangent `ct` of the Dask result `out`, as the in-memory
    pullback takes one (`host_cotangent`: of out's shape and dtype, or a
    scalar for every element), or a Dask array of out's shape (or 0-d):
    of out's dtype, and a Dask array chunked as out where out's rows are
    the batch's (`rows`; else one that goes whole to every block)."""
    import dask.array as da
    if is_dask_array(ct):
        numeric_array(where, np.zeros((), ct.dtype))  # complex, text: refused as in memory
        if ct.shape != out.shape and ct.ndim:
            raise ArgumentError(f"{where} has shape {list(ct.shape)}; the output has shape "
                                f"{list(out.shape)}")
        ct = ct.astype(out.dtype)
        return ct if ct.shape == out.shape else da.broadcast_to(ct, out.shape, out.chunks)
    array = host_cotangent(where, ct, OutType(out.shape, SUPPORTED[out.dtype]))
    if not rows:
        return np.broadcast_to(array, out.shape)
    if array.ndim < out.ndim:  # a scalar: made block by block, never whole in memory
        return da.full(out.shape, array, dtype=out.dtype, chunks=out.chunks)
    return chunked_like(array, out)


def _layout(f: Compiled, bound: DaskBound) -> tuple:
    """How f runs on these arguments: the batch's row blocks, its Dask
    arguments as row blocks (name -> array), the Dask arguments that go
    whole to every block, and the `_Plan`."""
    arrays = bound.dask
    rowed = [n for n in arrays if n not in bound.whole]
    chunked = [n for n in rowed if arrays[n].ndim and arrays[n].numblocks[0] > 1]
    if chunked:
        return _layout_with(f, bound, arrays[chunked[0]], chunked)
    with_rows = [n for n in rowed if arrays[n].ndim]
    if not with_rows:  # (a 0-d one: `_layout_with` says it has no rows)
        return _layout_with(f, bound, arrays[rowed[0]], chunked)
    # None is split along its rows, so whichever array gives the rows, they
    # are one block, and any split of f computes the same: the first array
    # (by its number of rows) that f splits over.  (Only the first was
    # tried: `f(w, x)` of a weight vector w and a data matrix x, each one
    # chunk, took w's entries for the rows, and x @ w did not compile, where
    # `f(x, w)` ran.)
    refused: list[GradError] = []
    tried: set[int] = set()  # (numbers of rows: an array of rows tried gives the same split)
    for n in with_rows:
        if arrays[n].shape[0] in tried:
            continue
        tried.add(arrays[n].shape[0])
        try:
            return _layout_with(f, bound, arrays[n], chunked)
        except GradError as err:
            refused.append(err)
    raise refused[0]


def _layout_with(f: Compiled, bound: DaskBound, first: Any, chunked: list[str]) -> tuple:
    """`_layout` with the rows of Dask array `first` as the batch's
    (`chunked`: the Dask arguments chunked along axis 0)."""
    arrays = bound.dask
    if first.ndim == 0:  # (and so is every other)
        rowed = [n for n in arrays if n not in bound.whole]
        raise ArgumentError(f"{called(f.name)} on Dask arrays splits them by their rows (axis 0), "
                            f"and {rowed[0]!r} has none: pass a 0-d one computed (.compute())",
                            f.span)
    other = next((n for n in chunked if arrays[n].shape[0] != first.shape[0]), None)
    if other is not None:
        # (a weight vector chunked along axis 0 is no batch, and goes to every
        # block in one chunk along it: say how, for the shorter of the two)
        other = min((chunked[0], other), key=lambda n: arrays[n].shape[0])
        raise ArgumentError(f"{called(f.name)}: the Dask arguments chunked along axis 0 are "
                            "batches of rows and must have the same number of rows; got "
                            f"shapes {', '.join(str(list(x.shape)) for x in arrays.values())} "
                            f"(to pass {other!r} whole to every block, give it one chunk "
                            f"along axis 0: {other}.rechunk({{0: -1}}))", f.span)
    rows = first.chunks[0]
    batch = {n: x.rechunk((rows,) + tuple(-1 for _ in x.shape[1:]))
             for n, x in arrays.items()
             if x.ndim and x.shape[0] == first.shape[0] and n not in bound.whole}
    every = {n: x for n, x in arrays.items() if n not in batch}  # Dask, to every block
    return rows, batch, every, _plan(f, bound.values, frozenset(batch), frozenset(arrays),
                                     first.shape[0])


def run_on_dask(f: Compiled, bound: DaskBound) -> list:
    """f's raw outputs, as Dask arrays."""
    import dask
    import dask.array as da
    arrays = bound.dask
    rows, batch, every, plan = _layout(f, bound)
    bound = bound.values
    # What the tasks carry (a process scheduler pickles them): the block's
    # IR, the names, and the arguments that go to every block; not the
    # placeholders, which would pickle as whole arrays.
    names = tuple(bound)
    fixed = {n: a for n, a in bound.items() if n not in batch}
    runner, combine = plan.block, plan.split.combine
    if plan.split.elementwise and not every:
        return _elementwise(runner, names, fixed, arrays, plan)

    # (how a refusal names each row-block argument, and where: not f itself)
    labels, span = {n: f.what_is(n) for n in batch}, f.span

    def run_block(shared: dict, n_rows: int, *block_arrays):
        given = dict(zip(batch, block_arrays))
        _check_rows(given, n_rows, labels, span)
        values = {**fixed, **shared, **given}
        return runner(*(values[n] for n in names))

    def finish(shared: dict, parts):
        return tuple(interpret(combine, *(shared.get(n, a) for n, a in fixed.items()), *parts))

    n_rows = sum(plan.split.row_outputs)
    # A block of no rows adds nothing, and has no maximum to give: left out
    # (unless the batch is empty, whose results are those in memory).
    nonempty = [i for i, r in enumerate(rows) if r] or [0]
    blocks = [dask.delayed(run_block, nout=n_rows + len(plan.split.partial_kinds))(
        every, rows[i], *(x.blocks[i] for x in batch.values())) for i in nonempty]
    row_results = [da.concatenate([da.from_delayed(b[k], _block_shape(shape, rows[i]), dtype)
                                   for b, i in zip(blocks, nonempty)])
                   for k, (shape, dtype) in enumerate(plan.row_types)]
    other_results = []
    if plan.other_types:
        partials = _tree([[b[n_rows + j] for j in range(len(plan.split.partial_kinds))]
                          for b in blocks], plan.split.partial_kinds)
        done = dask.delayed(finish, nout=len(plan.other_types))(every, partials)
        other_results = [da.from_delayed(done[k], shape, dtype)
                         for k, (shape, dtype) in enumerate(plan.other_types)]
    row_iter, other_iter = iter(row_results), iter(other_results)
    return [next(row_iter) if r else next(other_iter) for r in plan.split.row_outputs]


def _check_rows(blocks: dict[str, Any], n_rows: int, labels: dict[str, str], span) -> None:
    """ArgumentError (naming the argument by `labels`, at `span`) unless
    each row block (name -> the array a task got) has the `n_rows` rows
    its Dask array's chunks say: one made by `da.from_delayed` or
    `map_blocks` with a wrong shape was summed as it came, while a mean
    divided by the rows the chunks say (a wrong value, silently, where
    Dask's own mean counts the rows it gets)."""
    for name, block in blocks.items():
        if np.ndim(block) and np.shape(block)[0] != n_rows:
            raise ArgumentError(f"a block of {labels[name]} has {np.shape(block)[0]} rows, but "
                                f"its Dask array's chunks say {n_rows}: the shape given to "
                                "da.from_delayed (or map_blocks' chunks) is not the block's",
                                span)


def _block_shape(shape: tuple, rows: int) -> tuple:
    """A row-wise result's shape in a block of `rows` rows (its axis 0 may
    hold a whole number of its elements per row: `compiler.batching`)."""
    return (evaluate(shape[0], {BATCH.factors[0]: rows}),) + shape[1:]


def _elementwise(runner: _Runner, names: tuple, fixed: dict, arrays: dict,
                 plan: "_Plan") -> list:
    """An elementwise function on blocks of any chunking, kept as they are
    (those of the first Dask argument): one task per block."""
    import dask
    import dask.array as da
    first = next(iter(arrays.values()))
    aligned = {n: x.rechunk(first.chunks) for n, x in arrays.items()}

    def run(*blocks):
        values = {**fixed, **dict(zip(aligned, blocks))}
        return runner(*(values[n] for n in names))

    tasks = {index: dask.delayed(run, nout=len(plan.row_types))(
        *(x.blocks[index] for x in aligned.values())) for index in np.ndindex(first.numblocks)}

    def grid(k: int, dtype, index: tuple = ()):  # nested lists of blocks, for da.block
        if len(index) == first.ndim:
            shape = tuple(first.chunks[d][i] for d, i in enumerate(index))
            return da.from_delayed(tasks[index][k], shape, dtype)
        return [grid(k, dtype, index + (i,)) for i in range(first.numblocks[len(index)])]

    return [da.block(grid(k, dtype)) for k, (_, dtype) in enumerate(plan.row_types)]


def _raise_own_error(f: Compiled, bound: dict) -> None:
    """Raise the GradError of f lowered for `bound` as it is, its Dask
    arrays whole: f's own error, which the call in memory gives too, and
    which splitting the rows only hid; nothing where it lowers (or needs
    an argument's value to know)."""
    try:
        f.lower_as(bound, {})
    except (NeedsConcrete, NeedsValue):
        pass


class _Plan:
    """A function's split over the rows for one signature and batch size,
    with its block program built."""

    def __init__(self, f: Compiled, bound: dict, batch: frozenset, dask: frozenset, n: int):
        shapes = {name: (BATCH,) + bound[name].shape[1:] for name in batch}
        refused: list[ArgumentError] = []  # (raised as it is, with no note on `batch`)

        def refuse(name: str) -> None:
            if name in batch:
                raise ArgumentError(f"argument {name!r} of {called(f.name)} gives a "
                                    "size, so it cannot be a Dask array", f.span)
            if name in dask:  # (one to every block: its stand-in's 0 was compiled for)
                refused.append(_value_refusal(f, name, "gives a size"))
                raise refused[-1]
        try:
            fn = f.retrying_by_value(bound, lambda: f.lower_as(bound, shapes), refuse)
        except NeedsConcrete as err:
            _raise_own_error(f, bound)
            # (the compiler's message names the rows' size by its symbol: say what it is)
            raise ArgumentError(f"{called(f.name)} on Dask arrays: {err}, where `batch` is the "
                                f"number of rows of {_listed(batch)}, which a block does not "
                                "know (it has some of them); call it on in-memory arrays",
                                err.at(f.span)) from None
        except GradError as err:
            if err in refused:
                raise
            _raise_own_error(f, bound)
            raise GradError(f"{err.message} (on Dask arrays, `batch` is the rows of "
                            f"{_listed(batch)}: arguments that are not "
                            "Dask arrays chunked the same go whole to every block)",
                            err.span, err.source, err.note) from None
        try:
            self.split = split_rows(fn, n, f.span)
        except GradError as err:
            _note_a_derivative(err, f, bound, batch, n)
            raise
        block = self.split.block
        if self.split.elementwise:  # sizes symbolic along every axis: blocks of any shape
            shape = bound[next(iter(batch))].shape
            every_axis = (BATCH,) + tuple(Sym.named(f"axis{i}") for i in range(1, len(shape)))
            # a count (a mean's) is still the whole array's, not a block's
            whole = {d.factors[0]: size for d, size in zip(every_axis, shape)}
            try:
                block = optimize(with_sizes(f.lower_as(bound, dict.fromkeys(batch, every_axis)),
                                            whole))
            except (NeedsConcrete, GradError):
                # a fixed size off the rows (an annotation's, `f64[n, 3]`; a reshape's,
                # `(x.shape[0] * 2, 2)`, in a function whose gradient is elementwise):
                # a block must hold whole rows, so blocks of rows, as for any function
                self.split = replace(self.split, elementwise=False)
        self.block = _Runner(block, f.target, tuple(f.error_sources()))
        self.block.program()  # compiled now, in this process
        n_rows = sum(self.split.row_outputs)
        self.row_types = [(t.shape, NUMPY[t.dtype]) for t in self.split.block.out_types[:n_rows]]
        self.other_types = [(t.shape, NUMPY[t.dtype]) for t in self.split.combine.out_types]


def _note_a_derivative(err: GradError, f: Compiled, bound: dict, batch: frozenset,
                       n: int) -> None:
    """A note on err (f does not split over the rows) where f is a
    derivative (`grad`, `vjp`, `jvp`, `hvp`) of a function that splits on
    its own: the message names an op of that function, and says "this
    function does not decompose", which its call on the same Dask arrays
    contradicts.  (The derivative reads back in every row a value reduced
    over all of them: `max(x)`'s, the count of a masked mean, `s` of
    `sum(s * s)`; one pass over the blocks has no such value yet.)"""
    primal = f.primal
    if primal is f:
        return
    own = {s.name for s in (*primal.specs, *primal.param_specs)}
    primal_bound = {k: v for k, v in bound.items() if k in own}
    primal_batch = batch & primal_bound.keys()
    if not primal_batch:
        return
    shapes = {k: (BATCH,) + primal_bound[k].shape[1:] for k in primal_batch}
    try:
        split_rows(primal.lower_as(primal_bound, shapes), n, primal.span)
    except (GradError, NeedsConcrete, NeedsValue):
        return  # (it does not split either: the message is about it)
    why = (" (it reads this value, reduced over every block's rows, back in each row, which "
           "one pass over the blocks cannot give it)" if REDUCED_ROW_BY_ROW in err.message else "")
    # (f is not named: `jacrev` and `hessian` run as a jvp on Dask, named so)
    err.add_note(f"{called(primal.name)} itself decomposes over the rows; its derivative "
                 f"does not{why}")


def _listed(names) -> str:
    """Argument names, quoted, in order, for a message."""
    return ", ".join(map(repr, sorted(names)))


_PROGRAMS: dict[str, Any] = {}  # per process: a block function's text -> its program


class _Runner:
    """A block function, as the tasks of a Dask graph carry it: its IR (and
    target), compiled once per process (the worker's own, with its kernel
    cache) on first use; never a compiled program or Numba dispatcher.
    An error a block raises (an index out of range) carries the caret line
    of `sources` ((file, text) pairs), as the in-memory call's does: it
    leaves through Dask, not through the call's boundary."""

    def __init__(self, fn, target, sources: tuple = ()):
        self.fn, self.target_name, self.sources = fn, target.name, sources
        self.key = f"{target.name}\n{print_function(fn)}"

    def program(self):
        program = _PROGRAMS.get(self.key)
        if program is None:
            program = _PROGRAMS[self.key] = build(self.fn, self.target_name)
        return program

    def __call__(self, *arrays) -> tuple:
        try:
            return tuple(self.program()(*arrays))
        except GradError as err:
            text = dict(self.sources).get(err.span.file)
            if err.source is None and text is not None:
                err.with_source(text)
            raise


ROW_PLANS = 64  # plans kept per function (one per shapes of its arguments' blocks)


def _plan(f: Compiled, bound: dict, batch: frozenset, dask: frozenset, n: int) -> _Plan:
    key = (tuple((name, a.dtype.str, a.shape, name in batch) for name, a in bound.items()),
           tuple((s, bound[s].item()) for s in sorted(f.static_names(bound))))
    cache = held_by(f, "_row_plans", ROW_PLANS)
    plan = cache.get(key)
    if plan is None:
        plan = cache[key] = _Plan(f, bound, batch, dask, n)
    return plan


_MERGE = {"sum": np.add, "max": np.maximum}


def _tree(parts: list, kinds: tuple[str, ...]):
    """The blocks' partials combined pairwise (depth log2 of the blocks)."""
    import dask

    def merge(a, b):
        return [_MERGE[k](x, y) for k, x, y in zip(kinds, a, b)]

    while len(parts) > 1:
        parts = [dask.delayed(merge)(parts[i], parts[i + 1]) if i + 1 < len(parts)
                 else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]
