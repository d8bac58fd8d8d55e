"""The compiler's stages, in order, and the functions that drive them.

    parse     source -> AST with spans                       compiler/parser.py
    check     names, arity, grad-block contracts, params     compiler/checker.py
    lower     AST -> typed SSA IR for one call signature     compiler/lower.py
    autodiff  IR -> IR: gradient, vjp, directional           compiler/autodiff.py
              forward mode (jvp)                             compiler/forward.py
    inline    calls of sub-functions inlined                 compiler/passes.py
    simplify  algebraic simplification                       compiler/passes.py
    cse       loop-invariant work hoisted out of loops,      compiler/hoisting.py
              then common subexpressions merged              compiler/passes.py
    dce       dead equations removed                         compiler/passes.py
    fuse      elementwise equations -> loops                 compiler/fusion.py
    codegen   loops -> kernel module + driver source         compiler/codegen.py
    load      kernel module imported, driver bound           runtime/loader.py

`STAGES` is that list; `EMITS` (what `gradc show --emit` accepts) is
derived from it: each stage's printed form, and `grad-` or `jvp-` before every stage
that can run on a gradient.  Contracts:

- `front_end(source, file, graph)`: parse and check (grad blocks' linearity
  included: `check_linearity`); the module and its namespace.
- `lower_entry(namespace, fdef, types)`: lower; errors carry the source.
- `grad_of_sum`, `pullback`, `vjp_programs`, `vjp_passes`, `directional`,
  `jvp`, `select`: the transforms, IR -> IR (`vjp_programs` builds both
  halves; `vjp_passes` gives them as IR, reading the arguments apart).
- `optimize(fn)`: the IR passes (verifying between them when
  GRADC_VERIFY=1); `build(fn, target)`: passes, fuse, codegen and load,
  returning a callable `Program`.
- `build_stored(key, lower, target)`: `build(lower(), target)`, where what
  the stages after `lower` make (the generated source, the driver's code)
  is kept across processes under `key` (what `lower` depends on besides
  the compiler's code, which the stored key includes, with the target's
  kernel header, which names GRADC_LIBM's choice, and the versions of
  Python, Numba and llvmlite): a warm process goes from the key straight
  to loading the kernels.  Stored entries are checked (`runtime.loader`):
  a torn or corrupt one is built again and replaced.
- `emit(fn, stage, target)`: `fn`, as lower or autodiff made it, run on
  through `stage` (lower or autodiff: as it is) and printed: IR, the fused
  loops, kernel and driver source, or the kernels' LLVM IR.
"""
from __future__ import annotations

import marshal
import os
import pickle
import platform
import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import llvmlite
import numba

from gradlang.compiler import ast, autodiff, forward, passes
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.codegen import Generated, bound_by_arguments, generate
from gradlang.compiler.fusion import fuse, print_steps
from gradlang.compiler.hoisting import hoist_invariants
from gradlang.compiler.scalar_loops import scalar_loops
from gradlang.compiler.ir import Eqn, Function, StaticScalar, TensorType, Var, print_function
from gradlang.compiler.linearity import NotLinear
from gradlang.compiler.values import NotCompileTime
from gradlang.compiler.lower import Lowerer
from gradlang.compiler.namespace import Namespace, param_reads
from gradlang.compiler import parser
from gradlang.compiler.parser import parse
from gradlang.compiler.source import universal_newlines
from gradlang.compiler.shapes import NeedsConcrete, NeedsValue, Sym
from gradlang.compiler.verify import verify
from gradlang.runtime import target as targets
from gradlang.runtime.args import INTEGRAL, number_dtype
from gradlang.runtime.errors import GradError
from gradlang.runtime.forking import cached_attribute
from gradlang.runtime.loader import (
    compile_driver,
    load_kernel_modules,
    make_driver,
    store,
    stored,
)
from gradlang.runtime.target import Target

if TYPE_CHECKING:
    from gradlang.compiler.modules import ImportGraph


@dataclass(frozen=True)
class Stage:
    name: str
    emit: Optional[str]  # what `gradc show --emit` calls its output
    on_gradient: bool    # whether it can run on a derived gradient


