"""Codegen: fused steps -> Python source for a kernel module and a driver.

Contract: `generate(fn, target)` returns a `Generated` holding
- `kernel_source`: a Python module of Numba kernels, one per fused loop,
  rendered from the op table's scalar templates.  It depends only on the
  structure of the computation (dtypes, which inputs broadcast how), never
  on sizes, so one compiled kernel serves every size;
- `driver_source`: a plain-Python function `run(*args)` for fn's types
  (symbolic sizes become variables bound from the arguments, each named
  `size_` + its symbol, apart from every other driver name) that
  allocates outputs and does layout, reductions and matmul through the
  target's helper module `R`, launches the kernels in order, and returns
  the outputs.  Kernels never allocate.

Only the `Target` (`runtime.target`) differs between targets: the loop
wrapper, how the driver launches a loop, and the helper module `R`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gradlang.compiler.fusion import Loop, fuse
from gradlang.compiler.ir import Atom, Eqn, Function, Lit, TensorType, Var
from gradlang.compiler.ops import OPS, python_slices
from gradlang.compiler.shapes import Dim, Sym, prod
from gradlang.runtime import target as targets
from gradlang.runtime.common import c_strides, stride_table
from gradlang.runtime.target import Target


@dataclass(frozen=True)
class Generated:
    name: str
    kernel_source: str
    driver_source: str
    kernel_names: tuple[str, ...]


# ------------------------------------------------------------ input access


def access_kind(shape: tuple[int, ...], loop: tuple[int, ...]) -> str:
    """How a loop over `loop` reads an input of `shape` at flat index i."""
    if shape == loop:
        return "full"
    if prod(shape) == 1:
        return "scalar"
    trimmed = shape[next((k for k, d in enumerate(shape) if d != 1), len(shape)):]
    if trimmed == loop[len(loop) - len(trimmed):]:
        return "suffix"
    padded = (1,) * (len(loop) - len(shape)) + shape
    j = next((k for k in range(len(loop), -1, -1) if padded[:k] == loop[:k]), 0)
    if all(d == 1 for d in padded[j:]):
        return "outer"
    return "general"


def access_aux(shape: tuple[int, ...], loop: tuple[int, ...]) -> Optional[object]:
    """The extra kernel argument an access kind needs (computed per size)."""
    kind = access_kind(shape, loop)
    padded = (1,) * (len(loop) - len(shape)) + shape
    if kind == "outer":
        j = next(k for k in range(len(loop), -1, -1) if padded[:k] == loop[:k])
        return prod(loop[j:])
    if kind == "general":
        strides = [0 if d == 1 else s for d, s in zip(padded, c_strides(padded))]
        return stride_table(loop, strides)
    return None


# ------------------------------------------------------------------ kernels


def _literal(a: Lit, consts: dict) -> str:
    key = (a.type.dtype, repr(a.value))
    if key not in consts:
        consts[key] = f"c{len(consts)}"
    return consts[key]


def render_loop(loop: Loop, kname: str, target: Target, consts: dict) -> tuple[str, list[str]]:
    """Kernel source for one fused loop, and the driver-side argument kinds
    (one per kernel argument after n: 'in', 'out' or 'aux')."""
    names: dict[Var, str] = {}
    args: list[str] = []
    pre: list[str] = []
    body: list[str] = []
    kinds: list[tuple[str, object]] = []

    for k, v in enumerate(loop.inputs):
        arg = f"in{k}"
        args.append(arg)
        kinds.append(("in", v))
        kind = access_kind(v.type.shape, loop.shape)
        if kind == "full":
            body.append(f"a{k} = {arg}[i]")
        elif kind == "scalar":
            pre.append(f"a{k} = {arg}[0]")
        elif kind == "suffix":
            pre.append(f"m{k} = {arg}.shape[0]")
            body.append(f"a{k} = {arg}[i % m{k}]")
        elif kind == "outer":
            body.append(f"a{k} = {arg}[i // q{k}]")
        else:
            # g: (out stride, out size, in stride) per axis, flattened
            body.append(f"j{k} = 0")
            body.append(f"for r in range(0, len(g{k}), 3):")
            body.append(f"    j{k} += ((i // g{k}[r]) % g{k}[r + 1]) * g{k}[r + 2]")
            body.append(f"a{k} = {arg}[j{k}]")
        names[v] = f"a{k}"
    for j, v in enumerate(loop.outputs):
        args.append(f"out{j}")
        kinds.append(("out", v))
    for k, v in enumerate(loop.inputs):
        kind = access_kind(v.type.shape, loop.shape)
        if kind in ("outer", "general"):
            args.append(f"q{k}" if kind == "outer" else f"g{k}")
            kinds.append(("aux", v))

    def ref(a: Atom) -> str:
        return _literal(a, consts) if isinstance(a, Lit) else names[a]

    for n, eqn in enumerate(loop.eqns):
        out = eqn.outputs[0]
        local = f"v{n}"
        names[out] = local
        op = OPS[eqn.op]
        if eqn.op == "full":
            expr = _literal(Lit(eqn.p["value"], TensorType(eqn.p["dtype"], ())), consts)
        elif eqn.op == "broadcast_to":
            expr = ref(eqn.inputs[0])
        else:
            expr = op.template.format(
                *[ref(a) for a in eqn.inputs], T=out.type.dtype)
        body.append(f"{local} = {out.type.dtype}({expr})")
    reduced = None
    for j, v in enumerate(loop.outputs):
        if loop.reduction is not None and v in loop.reduction.outputs:
            reduced = f"out{j}"
        else:
            body.append(f"out{j}[i] = {names[v]}")
    if reduced is not None:
        summand = names[loop.reduction.inputs[0]]
        return target.render_reducing_loop(kname, args, pre, body, summand, reduced), kinds
    return target.render_loop(kname, args, pre, body), kinds


def kernel_signature(loop: Loop) -> str:
    """The argument types of a loop's kernel in Numba's notation, in the
    order `render_loop` declares them (n, [rows,] inputs, outputs, aux)."""
    array = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64",
             "bool": "boolean"}
    args = ["int64"] + (["int64"] if loop.reduction is not None else [])
    args += [f"{array[v.type.dtype]}[::1]" for v in loop.inputs + loop.outputs]
    for v in loop.inputs:
        kind = access_kind(v.type.shape, loop.shape)
        if kind == "outer":
            args.append("int64")
        elif kind == "general":
            args.append(f"UniTuple(int64, {3 * len(loop.shape)})")
    return ", ".join(args)


# ------------------------------------------------------------------- driver


def generate(fn: Function, target: "Target | str" = targets.DEFAULT) -> Generated:
    target = targets.get(target)
    steps = fuse(fn, reductions=target.fuses_reductions)
    consts: dict = {}
    kernels: list[str] = []
    kernel_names: list[str] = []
    names: dict[Var, str] = {}
    fresh: set[Var] = set()  # driver values that own their memory
    lines: list[str] = []

    def ref(a: Atom) -> str:
        if isinstance(a, Lit):
            return f"R.scalar({a.value!r}, np.{_np_name(a.type.dtype)})"
        return names[a]

    def define(v: Var) -> str:
        names[v] = f"t{len(names)}"
        return names[v]

    params = [define(v) for v in fn.params]
    lines += bind_symbols(fn.params, names)
    for step in steps:
        if isinstance(step, Loop):
            kname = f"k_{_ident(fn.name)}_{len(kernel_names)}"
            source, kinds = render_loop(step, kname, target, consts)
            kernels.append(source)
            kernel_names.append(kname)
            size = prod(step.shape)
            reduced = step.reduction.outputs if step.reduction is not None else ()
            call_args = []
            for kind, v in kinds:
                if kind == "in":
                    call_args.append(f"R.flat({ref(v)})")
                elif kind == "out":
                    name = define(v)
                    fresh.add(v)
                    length = prod(v.type.shape) if v in reduced else size
                    lines.append(f"{name} = R.empty({render(length)}, "
                                 f"np.{_np_name(v.type.dtype)})")
                    call_args.append(name)
                else:
                    aux = access_aux(v.type.shape, step.shape)
                    call_args.append(render(aux) if not isinstance(aux, tuple) else
                                     render_shape(aux))
            if reduced:
                rows = prod(reduced[0].type.shape)
                lines.append(target.launch_reducing(kname, render(size), render(rows),
                                                    call_args))
            else:
                known = size if isinstance(size, int) else None
                lines.append(target.launch(kname, render(size), known, call_args))
            for v in step.outputs:
                if v.type.shape != (prod(v.type.shape),):
                    lines.append(f"{names[v]} = R.reshape({names[v]}, "
                                 f"{render_shape(v.type.shape)})")
        else:
            lines.append(_render_eqn(step, ref, define))
            if step.op in ("reduce_sum", "reduce_max", "matmul", "embed", "concatenate", "dim"):
                fresh.update(step.outputs)
    outs, handed_out = [], set()
    for a in fn.outputs:
        if isinstance(a, Lit) or (a in fresh and a not in handed_out):
            outs.append(ref(a))
        else:
            # never hand out a view of an input, nor one array twice
            outs.append(f"R.copy({names[a]})")
        handed_out.add(a)
    lines.append(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")

    const_lines = [f"{name} = np.{_np_name(dtype)}({value})"
                   for (dtype, value), name in consts.items()]
    kernel_source = "\n".join(
        [f'"""Kernels generated by gradc for {_ident(fn.name)} ({target.name})."""',
         target.header,
         "f32, f64, i32, i64 = np.float32, np.float64, np.int32, np.int64",
         "nan, inf = np.nan, np.inf", *const_lines, "", ""] + kernels)
    driver_source = "\n".join(
        [f"def run({', '.join(params)}):"] + ["    " + l for l in lines]) + "\n"
    return Generated(fn.name, kernel_source, driver_source, tuple(kernel_names))


def bind_symbols(params, names: dict[Var, str]) -> list[str]:
    """Driver lines binding each size symbol to the first argument axis
    that carries it, and checking every other axis that carries it, and
    every fixed size (a program compiled ahead of time for f64[4] must not
    run on 2 elements)."""
    lines, bound = [], set()
    for v in params:
        for axis, d in enumerate(v.type.shape):
            if isinstance(d, int):
                lines.append(f"if {names[v]}.shape[{axis}] != {d}: "
                             f"R.size_mismatch('a fixed size', {d}, {names[v]}.shape[{axis}])")
                continue
            if d.coef != 1 or len(d.factors) != 1:
                continue
            (symbol,) = d.factors
            var = size_variable(symbol)
            if symbol not in bound:
                bound.add(symbol)
                lines.append(f"{var} = {names[v]}.shape[{axis}]")
            else:
                lines.append(f"if {names[v]}.shape[{axis}] != {var}: "
                             f"R.size_mismatch({symbol!r}, {var}, {names[v]}.shape[{axis}])")
    return lines


def size_variable(symbol: str) -> str:
    """The driver variable of a size symbol.  Symbols are user text (a
    `--sig` may name a size `t0`, `R` or `lambda`); the prefix keeps them
    apart from the driver's own names (`t<k>`, `R`, `K`, `np`) and from
    keywords, and the check keeps anything else out of the source."""
    if not symbol.isidentifier():
        raise ValueError(f"a size symbol must be an identifier, got {symbol!r}")
    return f"size_{symbol}"


def render(d: Dim) -> str:
    """Python source for a dimension in the driver."""
    if isinstance(d, Sym):
        text = " * ".join(map(size_variable, d.factors))
        return text if d.coef == 1 else f"{d.coef} * {text}"
    return str(d)


def render_shape(shape) -> str:
    parts = [render(d) for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _render_eqn(eqn: Eqn, ref, define) -> str:
    """A non-loop step: a call into the target's helper module `R`."""
    x = [ref(a) for a in eqn.inputs]
    p = eqn.p
    out = define(eqn.outputs[0])
    op = eqn.op
    if op == "dim":
        return f"{out} = R.scalar({render(p['value'])}, np.{_np_name(p['dtype'])})"
    if op in ("reduce_sum", "reduce_max"):
        return f"{out} = R.{op}({x[0]}, {tuple(p['axes'])!r})"
    if op == "matmul":
        return f"{out} = R.matmul({x[0]}, {x[1]})"
    if op == "reshape":
        return f"{out} = R.reshape({x[0]}, {render_shape(p['shape'])})"
    if op == "transpose":
        return f"{out} = R.transpose({x[0]}, {tuple(p['perm'])!r})"
    if op == "slice":
        return f"{out} = R.slice({x[0]}, ({_slices(p)},))"
    if op == "embed":
        return f"{out} = R.embed({x[0]}, {render_shape(p['shape'])}, ({_slices(p)},))"
    if op == "concatenate":
        return f"{out} = R.concatenate(({', '.join(x)},), {p['axis']})"
    raise NotImplementedError(f"no driver code for {op}")


def _slices(p) -> str:
    return ", ".join(map(repr, python_slices(p["starts"], p["stops"], p["steps"])))


def _np_name(dtype: str) -> str:
    return {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64",
            "bool": "bool_"}[dtype]


def _ident(name: str) -> str:
    """`name` made safe to splice into generated source: ASCII letters,
    digits and underscores only."""
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in name)
