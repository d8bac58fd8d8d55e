"""IR -> IR clean-up passes, each returning a new Function.

Contract:
- `inline_calls`: replaces every `custom_vjp` call by its `fwd` body (run
  once no more differentiation is to come);
- `simplify`: drops identities, as the op table declares them (x + 0,
  x * 1, x ** 1, stop_gradient, casts and reshapes to the same type;
  results unchanged up to the sign of a zero sum), folds constants: an
  `exact` op (`ops.fold`) of constants, or a reshaped, broadcast,
  sliced or transposed constant, is a constant; reshapes and broadcasts
  of a one-element value in turn become one broadcast of it, transposes in turn one transpose,
  reshapes in turn one reshape (none, where it gives the first's source
  its own shape back: a vmap'd sum's `(n,) -> (n, 1) -> (n,)`);
  and computes x ** 0, 2, 3, 4 and
  (floats) x ** -1 as 1, products or a quotient; takes the bool
  identities that hold at every position (c | not c is true, c & not c
  false, c & true, c | false, c & c and c | c are c, not not c is c,
  c & false is false, c | true true) and the wheres they decide
  (where(true, a, b) is a, where(false, a, b) is b, where(c, a, a) is a,
  where(not c, a, b) is where(c, b, a), and a where on c of a where on c
  takes the inner one's branch: where(c, where(c, a, x), b) is
  where(c, a, b)), all bit for bit;
- `cse`: merges equations with the same op, inputs and static params;
- `dce`: removes equations whose outputs nobody reads, and the outputs of
  a loop that nobody reads (with the carried values only they need), and
  the invariants and stacked inputs its body then does not read
  (`without_dead_outputs`, which a loop's VJP also takes), but never a
  run-time check: a gather, scatter-add, max or loop nothing reads leaves
  its check (`check_of`), kept as loops whose bodies check are, unless
  another equation checks the same as the first to raise after it
  (`_without_covered_checks`); `read_by`: the
  values a function's given results read, as `dce` leaves it (a loop's
  VJP asks which carried values' states its backward trip reads);

Each pass also runs on the body of every `loop` (`_in_bodies`).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.ir import INTS, Atom, Eqn, Function, Lit, Var
from gradlang.compiler.ops import OPS, broadcast_shapes, fold, loop_groups, same_value


def _substituting():
    """(env, sub): `sub` follows `env`'s renamings (Var -> what replaces it)."""
    env: dict[Var, Atom] = {}

    def sub(a: Atom) -> Atom:
        while isinstance(a, Var) and a in env:
            a = env[a]
        return a
    return env, sub


def _in_bodies(eqn: Eqn, run) -> Eqn:
    """`eqn` with `run` applied to its loop body, if it has one."""
    if eqn.op != "loop":
        return eqn
    params = tuple((k, run(v) if k == "body" else v) for k, v in eqn.params)
    return Eqn(eqn.op, eqn.inputs, eqn.outputs, params, eqn.span)


def inline_calls(fn: Function) -> Function:
    b = Builder()
    env, sub = _substituting()
    for eqn in fn.eqns:
        eqn = _in_bodies(eqn, inline_calls)
        inputs = tuple(sub(a) for a in eqn.inputs)
        if eqn.op == "custom_vjp":
            body = inline_calls(eqn.p["fwd"])
            outs = inline(b, body, inputs)[:eqn.p["n_out"]]
            env.update(zip(eqn.outputs, outs))
        else:
            b.eqns.append(Eqn(eqn.op, inputs, eqn.outputs, eqn.params, eqn.span))
    return b.function(fn.name, fn.params, [sub(a) for a in fn.outputs])