STAGES: tuple[Stage, ...] = (
    Stage("parse", None, False),  # printed after check, as the checked AST
    Stage("check", "ast", False),
    Stage("lower", "lower", False),
    Stage("autodiff", "autodiff", True),
    Stage("inline", "inline", True),
    Stage("simplify", "simplify", True),
    Stage("cse", "cse", True),
    Stage("dce", "dce", True),
    Stage("fuse", "loops", True),
    Stage("codegen", "kernels", True),
    Stage("load", "llvm", True),
)
# `ir` is the optimized IR, what fusion reads (the last IR pass).
ALIASES = {"ir": "dce"}


# What a prefix of an `--emit` name runs the stages on: the value and
# gradient of the sum of the outputs, or the outputs and their tangents.
TRANSFORMS = ("grad", "jvp")


def _emit_names() -> tuple[str, ...]:
    names: list[str] = []
    for stage in STAGES:
        if stage.emit is None:
            continue
        if stage.name != "autodiff":  # autodiff's output is always a gradient
            names.append(stage.emit)
        if stage.on_gradient:
            names += [f"{t}-{stage.emit}" for t in TRANSFORMS]
    for alias in ALIASES:
        names += [alias] + [f"{t}-{alias}" for t in TRANSFORMS]
    return tuple(names)


EMITS: tuple[str, ...] = _emit_names()
IR_PASSES: tuple[tuple[str, Callable[[Function], Function]], ...] = (
    ("inline", passes.inline_calls),
    ("simplify", passes.simplify),
    ("cse", lambda fn: passes.cse(hoist_invariants(fn))),
    ("dce", passes.dce),
)


def stage_of(emit_name: str) -> tuple[str, Optional[str]]:
    """`--emit` name -> (stage name, the transform it runs on or None)."""
    transform = next((t for t in TRANSFORMS if emit_name.startswith(t + "-")), None)
    name = emit_name[len(transform) + 1:] if transform else emit_name
    name = ALIASES.get(name, name)
    return next(s.name for s in STAGES if s.emit == name), transform


# ------------------------------------------------------------ front end


def front_end(source: str, file: str, graph: Optional["ImportGraph"] = None
              ) -> tuple[ast.Module, Namespace]:
    """Parse and check a module and everything it imports: found on disk,
    or as `graph` records them (`modules.import_graph`, this module first)."""
    from gradlang.compiler.modules import in_graph, namespace_for, on_disk
    source = universal_newlines(source)  # (as `parse` reads it: errors show its lines)
    try:
        module = parse(source, file)
        namespace = namespace_for(module, on_disk if graph is None else in_graph(graph))
        check_linearity(namespace)
        return module, namespace
    except GradError as err:
        raise err.with_source(source)


def check_linearity(namespace: Namespace) -> None:
    """Every grad block of the module's functions checked for linearity in
    its upstream cotangents now, at load: each function with grad blocks
    is lowered at a representative signature (`_representative_types`),
    which runs the check (`compiler.linearity`).  A function no
    representative signature lowers is checked when first called.  The
    functions share the stages lowered (a chain of blocks calling the
    previous function's `grad` lowers each function once, not once per
    function calling it)."""
    stages = Lowerer(namespace)
    for fdef, home in namespace.functions.values():
        if home is not namespace or not fdef.grads:
            continue
        for types in _representative_types(fdef, namespace):
            try:
                _lower_by_value(stages, fdef, types)
                break
            except NotLinear as err:
                raise err.with_source(namespace.source_of(err.span.file)) from None
            except NotCompileTime as err:
                if err.of_upstream:  # (an error of the block at every signature)
                    raise err.with_source(namespace.source_of(err.span.file)) from None
                continue
            except (GradError, NeedsConcrete, RecursionError):
                continue  # an error of this signature, not of the blocks


def _lower_by_value(stages: Lowerer, fdef: ast.FuncDef, types: dict[str, TensorType]) -> None:
    """fdef lowered for `types`, again with each integer argument it needs
    the value of (`NeedsValue`: an axis, a count) as 0, as a `const` one
    is (`_representative_types`)."""
    types = dict(types)
    while True:
        try:
            stages.for_another_entry().lower_entry(fdef, types)
            return
        except NeedsValue as need:
            if isinstance(types[need.name], StaticScalar):  # (asked again: cannot happen)
                raise GradError(f"internal: {need}", fdef.span) from None
            types[need.name] = StaticScalar(types[need.name].dtype, (), 0)


