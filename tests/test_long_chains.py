"""Long chains of binary operators, as machine-generated sources hold them.

`x + x + ... + x` nests once per operator down its left side.  Every pass
that walks expressions (the parser's transformer, the checker, the
namespace scan, the lowering) loops down such a chain instead of recursing
into it, so a chain of any length compiles, differentiates (reverse and
forward mode) and reaches codegen.  Nesting on the right (parentheses
around a sum, unary operators, calls) still recurses: past Python's stack it
is a `GradError` at the line, never a RecursionError or a crash.

The chains are 1,200 operators long: past Python's default recursion limit
(1,000 frames) even for a pass that spends a single frame per operator, the
old lowering failed at about 490; the sizes keep each test to seconds (the
figures for 10,000 terms are in the report of the change).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dsl
from dsl.function import _types
from gradlang.compiler import fusion, pipeline, sharing
from gradlang.compiler.interpret import interpret

N = 1200
X = np.array([1.0, 0.9995, 1.0004])


def lowered(source: str, x: np.ndarray):
    f = dsl.loads(source, "chain.grad").f
    return f.lower(_types(f.bind((x,), {})))


def value_gradient_tangent(source: str, x: np.ndarray):
    """f(x), d sum(f) / dx and the tangent of f along ones, from the IR
    (interpreted: no kernel is compiled), and f's gradient as kernel text."""
    fn = lowered(source, x)
    (value,) = interpret(pipeline.optimize(fn), x)
    (gradient,) = interpret(pipeline.optimize(pipeline.grad_of_sum(fn, [0], False)), x)
    _, tangent = interpret(pipeline.optimize(pipeline.jvp(fn, [0])), x, np.ones_like(x))
    kernels = pipeline.emit(pipeline.grad_of_sum(fn, [0], True), "codegen")
    compile(kernels, "<kernels>", "exec")  # Python takes the generated text
    return value, gradient, tangent


@pytest.mark.parametrize("op,value,gradient", [
    ("+", lambda x: N * x, lambda x: N + 0 * x),
    ("-", lambda x: (2 - N) * x, lambda x: (2 - N) + 0 * x),
    ("*", lambda x: x ** N, lambda x: N * x ** (N - 1)),
    ("/", lambda x: x ** (2 - N), lambda x: (2 - N) * x ** (1 - N)),
])
def test_a_chain_of_an_operator_has_its_value_and_gradient(op, value, gradient):
    # N terms, N - 1 operators: 490 of them raised "nested too deeply".
    source = "def f(x):\n    return " + f" {op} ".join(["x"] * N) + "\n"
    got_value, got_gradient, got_tangent = value_gradient_tangent(source, X)
    np.testing.assert_allclose(got_value, value(X), rtol=1e-11)
    np.testing.assert_allclose(got_gradient, gradient(X), rtol=1e-11)
    np.testing.assert_allclose(got_tangent, gradient(X), rtol=1e-11)


def test_a_sum_of_scaled_terms_has_the_sum_of_the_scales_as_gradient():
    # mixed + and -, over products (a chain of chains): d/dx sum_k s_k c_k x
    scales = [(k % 7 + 1) * (-1 if k % 3 == 1 else 1) for k in range(N)]
    terms = [f"{abs(c)}.0 * x" for c in scales]
    source = "def f(x):\n    return " + terms[0] + "".join(
        f" {'+' if c > 0 else '-'} {t}" for c, t in zip(scales[1:], terms[1:])) + "\n"
    x = np.array([0.5, -2.0, 3.0])
    value, gradient, tangent = value_gradient_tangent(source, x)
    np.testing.assert_allclose(value, sum(scales) * x, rtol=1e-12)
    np.testing.assert_allclose(gradient, np.full(3, sum(scales)), rtol=1e-12)
    np.testing.assert_allclose(tangent, np.full(3, sum(scales)), rtol=1e-12)


@pytest.mark.parametrize("op,reduce", [("and", np.logical_and), ("or", np.logical_or)])
def test_a_chain_of_and_or_of_comparisons_selects_as_numpy(op, reduce):
    thresholds = np.linspace(-1.0, 1.0, N).tolist()
    test = f" {op} ".join(f"x > {t!r}" for t in thresholds)
    source = f"def f(x):\n    return where({test}, 3.0 * x, x)\n"
    x = np.array([-1.5, -0.2, 0.4, 1.5])
    chosen = reduce.reduce(x[None, :] > np.array(thresholds)[:, None], axis=0)
    value, gradient, tangent = value_gradient_tangent(source, x)
    np.testing.assert_array_equal(chosen, [False, op == "or", op == "or", True])
    np.testing.assert_allclose(value, np.where(chosen, 3.0 * x, x))
    np.testing.assert_allclose(gradient, np.where(chosen, 3.0, 1.0))
    np.testing.assert_allclose(tangent, np.where(chosen, 3.0, 1.0))