def simplify(fn: Function, keep_barriers: bool = False) -> Function:
    """`keep_barriers` leaves `recompute_barrier`s in place, for a joint
    function that is still to be split into forward and backward passes."""
    b = Builder()
    env, sub = _substituting()
    fills: dict[Var, object] = {}  # outputs of `full`: their value
    # reshapes and broadcasts of a one-element value: that value
    spread: dict[Var, Var] = {}
    transposed: dict[Var, tuple[Var, tuple]] = {}  # a transpose's (source, perm)
    reshaped: dict[Var, Var] = {}  # a reshape's source
    negated: dict[Var, Var] = {}  # a negation's source
    inverted: dict[Var, Var] = {}  # a logical_not's source
    selected: dict[Var, tuple] = {}  # a where's inputs (c, a, b)
    broadcast: dict[Var, Var] = {}  # a broadcast's source (x, of x times ones too)
    for eqn in fn.eqns:
        eqn = _in_bodies(eqn, lambda body: simplify(body, keep_barriers))
        inputs = tuple(sub(a) for a in eqn.inputs)
        if not eqn.outputs:  # a check: nothing to simplify
            b.eqns.append(Eqn(eqn.op, inputs, (), eqn.params, eqn.span))
            continue
        out = eqn.outputs[0]
        if eqn.op in _LAYOUT_OF_ONE and inputs[0] in fills:
            # a reshaped, broadcast, sliced or transposed constant is a
            # constant of the new shape (a stack's gradient slices its
            # cotangent: of ones, for a sum, n kernel arguments of ones)
            eqn = _full(eqn, fills[inputs[0]])
            inputs = ()
        elif eqn.op in ("reshape", "broadcast_to") and isinstance(inputs[0], Var) and (
                inputs[0] in spread or _one_element(inputs[0].type.shape)):
            # one value reshaped and broadcast in turns is that value
            # broadcast once, which a loop reads as a scalar (from its 0-d
            # view where the result has fewer axes: a broadcast adds axes only)
            source = spread.get(inputs[0], inputs[0])
            if out.type.rank < source.type.rank:
                source = b.bind("reshape", source, shape=())
            spread[out] = source
            op = "reshape" if _one_element(out.type.shape) else "broadcast_to"
            inputs = (spread[out],)
            eqn = Eqn(op, inputs, eqn.outputs, (("shape", out.type.shape),), eqn.span)
        elif OPS[eqn.op].exact and all(isinstance(a, Lit) or a in fills for a in inputs):
            value = fold(eqn.op, [a.value if isinstance(a, Lit) else fills[a] for a in inputs],
                         [a.type.dtype for a in inputs], out.type.dtype)
            if value is not None:
                eqn = _full(eqn, value)
                inputs = ()
        if eqn.op == "transpose" and inputs[0] in transposed:
            # a transpose of a transpose is one (none, where they cancel: a
            # matrix product's gradient transposes a transposed operand back)
            source, first = transposed[inputs[0]]
            inputs = (source,)
            eqn = Eqn("transpose", inputs, eqn.outputs,
                      (("perm", tuple(first[p] for p in eqn.p["perm"])),), eqn.span)
        if eqn.op == "transpose":
            transposed[out] = (inputs[0], tuple(eqn.p["perm"]))
        if eqn.op == "reshape" and inputs[0] in reshaped:
            # a reshape of a reshape is one, of the first's source (no
            # step at all where that has the shape wanted: the identity
            # rule below drops it), so that nothing stands between a sum
            # and the elementwise work on it that fusion runs per row
            inputs = (reshaped[inputs[0]],)
            eqn = Eqn("reshape", inputs, eqn.outputs, eqn.params, eqn.span)
        if eqn.op == "reshape" and isinstance(inputs[0], Var):
            reshaped[out] = inputs[0]
        if eqn.op in ("abs", "neg") and inputs[0] in negated:
            # abs(-x) is abs(x), and -(-x) is x, bit for bit (integers too):
            # so CSE finds log_sigmoid(u)'s exp(-abs(u)) in log_sigmoid(-u)
            if eqn.op == "neg":
                env[out] = negated[inputs[0]]
                continue
            inputs = (negated[inputs[0]],)
            eqn = Eqn("abs", inputs, eqn.outputs, eqn.params, eqn.span)
        if eqn.op == "neg" and isinstance(inputs[0], Var):
            negated[out] = inputs[0]
        if eqn.op == "logical_not" and inputs[0] in inverted:
            env[out] = inverted[inputs[0]]  # (not not c is c)
            continue
        if eqn.op == "logical_not" and isinstance(inputs[0], Var):
            inverted[out] = inputs[0]
        if eqn.op == "where" and inputs[0] in inverted:
            # where(not c, a, b) is where(c, b, a), one step less
            inputs = (inverted[inputs[0]], inputs[2], inputs[1])
            eqn = Eqn("where", inputs, eqn.outputs, eqn.params, eqn.span)
        if eqn.op == "where":
            inputs = _through_inner_wheres(inputs, selected, out)
            eqn = Eqn("where", inputs, eqn.outputs, eqn.params, eqn.span)
            selected[out] = inputs
        decided = _decided_logic(eqn.op, inputs, fills, inverted)
        if decided is not None:
            eqn = _full(eqn, decided)
            inputs = ()
        if eqn.op == "pow" and _small_power(inputs, out) is not None:
            eqn = _power_as_products(b, eqn, inputs[0], _small_power(inputs, out))
            inputs = eqn.inputs
        if eqn.op == "full":
            fills[out] = eqn.p["value"]
        alias = (None if keep_barriers and eqn.op == "recompute_barrier"
                 else _identity_input(eqn.op, inputs, eqn.p, fills))
        if alias is None:
            alias = _picked_input(eqn.op, inputs, fills)
        if alias is not None and alias.type == out.type:
            # (a literal too: a `@recompute` stage's barrier on a default
            # number has no driver code, and needs none)
            env[out] = alias
            continue
        if eqn.op == "reduce_sum" and inputs[0] in broadcast:
            spread_sum = _sum_of_broadcast(b, eqn, broadcast[inputs[0]])
            if spread_sum is not None:  # (a broadcast_to of x's sum)
                eqn, inputs = spread_sum, spread_sum.inputs
        if eqn.op == "broadcast_to" and isinstance(inputs[0], Var):
            broadcast[out] = inputs[0]
        elif (isinstance(alias, Var) and alias.type.dtype == out.type.dtype
              and OPS[eqn.op].kind == "elementwise"):  # (its inputs broadcast to out)
            # x * ones of a larger shape (a sum's cotangent) is x broadcast,
            # which a sum of it can see through (it stays as it is for the
            # rest: the Dask split chunks a broadcast otherwise)
            broadcast[out] = alias
        b.eqns.append(Eqn(eqn.op, inputs, eqn.outputs, eqn.params, eqn.span))
    return b.function(fn.name, fn.params, [sub(a) for a in fn.outputs])


