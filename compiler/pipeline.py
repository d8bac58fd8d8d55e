"""The compiler's stages, in order, as one readable list.

    parse -> check -> lower -> autodiff -> inline -> simplify -> cse -> dce
          -> fuse -> codegen

Contract: `front_end(source, file)` runs parse and check (of the module
and its imports) and returns the module and its namespace; `optimize(fn)` runs the IR passes
(verifying between them when GRADC_VERIFY=1); `build(fn, target)` runs
them and codegen and returns loaded, callable code (`Program`).  `lower`
and `autodiff` are driven by `dsl.function`, which knows which transform
the user asked for.  `gradc show --emit STAGE` stops after any stage.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

from gradlang.compiler import ast, passes
from gradlang.compiler.codegen import Generated, generate
from gradlang.compiler.ir import Function
from gradlang.compiler.lower import Namespace
from gradlang.compiler.parser import parse
from gradlang.compiler.verify import verify
from gradlang.runtime import target as targets
from gradlang.runtime.errors import GradError, Span
from gradlang.runtime.loader import load_kernels, make_driver
from gradlang.runtime.target import Target

IR_PASSES: tuple[tuple[str, Callable[[Function], Function]], ...] = (
    ("inline", passes.inline_calls),
    ("simplify", passes.simplify),
    ("cse", passes.cse),
    ("dce", passes.dce),
)


def front_end(source: str, file: str) -> tuple[ast.Module, Namespace]:
    """Parse and check a module and everything it imports."""
    from gradlang.compiler.modules import namespace_for
    try:
        module = parse(source, file)
        return module, namespace_for(module)
    except GradError as err:
        raise err.with_source(source)
    except RecursionError:
        raise too_deep(source, file) from None


def too_deep(source: str, file: str) -> GradError:
    """Nesting beyond Python's recursion limit, reported at the line with
    the most brackets and operators (where the nesting must be)."""
    lines = source.split("\n")
    score = [sum(line.count(c) for c in "([-+*/not") for line in lines]
    line = score.index(max(score)) + 1
    return GradError("expression is nested too deeply", Span(file, line, 1), source)


def verifying() -> bool:
    return os.environ.get("GRADC_VERIFY", "") not in ("", "0")


def optimize(fn: Function, keep_barriers: bool = False) -> Function:
    """The IR passes in order; `keep_barriers` for a joint function that
    `autodiff.split` will cut into forward and backward passes."""
    if verifying():
        verify(fn, "lower/autodiff")
    for stage, run in IR_PASSES:
        fn = passes.simplify(fn, keep_barriers) if stage == "simplify" else run(fn)
        if verifying():
            verify(fn, stage)
    return fn


@dataclass
class Program:
    """Loaded code for one function at one signature."""

    ir: Function
    generated: Generated
    run: Callable

    def __call__(self, *arrays):
        return self.run(*arrays)


def build(fn: Function, target: "Target | str" = targets.DEFAULT) -> Program:
    target = targets.get(target)
    fn = optimize(fn)
    generated = generate(fn, target)
    if os.environ.get("GRADC_PRINT_SOURCE", "") not in ("", "0"):
        print(generated.kernel_source, generated.driver_source, sep="\n", file=sys.stderr)
    kernels = load_kernels(generated.kernel_source)
    return Program(fn, generated, make_driver(generated.driver_source, kernels, target.helpers))