def test_and_or_decided_at_compile_time_do_not_lower_their_right_side():
    # as in Python: x.shape[1] of a vector would be an error, and is not read
    source = ("def f(x):\n    s = x\n    if x.ndim == 2 and x.shape[1] == 3:\n        s = x * 2\n"
              "    if x.ndim == 1 or x.shape[1] == 3:\n        s = s + 1\n"
              "    return where(x.ndim == 1 or x.shape[5] > 0, s, x)\n")
    x = np.array([0.5, -2.0])
    (value,) = interpret(pipeline.optimize(lowered(source, x)), x)
    np.testing.assert_array_equal(value, x + 1)


def test_a_long_chain_runs_through_the_public_api():
    # the chain is compile-time arithmetic (folded): a small kernel to compile
    m = dsl.loads("def f(x):\n    return x * (" + " + ".join(["1"] * N) + ")\n")
    x = np.array([0.5, -2.0])
    np.testing.assert_allclose(m.f(x), N * x)
    np.testing.assert_allclose(dsl.grad(m.f)(x), np.full(2, float(N)))


def test_a_loop_is_cut_where_numba_would_compile_it_in_superlinear_time():
    fn = pipeline.optimize(lowered("def f(x):\n    return " + " + ".join(["x"] * 2501) + "\n",
                                   X))
    loops = [s for s in fusion.fuse(fn) if isinstance(s, fusion.Loop)]
    assert [len(loop.eqns) for loop in loops] == [1000, 1000, 500]
    assert [len(loop.outputs) for loop in loops] == [1, 1, 1]


def test_sharing_kernels_between_the_loops_of_a_cut_chain_is_linear(monkeypatch):
    # Each equation of the larger loop was tried against every one of the
    # smaller, copying the match so far each time: 4.0 million tries, 26 s.
    tries = []
    matches = sharing._matches
    monkeypatch.setattr(sharing, "_matches", lambda *args: tries.append(1) or matches(*args))
    fn = lowered("def f(x):\n    return " + " * ".join(["x"] * N) + "\n", X)
    pipeline.emit(pipeline.grad_of_sum(fn, [0], True), "codegen")
    assert 0 < len(tries) < 100 * N