def _representative_types(fdef: ast.FuncDef, namespace: Namespace
                          ) -> list[dict[str, TensorType]]:
    """Argument types to lower `fdef` with, most likely first: annotated
    parameters and params as annotated (named sizes 2, 3, ...; a kind's
    widest dtype, f64 for `float`), the others
    f64 scalars, then vectors, then matrices; parameters with a default
    take it."""
    sizes: dict[str, int] = {}

    def annotated(ann: ast.TypeAnn, rank: int) -> TensorType:
        dims = ann.dims if ann.dims is not None else (3,) * rank
        shape = tuple(d if isinstance(d, int) else sizes.setdefault(d, len(sizes) + 2)
                      for d in dims)
        return TensorType(number_dtype(ann.dtype or "f64"), shape)

    candidates = []
    for rank in (0, 1, 2):
        types: dict[str, TensorType] = {}
        for p in fdef.params:
            if p.default is not None:
                continue
            ann = p.ann
            if ann is not None and ann.const and ann.dtype in INTEGRAL:
                # an axis or index: 0
                types[p.name] = StaticScalar(number_dtype(ann.dtype), (), 0)
            else:
                types[p.name] = (annotated(ann, rank) if ann is not None
                                 else TensorType("f64", (3,) * rank))
        for w in param_reads(fdef, namespace):
            types[w] = annotated(namespace.params[w].type, rank)
        candidates.append(types)
    return candidates


def lower_entry(namespace: Namespace, fdef: ast.FuncDef,
                types: dict[str, TensorType]) -> Function:
    """`fdef` (defined in `namespace`'s module) lowered for `types`: its
    parameters passed, then the params it reads.  A `GradError` carries
    the source of the module it points into, for the caret line.

    A number made of a symbolic size (`0.1 / k`, `n - 1`) is a run-time
    number (`Lowerer.size_number`), but where something then needs it
    known at compile time (an `initial=`, a slice bound), the lowering
    fails: it is lowered again with such a number needing concrete sizes,
    as it did before there were run-time ones, so that the caller sees the
    `NeedsConcrete` of the size it used (and lowers for concrete sizes)."""
    try:
        lowerer = Lowerer(namespace)
        try:
            return lowerer.lower_entry(fdef, types)
        except (GradError, NeedsConcrete):
            if not lowerer.size_numbers:
                raise
        return Lowerer(namespace, numbers_of_sizes=False).lower_entry(fdef, types)
    except GradError as err:
        raise err.with_source(namespace.source_of(err.span.file))


# ----------------------------------------------------------- transforms


def grad_of_sum(fn: Function, wrt: Sequence[int], with_value: bool,
                first_only: bool = False) -> Function:
    """(params) -> ([outputs...,] d sum(outputs) / d params[wrt]...); with
    `first_only`, of the first output's sum, the others (auxiliary)
    returned with or without `with_value`."""
    return autodiff.grad_of_sum(fn, wrt, with_value, first_only)


def pullback(fn: Function, wrt: Sequence[int]) -> Function:
    """(params..., cotangents...) -> one cotangent per params[wrt]: the
    backward pass as a function of its own, which can be differentiated."""
    joint = autodiff.vjp(fn, wrt)
    n_out = len(fn.outputs)
    return Function(f"{fn.name}_pullback", joint.params, joint.eqns, joint.outputs[n_out:])


def vjp_programs(fn: Function, wrt: Sequence[int],
                 target: "Target | str") -> tuple["Program", "Program"]:
    """The forward program (params) -> (outputs..., residuals...) and the
    backward one (residuals..., cotangents...) -> one cotangent per
    params[wrt]: the joint vjp, optimized whole, then split so that the
    forward keeps only the residuals the backward reads, and, for sizes
    none of those carry, a residual of no elements that does
    (`carrying_sizes`)."""
    fwd, bwd = carrying_sizes(*_split_vjp(fn, wrt), len(fn.outputs))
    return build(fwd, target), build(bwd, target)


