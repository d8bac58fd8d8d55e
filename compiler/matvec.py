"""Matrix-vector products: a product summed against a vector runs as BLAS's.

Contract: `as_matvecs(fn)` returns fn with each `reduce_sum(a * v)` over
trailing axes, where `a` has the product's shape and `v` is the same
vector for every row (its shape those trailing axes, size-1 axes before
them allowed), written as a `matmul` of `a` viewed as (rows, row length)
by `v` viewed as a column, reshaped to the sum's shape: what `x @ w` is
(`sum(x * w, axis=1)` in a vmap'd loss, and its tangent `sum(tx * w,
axis=1)` in the jvp).  Only f64 products that nothing else reads (BLAS
sums f32 in f32, where a loop's sum adds in f64), and only where no
other elementwise value of `a` is summed over the same rows (`sum(a * a,
axis=1)`: a fused loop then reads `a` once for both sums, where a product
and a loop would read it twice; `sum(a, axis=1)` itself is no loop's, and
does not count).

Why: on the CPU a loop summing short rows ran at half the memory's speed
(64-element rows of f64: 4.4 ms single-threaded for the two row sums of
the jvp above, where streaming both arrays took 2.2 and OpenBLAS's two
matrix-vector products 4.0; 2.5 ms on two threads against OpenBLAS's
1.6), and a parallel loop met NumPy's spinning BLAS threads where BLAS
meets its own (see docs/internals.md, "Fusion and codegen").  The CPU
target runs it (`fusion.fuse` with `reductions`); on CUDA the sum stays a
loop and a reduction.  The sum's bits change to BLAS's, as every `matmul`
has them.
"""
from __future__ import annotations

from gradlang.compiler.builder import Builder
from gradlang.compiler.ir import Eqn, Function, Var, readers
from gradlang.compiler.shapes import prod


def as_matvecs(fn: Function) -> Function:
    producer = {o: e for e in fn.eqns for o in e.outputs}
    readers_of = readers(fn.eqns)
    returned = {a for a in fn.outputs if isinstance(a, Var)}
    rewrites: dict[int, tuple[Var, Var]] = {}  # id of a sum -> (matrix, vector)
    for eqn in fn.eqns:
        operands = _matvec(eqn, producer, readers_of, returned)
        if operands is not None:
            rewrites[id(eqn)] = operands
    if not rewrites:
        return fn
    products = {id(producer[e.inputs[0]]) for e in fn.eqns if id(e) in rewrites}
    b = Builder()
    columns: dict[Var, Var] = {}  # a vector -> its column, made once
    for eqn in fn.eqns:
        if id(eqn) in products:
            continue
        if id(eqn) not in rewrites:
            b.eqns.append(eqn)
            continue
        matrix, vector = rewrites[id(eqn)]
        (out,) = eqn.outputs
        k = len(eqn.p["axes"])
        rows, length = prod(matrix.type.shape[:-k]), prod(matrix.type.shape[-k:])
        if matrix.type.shape != (rows, length):
            matrix = b.bind("reshape", matrix, shape=(rows, length), span=eqn.span)
        if vector not in columns:
            columns[vector] = b.bind("reshape", vector, shape=(length, 1), span=eqn.span)
        product = b.bind("matmul", matrix, columns[vector], span=eqn.span)
        b.eqns.append(Eqn("reshape", (product,), (out,), (("shape", out.type.shape),),
                          eqn.span))
    return b.function(fn.name, fn.params, fn.outputs)


def _matvec(eqn: Eqn, producer: dict, readers: dict, returned: set
            ) -> tuple[Var, Var] | None:
    """(matrix, vector) where `eqn` is a sum `as_matvecs` rewrites, else None."""
    if eqn.op != "reduce_sum" or not isinstance(eqn.inputs[0], Var):
        return None
    (p,) = eqn.inputs
    axes, rank = tuple(eqn.p["axes"]), p.type.rank
    mul = producer.get(p)
    if (mul is None or mul.op != "mul" or p.type.dtype != "f64" or p in returned
            or len(readers[p]) != 1 or not 0 < len(axes) < rank
            or axes != tuple(range(rank - len(axes), rank))):
        return None
    row = p.type.shape[-len(axes):]
    for matrix, vector in (mul.inputs, mul.inputs[::-1]):
        if not (isinstance(matrix, Var) and isinstance(vector, Var)) or matrix is vector \
                or matrix.type.shape != p.type.shape:
            continue
        shape = vector.type.shape
        if len(shape) < len(row) or shape[len(shape) - len(row):] != row \
                or any(d != 1 for d in shape[:len(shape) - len(row)]):
            continue
        if any(_summed_alike(other, eqn, readers) for other in readers[matrix]
               if other is not mul):
            return None
        return matrix, vector
    return None


def _summed_alike(reader: Eqn, sum_: Eqn, readers: dict) -> bool:
    """Whether `reader`'s value is summed over the same axes as `sum_` (a
    loop could then read their common operand once for both sums)."""
    return any(r.op == "reduce_sum" and r.params == sum_.params and r is not sum_
               for o in reader.outputs for r in readers.get(o, ()))