def test_the_loops_of_a_cut_chain_pass_on_its_value_and_gradient(monkeypatch, tmp_path):
    # cut every 12 equations: small kernels to compile, 2 cuts in the value
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fusion, "MAX_LOOP_EQNS", 12)
    scales = np.arange(1.0, 11.0)
    terms = (f"sin({c} * x)" for c in scales.tolist())
    source = "def f(x):\n    return " + " + ".join(terms) + "\n"
    f = dsl.loads(source).f
    x = np.array([0.3, -1.2, 2.0])
    assert len(f.program(f.bind((x,), {})).generated.kernel_names) > 1
    np.testing.assert_allclose(f(x), np.sin(np.outer(x, scales)).sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(dsl.grad(f)(x), np.cos(np.outer(x, scales)) @ scales,
                               rtol=1e-12)


def test_nesting_on_the_right_past_the_stack_is_an_error_at_its_line():
    source = ("def f(x):\n    y = x * 2.0\n    return " + "(x + " * 3000 + "y"
              + ")" * 3000 + "\n")
    with pytest.raises(dsl.GradError, match="nested too deeply") as info:
        dsl.loads(source, "deep.grad")
    err = info.value
    assert (err.file, err.line, err.col) == ("deep.grad", 3, 1)
    rendered = str(err).splitlines()
    assert rendered[0] == "deep.grad:3:1: error: expression is nested too deeply"
    assert rendered[1].strip().startswith("return (x + (x +") and rendered[2].strip() == "^"


# Each form nests on the right (or deeper than any stack for a recursive
# pass) far past Python's stack; a C-stack overflow would kill the process,
# so the child prints what each gives and the parent reads it.
PATHOLOGICAL = textwrap.dedent("""
    import numpy as np
    import dsl
    forms = {"parentheses": "(" * 100_000 + "x" + ")" * 100_000,
             "sum": "(x + " * 3_000 + "x" + ")" * 3_000,
             "negation": "-" * 3_000 + "x",
             "not": "not " * 3_000 + "x",
             "power": "x ** " * 3_000 + "x",
             "calls": "sin(" * 3_000 + "x" + ")" * 3_000}
    for name, text in forms.items():
        try:
            print(name, dsl.loads("def f(x):\\n    return " + text + "\\n").f(np.ones(2)))
        except dsl.GradError as err:
            print(name, err.line, err.col, str(err).splitlines()[0])
""")


def test_pathological_nesting_is_an_error_and_never_a_crash(tmp_path):
    result = subprocess.run([sys.executable, "-c", PATHOLOGICAL], capture_output=True,
                            text=True, timeout=600,
                            env={**os.environ, "GRADC_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    error = "2 1 <string>:2:1: error: expression is nested too deeply"
    assert result.stdout.splitlines() == [
        "parentheses [1. 1.]",  # brackets around one name are no nesting at all
        *(f"{name} {error}" for name in ("sum", "negation", "not", "power", "calls"))]


def test_an_elif_chain_selects_its_branch_by_one_instruction_per_where():
    # Each `where` in a kernel is a call of `select` (one LLVM select), not a
    # conditional expression: Numba's SSA pass is quadratic in the blocks a
    # conditional expression makes, and a 100-branch chain took seconds.
    branches = 12
    lines = ["def f(x, k: i64):", "    if k == 0:", "        y = sin(x)"]
    for i in range(1, branches):
        lines += [f"    elif k == {i}:", f"        y = x * {i}.0 + {i}.0 * x * x"]
    lines += ["    else:", "        y = -x", "    return y"]
    m = dsl.loads("\n".join(lines) + "\n", "chain.grad")
    x = np.array([0.5, -2.0, 3.0])
    grad = dsl.grad(m.f)
    for k in (-1, 0, 1, 7, branches - 1, branches):
        want, slope = ((np.sin(x), np.cos(x)) if k == 0 else
                       (k * x + k * x * x, k + 2 * k * x) if 0 < k < branches else (-x, -np.ones(3)))
        np.testing.assert_allclose(m.f(x, k), want, rtol=1e-15)
        np.testing.assert_allclose(grad(x, k), slope, rtol=1e-15)
    program = m.f.program(m.f.bind((x, 3), {}))
    (kernel,) = {source for _, source in program.generated.kernels}
    assert kernel.count("select(") == 2 * branches  # parallel and serial variants
    assert " if " not in kernel


# ------------------------------------------------------- long elif chains

ARMS = 500


def elif_source(condition, body, else_body="y = -x", header="def f(x):", arms=ARMS):
    """`header` and an if/elif chain of `arms` arms and an else, then `return y`."""
    lines = [header]
    for i in range(arms):
        lines += [f"    {'elif' if i else 'if'} {condition(i)}:", f"        {body(i)}"]
    return "\n".join(lines + ["    else:", f"        {else_body}", "    return y"]) + "\n"


def test_a_long_elif_chain_on_a_runtime_condition_has_its_value_and_gradient():
    # an elif nests once per arm on the right: 490 arms were "nested too deeply"
    source = elif_source(lambda i: f"sum(x) < {i - 249.5}", lambda i: f"y = x * {i}.0 + {i}.0")
    fn = lowered(source, X)
    value_fn = pipeline.optimize(fn)
    gradient_fn = pipeline.optimize(pipeline.grad_of_sum(fn, [0], False))
    tangent_fn = pipeline.optimize(pipeline.jvp(fn, [0]))
    for x in (np.array([0.25, -100.0, 0.5]), np.array([1.0, 2.0, 3.0]), np.full(3, 99.0)):
        arm = next((i for i in range(ARMS) if x.sum() < i - 249.5), None)
        scale = -1.0 if arm is None else float(arm)
        (value,) = interpret(value_fn, x)
        (gradient,) = interpret(gradient_fn, x)
        _, tangent = interpret(tangent_fn, x, np.ones_like(x))
        np.testing.assert_array_equal(value, -x if arm is None else arm * x + arm)
        np.testing.assert_array_equal(gradient, np.full(3, scale))
        np.testing.assert_array_equal(tangent, np.full(3, scale))


def test_an_elif_chain_mixing_compile_time_and_runtime_conditions_takes_the_first_true():
    # `k` is const: arms on it are decided when compiled, the others at run
    # time; every arm binds y, and only the odd ones bind z, which is read
    # only in the arm itself (the checker refuses z after the if).
    arms = 120
    source = elif_source(
        lambda i: f"k == {i}" if i % 3 == 0 else f"sum(x) > {i}.0",
        lambda i: f"y = x * {i}.0" if i % 2 == 0 else f"z = x + {i}.0\n        y = z * z",
        header="def f(x, k: const):", arms=arms)
    f = dsl.loads(source, "chain.grad").f

    def reference(x, k):
        for i in range(arms):
            if (k == i) if i % 3 == 0 else (x.sum() > i):
                return (x * i, np.full(x.shape, float(i))) if i % 2 == 0 else \
                    ((x + i) ** 2, 2 * (x + i))
        return -x, -np.ones_like(x)

    # arm 9 (k), arm 1 (at run time, before k's), and the else after them all
    for x, k in ((np.array([0.5, 0.25]), 9), (np.array([2.5, 0.25]), 9), (np.array([-3.0]), 7)):
        bound = f.bind((x, k), {})
        fn = f.lower(_types(bound, f.static_names(bound)))
        (value,) = interpret(pipeline.optimize(fn), x, np.int64(k))
        (gradient,) = interpret(pipeline.optimize(pipeline.grad_of_sum(fn, [0], False)), x,
                                np.int64(k))
        want, slope = reference(x, k)
        np.testing.assert_allclose(value, want, rtol=1e-15)
        np.testing.assert_allclose(gradient, slope, rtol=1e-15)


def test_a_long_elif_chain_on_a_const_compiles_its_arm_quickly():
    # only the arm taken is lowered: a small kernel, whichever arm
    source = elif_source(lambda i: f"k == {i}", lambda i: f"y = x * {i}.0")
    m = dsl.loads(source.replace("def f(x):", "def f(x, k: const):"), "chain.grad")
    x = np.array([0.5, -2.0])
    for k in (0, ARMS - 1, ARMS):
        scale = -1.0 if k == ARMS else float(k)
        np.testing.assert_array_equal(m.f(x, k), scale * x)
        np.testing.assert_array_equal(dsl.grad(m.f)(x, k), np.full(2, scale))


def test_a_name_bound_by_all_but_one_arm_of_a_long_chain_is_not_defined_after_it():
    source = elif_source(lambda i: f"sum(x) < {i}.0",
                         lambda i: "w = x" if i == 321 else "y = x")
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "chain.grad")
    err = info.value
    assert (err.line, err.col) == (2 * ARMS + 4, 12)
    assert err.message == ("name 'y' is bound in only some branches of the if at line 2; "
                           "bind it in every branch (or before the if)")
    assert str(err).splitlines()[1:] == ["        return y", " " * 15 + "^"]


def test_blocks_nest_as_deep_as_in_python_and_deeper_is_an_error_at_the_line():
    def nested(depth):
        lines = ["def f(x):", "    y = x"]
        lines += ["    " * (i + 1) + f"if sum(x) > {i - 50}.0:" for i in range(depth)]
        return "\n".join(lines + ["    " * (depth + 1) + "y = x * 3.0", "    return y"]) + "\n"

    x = np.array([1.0, -0.5])  # sum 0.5: the innermost if is taken at depth 50
    for depth, taken in ((50, True), (98, False)):
        value, gradient, tangent = value_gradient_tangent(nested(depth), x)
        np.testing.assert_array_equal(value, 3.0 * x if taken else x)
        np.testing.assert_array_equal(gradient, np.full(2, 3.0 if taken else 1.0))
    for depth in (99, 1000):  # as Python's "too many levels of indentation"
        with pytest.raises(dsl.GradError) as info:
            dsl.loads(nested(depth), "deep.grad")
        err = info.value
        assert (err.file, err.line, err.col) == ("deep.grad", 102, 401)
        assert err.message == ("too many levels of indentation: blocks nest at most 99 deep, "
                               "as in Python")
        assert str(err).splitlines()[2] == " " * 404 + "^"


def _nested_loops(name: str, inner: str, depth: int, first: str = "s = x") -> str:
    lines = [f"def {name}(x):", f"    {first}"]
    lines += ["    " * (k + 1) + f"for i{k} in range(1):" for k in range(depth)]
    return "\n".join(lines + ["    " * (depth + 1) + inner, "    return s"]) + "\n"


@pytest.mark.parametrize("source,line,col,note", [
    # 98 loops, as the parser allows, but the driver indents a compiled
    # loop's trips two levels deeper than its function
    (_nested_loops("f", "s = s + x[i0] * 0.0", 98, "s = sum(x)"), 100, 393, None),
    # each function's loops 50 deep, but the call is inlined: 100 nested
    (_nested_loops("g", "s = s * 2.0", 50) + _nested_loops("f", "s = g(s)", 50), 52, 201,
     "in g(), called at deep.grad:107:209"),  # (g's innermost loop; f's innermost line)
])
def test_loops_nested_too_deep_for_python_are_an_error_at_the_innermost(source, line, col,
                                                                         note):
    # the driver nests a function per loop: past Python's 99 levels of
    # indentation, its tokenizer refused it (IndentationError, a traceback)
    m = dsl.loads(source, "deep.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(np.ones(2))
    err = info.value
    assert (err.file, err.line, err.col, err.note) == ("deep.grad", line, col, note), str(err)
    assert err.message == ("loops nest too deep here for the Python driver that runs them "
                           "(at most 99 levels of indentation; a called function's loops "
                           "nest inside its caller's)")