def carrying_sizes(fwd: Function, bwd: Function, n_out: int) -> tuple[Function, Function]:
    """A split vjp whose backward (residuals..., cotangents...) can bind
    every size symbol of the forward's parameters: a driver binds a symbol
    from an argument axis carrying it, and a backward that reads neither
    the argument nor a residual of its size (`sum(x)`'s broadcasts its
    cotangent to x's shape) would have none.  Such symbols get one more
    residual, last, of shape (symbols..., 0): it holds no elements, so a
    pullback keeping it keeps nothing of the call but its sizes."""
    missing = sorted(bound_by_arguments(fwd.params) - bound_by_arguments(bwd.params))
    if not missing:
        return fwd, bwd
    shape = tuple(Sym.named(s) for s in missing) + (0,)
    sizes = Var(TensorType("f64", shape), "sizes")
    made = Eqn("full", (), (sizes,), (("dtype", "f64"), ("shape", shape), ("value", 0.0)))
    n_residuals = len(fwd.outputs) - n_out
    residuals, cts = bwd.params[:n_residuals], bwd.params[n_residuals:]
    return (Function(fwd.name, fwd.params, fwd.eqns + (made,), fwd.outputs + (sizes,)),
            Function(bwd.name, residuals + (sizes,) + cts, bwd.eqns, bwd.outputs))


def vjp_passes(fn: Function, wrt: Sequence[int]) -> tuple[Function, Function]:
    """`vjp_programs`' cut as IR, for a caller that keeps fn's arguments
    itself: the forward pass (params) -> (outputs..., residuals...) and the
    backward pass (params..., residuals..., cotangents...) -> one cotangent
    per params[wrt], where the residuals are only the values the forward
    computes (an argument the backward reads it takes as its parameter,
    not as a copy the forward returns)."""
    fwd, bwd = _split_vjp(fn, wrt)
    n_out = len(fn.outputs)
    computed = tuple(r for r in fwd.outputs[n_out:] if r not in fwd.params)
    n_cts = len(bwd.params) - len(fwd.outputs) + n_out
    return (Function(fwd.name, fwd.params, fwd.eqns, fwd.outputs[:n_out] + computed),
            Function(bwd.name, fwd.params + computed + bwd.params[len(bwd.params) - n_cts:],
                     bwd.eqns, bwd.outputs))


def _split_vjp(fn: Function, wrt: Sequence[int]) -> tuple[Function, Function]:
    """The joint vjp, optimized whole, cut (`autodiff.split`)."""
    joint = optimize(autodiff.vjp(fn, wrt), keep_barriers=True)
    return autodiff.split(joint, len(fn.params), len(fn.outputs))


def directional(fn: Function, types: dict[str, TensorType], wrt: str, v: str) -> Function:
    """(types...) -> grad_wrt <fn(...), v>: fn (whose parameters are
    `types` without `v`, and whose one output has the shape of `wrt`)
    contracted with `v`, then differentiated along `wrt`."""
    b = Builder()
    params = [Var(t, n) for n, t in types.items()]
    env = dict(zip(types, params))
    (g,) = inline(b, fn, [env[n] for n in types if n != v])
    direction = env[v]
    if direction.type.dtype != g.type.dtype:
        direction = b.bind("cast", direction, dtype=g.type.dtype)
    gv = b.bind("mul", g, direction)
    axes = tuple(range(gv.type.rank))
    total = b.bind("reduce_sum", gv, axes=axes) if axes else gv
    contracted = b.function(f"{fn.name}_dir", params, [total])
    return autodiff.grad_of_sum(contracted, [list(types).index(wrt)], False)


def jvp(fn: Function, wrt: Sequence[int]) -> Function:
    """(params..., tangents of params[wrt]...) -> (outputs..., output
    tangents...): forward mode, through grad blocks by transposing them."""
    return forward.jvp(fn, wrt)


def select(fn: Function, index: int) -> Function:
    """fn with only its output `index`."""
    return Function(fn.name, fn.params, fn.eqns, (fn.outputs[index],))


# ------------------------------------------------------------ back end


def verifying() -> bool:
    return os.environ.get("GRADC_VERIFY", "") not in ("", "0")


def optimize(fn: Function, keep_barriers: bool = False, stop: str = "dce") -> Function:
    """The IR passes in order, up to and including `stop`; `keep_barriers`
    for a joint function that `autodiff.split` will cut into forward and
    backward passes."""
    if verifying():
        verify(fn, "lower/autodiff")
    for stage, run in IR_PASSES:
        fn = passes.simplify(fn, keep_barriers) if stage == "simplify" else run(fn)
        if verifying():
            verify(fn, stage)
        if stage == stop:
            break
    return fn


@dataclass
class Program:
    """Loaded code for one function at one signature; `ir` is the optimized
    IR it was generated from (worked out again when asked, for a program
    loaded from the store, which keeps only its parameters' and results'
    types)."""

    generated: Generated
    run: Callable
    run_contiguous: Callable  # the same, for C-contiguous arguments only
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]
    optimized: Callable[[], Function]
    kernels: Any = None  # the namespace of the kernels the drivers launch (their `K`)

    @cached_attribute
    def ir(self) -> Function:
        return self.optimized()

    def __call__(self, *arrays):
        return self.run(*arrays)