_LAYOUT_OF_ONE = ("reshape", "broadcast_to", "slice", "transpose")  # (each value is one of x's)


def _full(eqn: Eqn, value) -> Eqn:
    """eqn's output as a constant: a `full` of its type."""
    t = eqn.outputs[0].type
    params = (("dtype", t.dtype), ("shape", t.shape), ("value", value))
    return Eqn("full", (), eqn.outputs, params, eqn.span)


def _sum_of_broadcast(b: Builder, eqn: Eqn, x: Var) -> Eqn | None:
    """The equation computing `eqn`, a sum of x broadcast, as a sum of x
    itself broadcast to the result (after the sum, which it binds in `b`):
    an outer product's gradient sums a row of ones times x over n rows,
    n x m work and, run as a product by `compiler.matvec`, an n x m array
    of ones.  None where the sum runs along an axis the broadcast made
    (the sum would then be a multiple of x's, by a size)."""
    (out,) = eqn.outputs
    wide = eqn.inputs[0].type.shape
    lead = len(wide) - x.type.rank  # the axes the broadcast put in front
    axes = [a % len(wide) for a in eqn.p["axes"]]
    if any(a < lead or x.type.shape[a - lead] != wide[a] for a in axes if wide[a] != 1):
        return None
    own_axes = [a - lead for a in axes if a >= lead]
    if not own_axes:
        return None
    summed = b.bind("reduce_sum", x, axes=tuple(own_axes), span=eqn.span)
    return Eqn("broadcast_to", (summed,), eqn.outputs, (("shape", out.type.shape),), eqn.span)


def _one_element(shape: tuple) -> bool:
    return all(d == 1 for d in shape)


def _small_power(inputs, out: Var) -> int | float | None:
    """n for x ** n with n a literal 0, 2, 3 or 4 (or -1 or 0.5 for floats),
    which are cheaper and as exact as a constant or products (x * x is
    correctly rounded, like pow; x ** 3 and x ** 4 within about 1.5 ulp)
    than a call to pow."""
    x, y = inputs
    if not isinstance(y, Lit) or y.type.shape != () or x.type != out.type:
        return None
    if y.value in (0, 2, 3, 4):
        return int(y.value)
    if out.type.dtype in INTS and isinstance(y.value, int) and y.value > 4:
        # any: exact as products are, which wrap around as NumPy's power
        # does (a few dozen multiplies at most); Numba's power multiplies
        # "no signed wrap", and LLVM took `(x ** 5) // x` for x ** 4
        return int(y.value)
    if y.value in (-1, 0.5) and out.type.dtype in ("f32", "f64"):
        return y.value
    return None


def _power_as_products(b: Builder, eqn: Eqn, x: Atom, n: int) -> Eqn:
    """The equation computing eqn's output, x ** n, as a constant or
    products (after the ones it needs, which it binds in `b`)."""
    out_type = eqn.outputs[0].type
    if n == 0:  # 1, even for NaN
        return _full(eqn, b.lit(1, out_type.dtype).value)
    if n == -1:
        return Eqn("div", (b.lit(1, x.type.dtype), x), eqn.outputs, (), eqn.span)
    if n == 0.5:
        # NumPy's `x ** 0.5` is its sqrt (a fast path of `np.power` for a
        # scalar exponent): -0.0 at -0.0 and NaN at -inf, where pow gives
        # 0.0 and inf; and correctly rounded, where the kernels' pow was an
        # ulp off (2 ** 0.5)
        return Eqn("sqrt", (x,), eqn.outputs, (), eqn.span)
    if n == 2:
        return Eqn("mul", (x, x), eqn.outputs, (), eqn.span)
    if n > 4:  # (integers) by squaring, from the exponent's high bits
        steps = "".join("s" + ("x" if bit == "1" else "") for bit in bin(n)[3:])
        power = x
        for step in steps[:-1]:
            power = b.bind("mul", power, power if step == "s" else x, span=eqn.span)
        last = power if steps[-1] == "s" else x
        return Eqn("mul", (power, last), eqn.outputs, (), eqn.span)
    square = b.bind("mul", x, x, span=eqn.span)
    return Eqn("mul", (square, x if n == 3 else square), eqn.outputs, (), eqn.span)


def _identity_input(op: str, inputs, params, fills) -> Atom | None:
    """The input `op` returns unchanged, as its row in the op table says
    (`no_op_if`, `identity`, `commutative`), or None."""
    row = OPS[op]

    def is_identity(a: Atom) -> bool:
        if isinstance(a, Lit):
            return same_value(a.value, row.identity, a.type.dtype)
        return a in fills and same_value(fills[a], row.identity, a.type.dtype)

    if row.no_op_if is not None and row.no_op_if(params):
        return inputs[0]
    if row.identity is not None:
        if is_identity(inputs[1]):
            return inputs[0]
        if row.commutative and is_identity(inputs[0]):
            return inputs[1]
    return None


# A bool op's identity and absorbing element: c & true and c | false are
# c, c & false is false and c | true is true.  (Exact, as a float op's
# absorbing element is not: x * 0 is NaN for x = inf.)
_LOGIC_CONSTANTS = {"logical_and": (True, False), "logical_or": (False, True)}


def _constant(a: Atom, fills) -> object | None:
    """a's value where it is a literal or a `full`'s output, else None."""
    if isinstance(a, Lit):
        return a.value
    return fills.get(a)