def build(fn: Function, target: "Target | str" = targets.DEFAULT) -> Program:
    target = targets.get(target)
    return _load(*_generated(fn, target), target)


def _generated(fn: Function, target: Target) -> tuple:
    """(generated code, its drivers compiled, the types, the optimized IR's
    getter): what `_load` loads, from fn fresh from lowering."""
    fn = optimize(fn)
    generated = generate(fn, target)
    return generated, _compile_drivers(generated), (fn.in_types, fn.out_types), lambda: fn


def _compile_drivers(generated: Generated) -> tuple:
    return (compile_driver(generated.driver_source),
            compile_driver(generated.contiguous_driver_source))


def _load(generated: Generated, drivers: tuple, types: tuple,
          optimized: Callable[[], Function], target: Target) -> Program:
    if os.environ.get("GRADC_PRINT_SOURCE", "") not in ("", "0"):
        print(generated.kernel_source, generated.driver_source, sep="\n", file=sys.stderr)
    kernels = load_kernel_modules(generated.kernel_modules)
    trips: dict = {}  # (both drivers run the program's loops)
    run, run_contiguous = (make_driver(d, kernels, target.helpers, trips) for d in drivers)
    return Program(generated, run, run_contiguous, *types, optimized, kernels)


def build_stored(key: tuple, lower: Callable[[], Function],
                 target: "Target | str" = targets.DEFAULT) -> Program:
    """`build(lower(), target)`, through the program store (module
    docstring).  `key`: a tuple of plain values (its repr is what is
    compared), naming everything `lower`'s result depends on besides the
    compiler's code.  Under GRADC_VERIFY the pipeline always runs, since
    verifying it is the point."""
    target = targets.get(target)
    if verifying():
        return build(lower(), target)
    text = repr((_stamp(), target.name, target.header, key))
    data = stored("programs", text)
    if data is not None:
        try:
            values, drivers, types = marshal.loads(data)
            return _load(Generated(*values), drivers, pickle.loads(types),
                         lambda: optimize(lower()), target)
        except Exception:  # noqa: BLE001 (an entry of another layout: built again
            pass           # below, and replaced)
    generated, drivers, types, optimized = _generated(lower(), target)
    values = tuple(getattr(generated, f.name) for f in fields(Generated))
    store("programs", text, marshal.dumps((values, drivers, pickle.dumps(types))))
    return _load(generated, drivers, types, optimized, target)


def _stamp() -> tuple:
    """What a stored program depends on besides its key: the compiler's
    code (and the runtime's and the grammar's, which decide what it
    generates), and the versions of what reads the stored code (marshal's
    format is Python's; the kernels compile with Numba and llvmlite)."""
    return (parser.code_stamp(), sys.version, platform.machine(), numba.__version__, llvmlite.__version__)


def emit(fn: Function, stage: str, target: "Target | str" = targets.DEFAULT) -> str:
    """`fn`, fresh from lower or autodiff, run up to `stage` and printed."""
    target = targets.get(target)
    if stage in ("lower", "autodiff"):
        return print_function(fn)
    if stage in dict(IR_PASSES):
        return print_function(optimize(fn, stop=stage))
    fn = optimize(fn)
    if stage == "fuse":
        fn = scalar_loops(fn)
        return print_steps(fn, fuse(fn, reductions=target.fuses_reductions,
                                    max_arrays=target.max_kernel_arrays))
    generated = generate(fn, target)
    if stage == "codegen":
        return generated.kernel_source + "\n" + generated.driver_source
    return _machine_code(fn.name, generated, target)


def _machine_code(name: str, generated: Generated, target: Target) -> str:
    """What the target compiles each kernel to (LLVM IR on the CPU),
    compiled now for the kernel's argument types, never read from a cache;
    a program with no kernel says so (an empty output looked like a failure)."""
    if not generated.kernel_signatures:
        return f"; {name} has no kernels: its driver does every step (--emit kernels shows it)"
    kernels = load_kernel_modules(generated.kernel_modules)
    return "\n".join(f"; kernel {name} ({signature})\n"
                     f"{target.compiled_ir(kernels, name, signature)}"
                     for name, signature in generated.kernel_signatures)