def _decided_logic(op: str, inputs, fills, inverted) -> bool | None:
    """The value of a logical and / or that its inputs decide at every
    position, whatever they hold: with the absorbing element, or of c and
    not c (c | not c is true, c & not c false).  A gradient through both
    branches of a where(c, ...) has the where-mask c | not c
    (`autodiff.elementwise_mask`), and re-selected every element by it,
    keeping the bool array for the backward pass."""
    if op not in _LOGIC_CONSTANTS:
        return None
    first, second = inputs
    _, absorbing = _LOGIC_CONSTANTS[op]
    if any(_constant(a, fills) is not None and bool(_constant(a, fills)) == absorbing
           for a in inputs):
        return absorbing
    if inverted.get(first) is second or inverted.get(second) is first:
        return absorbing
    return None


def _picked_input(op: str, inputs, fills) -> Atom | None:
    """The input a logical and / or, or a where, returns whatever the
    others hold, or None: c & true, c | false, c & c and c | c are c;
    where(true, a, b) is a, where(false, a, b) is b, and where(c, a, a) is
    a, bit for bit (NaN and the sign of a zero included: where copies)."""
    if op in _LOGIC_CONSTANTS:
        first, second = inputs
        identity, _ = _LOGIC_CONSTANTS[op]
        if first is second:
            return first
        for a, other in ((first, second), (second, first)):
            value = _constant(a, fills)
            if value is not None and bool(value) == identity:
                return other
        return None
    if op != "where":
        return None
    cond, a, b = inputs
    if a is b:
        return a
    value = _constant(cond, fills)
    if value is None:
        return None
    return a if value else b


def _through_inner_wheres(inputs, selected: dict, out: Var) -> tuple:
    """where(c, a, b)'s inputs (giving `out`) with a branch that is itself
    a where on c replaced by the branch it takes there: where(c, where(c,
    a, x), b) is where(c, a, b), and where(c, a, where(c, x, b)) too, bit
    for bit, where that keeps out's shape (x may have widened it).  (A
    grad block's result is re-selected by its where-mask, and again by the
    cotangent's: `autodiff._masked_by_block`.)"""
    cond, a, b = inputs
    if a in selected and selected[a][0] is cond:
        a = selected[a][1]
    if b in selected and selected[b][0] is cond:
        b = selected[b][2]
    if broadcast_shapes([x.type.shape for x in (cond, a, b)], None) != out.type.shape:
        return inputs
    return cond, a, b


def cse_key(eqn: Eqn, inputs) -> tuple | None:
    """What makes two equations one value for `cse` (and for hoisting's
    equal moves): op, inputs (Vars by identity, literals by exact value and
    type) and params; None for one that is never merged (a loop, a
    custom_vjp)."""
    if eqn.op in ("custom_vjp", "loop"):
        return None
    ins = tuple(("v", id(a)) if isinstance(a, Var) else ("l", _exactly(a.value), a.type)
                for a in inputs)
    if eqn.op in _COMMUTING:  # (a gradient's dy * p beside the value's p * dy)
        ins = tuple(sorted(ins, key=repr))
    return (eqn.op, ins, tuple((name, _exactly(value)) for name, value in eqn.params))


# Ops whose operands swap with the same bits, signed zeros included (not
# maximum's: max(0.0, -0.0) is -0.0, max(-0.0, 0.0) is 0.0)
_COMMUTING = ("add", "mul")


def _exactly(value):
    """A constant as a key: a float with its sign, since -0.0 == 0.0."""
    if isinstance(value, (float, np.floating)):
        return (value, math.copysign(1.0, value))
    return value


def cse(fn: Function) -> Function:
    b = Builder()
    env, sub = _substituting()
    seen: dict[tuple, tuple[Var, ...]] = {}
    for eqn in fn.eqns:
        eqn = _in_bodies(eqn, cse)
        inputs = tuple(sub(a) for a in eqn.inputs)
        key = cse_key(eqn, inputs)
        if key is not None and key in seen:
            env.update(zip(eqn.outputs, seen[key]))
            continue
        if key is not None:
            seen[key] = eqn.outputs
        b.eqns.append(Eqn(eqn.op, inputs, eqn.outputs, eqn.params, eqn.span))
    return b.function(fn.name, fn.params, [sub(a) for a in fn.outputs])


def dce(fn: Function) -> Function:
    live: set[Var] = {a for a in fn.outputs if isinstance(a, Var)}
    kept: list[Eqn] = []
    for eqn in reversed(fn.eqns):
        if any(o in live for o in eqn.outputs) or checks(eqn):
            eqn = without_dead_outputs(eqn, live)
        else:
            eqn = check_of(eqn)
            if eqn is None:
                continue
        kept.append(eqn)
        live.update(a for a in eqn.inputs if isinstance(a, Var))
    return Function(fn.name, fn.params, _without_covered_checks(kept[::-1], fn.outputs),
                    fn.outputs)


def checks(eqn: Eqn) -> bool:
    """Whether `eqn` must run though nothing reads its outputs: a check
    (`compiler.ops`, kind "check"), or a loop whose body checks (an
    equation there whose result nothing may read leaves its check,
    `check_of`), or a size a float divides by (`dim` with `nonzero`:
    `Lowerer.size_number`), which the call checks nonzero where it is, as
    folding `0.1 / k` raised at k = 0 before sizes stayed symbolic."""
    if OPS[eqn.op].kind == "check" or _divisor_check(eqn):
        return True
    return eqn.op == "loop" and any(checks(e) or check_of(e) is not None
                                    for e in eqn.p["body"].eqns)


def check_of(eqn: Eqn) -> Optional[Eqn]:
    """The check left of an equation whose results nothing reads, where
    running it may raise: a gather's or scatter-add's `check_index` (not
    for a literal index that the axis's fixed size holds), a max's
    `check_nonempty` where an axis it reduces may be empty (and it has no
    initial value), a loop's `check_trips` where its bounds are values
    (a step of zero).  None where nothing may raise."""
    p = eqn.p
    if OPS[eqn.op].kind == "index":
        idx, size = eqn.inputs[1], eqn.inputs[0].type.shape[p["axis"]]
        if isinstance(idx, Lit) and isinstance(size, int) and -size <= idx.value < size:
            return None
        return Eqn("check_index", (idx,), (), (("size", size), ("what", p["what"])), eqn.span)
    if eqn.op == "reduce_max" and p.get("empty") is None:
        shape = eqn.inputs[0].type.shape
        if all(isinstance(shape[a], int) and shape[a] > 0 for a in p["axes"]):
            return None
        return Eqn("check_nonempty", (), (), (("axes", tuple(p["axes"])), ("shape", shape)),
                   eqn.span)
    if eqn.op == "loop" and any(isinstance(a, Var) for a in eqn.inputs[:3]):
        return Eqn("check_trips", eqn.inputs[:3], (), (), eqn.span)
    return None


def _check_key(eqn: Eqn) -> Optional[tuple]:
    """What a gather's, scatter-add's or check's run-time check raises on:
    (index, axis size, message params, place); None for any other op."""
    kind = OPS[eqn.op].kind
    span = (eqn.span, eqn.span.via) if eqn.span is not None else None
    if eqn.op == "check_index":
        return eqn.inputs[0], eqn.p["size"], eqn.p["what"], span
    if eqn.op == "check_nonempty" or (eqn.op == "reduce_max" and eqn.p.get("empty") is None):
        shape = eqn.p["shape"] if eqn.op == "check_nonempty" else eqn.inputs[0].type.shape
        return "nonempty", shape, tuple(eqn.p["axes"]), span
    if kind == "index":
        return (eqn.inputs[1], eqn.inputs[0].type.shape[eqn.p["axis"]], eqn.p["what"], span)
    return None


def _may_raise(eqn: Eqn) -> bool:
    """Whether running `eqn` may raise (after the driver's checks of the
    arguments and sizes, which come before any of them)."""
    return OPS[eqn.op].kind in ("index", "check", "loop", "call") or eqn.op == "reduce_max" \
        or _divisor_check(eqn)


def _divisor_check(eqn: Eqn) -> bool:
    """Whether `eqn` is a size checked nonzero where it runs (`checks`)."""
    return eqn.op == "dim" and bool(eqn.p.get("nonzero"))


def _without_covered_checks(eqns: list[Eqn], outputs: Sequence[Atom]) -> tuple[Eqn, ...]:
    """`eqns` without each `check_index` that another equation of theirs
    performs too, as the first to raise of it: one before it checking
    the same index against the same size with the same message (an index
    out of range raised there already), or the next equation after it
    that may raise at all (nothing raises between them).  So a gradient's
    scatter-add of a gather's cotangent checks its index once, the dead
    gather's check leaving no pass of its own, and the first error raised
    is the one the check would have raised.  The same for a loop run for
    checks alone of indices it does not change from trip to trip
    (`_trip_keys`), where the next to raise is a loop of the same trips
    whose body first checks those, in that order (a backward loop's
    scatter-adds of an invariant gather's cotangent), and whose results
    nothing reads (`outputs`, the function's, or an equation): such a loop
    whose body checks alone may still stack a value it carries unchanged,
    which a later loop reads."""
    if not any(OPS[e.op].kind == "check" or (e.op == "loop" and checks(e)) for e in eqns):
        return tuple(eqns)
    read = {a for a in outputs if isinstance(a, Var)}
    read.update(a for e in eqns for a in e.inputs if isinstance(a, Var))
    following: list[Optional[Eqn]] = [None] * len(eqns)
    after = None
    for k in range(len(eqns) - 1, -1, -1):
        following[k] = after
        if _may_raise(eqns[k]):
            after = eqns[k]
    done: set[tuple] = set()
    kept = []
    for k, eqn in enumerate(eqns):
        key = _check_key(eqn)
        after = following[k]
        if eqn.op in ("check_index", "check_nonempty") and (
                key in done or (after is not None and key == _check_key(after))):
            continue
        only = _trip_keys(eqn, checks_only=True)
        if only and not any(o in read for o in eqn.outputs) and (set(only) <= done or (
                after is not None and after.op == "loop" and after.inputs[:3] == eqn.inputs[:3]
                and _first_keys(after, len(only)) == only)):
            continue
        if key is not None:
            done.add(key)
        kept.append(eqn)
    return tuple(kept)


def _trip_keys(eqn: Eqn, checks_only: bool = False) -> Optional[list]:
    """For a loop: `_check_key` of each equation of its body that may
    raise, in order, an index it reads as an invariant named by what the
    loop is given for it (None for any other: what may differ from trip to
    trip); with `checks_only`, None unless its body is such checks alone."""
    if eqn.op != "loop":
        return None
    body, p = eqn.p["body"], eqn.p
    _, _, outer, _ = loop_groups(eqn.inputs, p)
    _, _, inner, _ = loop_groups(body.params, p, lead=1)
    given = dict(zip(inner, outer))
    keys = []
    for e in body.eqns:
        if checks_only and e.op not in ("check_index", "check_nonempty"):
            return None
        if not _may_raise(e):
            continue
        key = _check_key(e)
        if key is not None and isinstance(key[0], str):  # (sizes: every trip's)
            keys.append(key)
        else:
            keys.append((given[key[0]],) + key[1:] if key and key[0] in given else None)
    if checks_only and None in keys:
        return None
    return keys


def _first_keys(eqn: Eqn, count: int) -> list:
    """The first `count` distinct keys a loop's body checks (`_trip_keys`),
    up to the first that may raise otherwise."""
    found: list = []
    for key in _trip_keys(eqn) or []:
        if key is None or len(found) == count:
            break
        if key not in found:
            found.append(key)
    return found


def without_dead_outputs(eqn: Eqn, live: set[Var]) -> Eqn:
    """`eqn` without the outputs not in `live` it can go without, its body
    (a loop's) without what only they read."""
    return _in_bodies(_without_dead_loop_outputs(eqn, live), dce)


def _without_dead_loop_outputs(eqn: Eqn, live: set[Var],
                               memo: Optional[dict] = None) -> Eqn:
    """A `loop` without the outputs nothing reads: its stacked outputs
    (ys), and its carried values that no live output depends on, trip by
    trip (the where-masks a backward loop carries and stacks, which only a
    second reverse pass reads); and without the invariants and stacked
    inputs (xs) its body no longer reads (a backward loop's starting
    states of an accumulator, whose update's derivative does not read it:
    the forward loop then stacks them for nothing).  Other equations as
    they are.  What only they read leaves the body with the body's own
    `dce`.  `memo` holds the results for the loops nested in it, by the
    equation and which of its outputs are live: each level reads the one
    below for each set of carried values it tries, so without it the work
    doubled with each level of nesting (18 nested loops took 10 s)."""
    if eqn.op != "loop":
        return eqn
    memo = {} if memo is None else memo
    key = (id(eqn), frozenset(o for o in eqn.outputs if o in live))
    if key not in memo:
        memo[key] = (eqn, _live_loop(eqn, live, memo))  # (eqn keeps its id unique)
    return memo[key][1]


def _live_loop(eqn: Eqn, live: set[Var], memo: dict) -> Eqn:
    p = eqn.p
    body, n_carry = p["body"], p["n_carry"]
    ys = [j for j in range(n_carry, len(eqn.outputs)) if eqn.outputs[j] in live]
    carried = {j for j in range(n_carry) if eqn.outputs[j] in live}
    while True:  # a carried value the next trip of a live one reads is live
        read = read_by(body, [body.outputs[j] for j in sorted(carried) + ys], memo)
        grown = carried | {j for j in range(n_carry) if body.params[1 + j] in read}
        if grown == carried:
            break
        carried = grown
    passed = None
    if not carried and not ys and checks(eqn):
        # run for its body's checks alone: it carries its first value
        # unchanged (no stage makes or runs a loop that carries nothing),
        # and its body computes only what the checks read
        carried, passed = {0}, body.params[1]
    elif not carried:  # keep them all: no stage makes or runs a loop that carries nothing
        carried = set(range(n_carry))
    kept = sorted(carried)
    outs = [passed] if passed is not None else [body.outputs[j] for j in kept + ys]
    read = read_by(body, outs, memo)
    bounds, carry, inv, xs = loop_groups(eqn.inputs, p)
    index, carry_params, inv_params, slices = loop_groups(body.params, p, lead=1)
    inv_kept = [j for j, v in enumerate(inv_params) if v in read]
    xs_kept = [j for j, v in enumerate(slices) if v in read]
    if len(kept) + len(ys) == len(eqn.outputs) and len(inv_kept) == len(inv) \
            and len(xs_kept) == len(xs) and passed is None:
        return eqn
    body = Function(body.name, (*index, *(carry_params[j] for j in kept),
                                *(inv_params[j] for j in inv_kept),
                                *(slices[j] for j in xs_kept)),
                    body.eqns, tuple(outs))
    counts = {"body": body, "n_carry": len(kept), "n_inv": len(inv_kept)}
    params = tuple((k, counts.get(k, v)) for k, v in eqn.params)
    return Eqn(eqn.op, (*bounds, *(carry[j] for j in kept), *(inv[j] for j in inv_kept),
                        *(xs[j] for j in xs_kept)),
               tuple(eqn.outputs[j] for j in kept + ys), params, eqn.span)


def read_by(fn: Function, outputs, memo: Optional[dict] = None) -> set[Var]:
    """The values of fn that computing `outputs` reads (through a nested
    loop, only what its outputs among them need, as `dce` leaves it)."""
    memo = {} if memo is None else memo
    read = {a for a in outputs if isinstance(a, Var)}
    for eqn in reversed(fn.eqns):
        if any(o in read for o in eqn.outputs) or checks(eqn):
            eqn = _without_dead_loop_outputs(eqn, read, memo)
            read.update(a for a in eqn.inputs if isinstance(a, Var))
        else:
            check = check_of(eqn)  # (which `dce` leaves)
            if check is not None:
                read.update(a for a in check.inputs if isinstance(a, Var))
    return read
