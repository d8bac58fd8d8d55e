"""Return annotations (`def f(x) -> f64[n]:`) are checks with a parameter
annotation's meaning: a result that contradicts one is a `GradError` at the
annotation when the function is compiled for a call, whichever way it is
called; a correct one changes nothing."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsl
from dsl.check import check_function
from dsl.cli import main
from dsl.function import _symbolic as symbolic_types
from gradlang.compiler.ir import TensorType
from gradlang.compiler.shapes import NeedsConcrete
from helpers import central_difference

FILE = "ret.grad"


def error_of(source: str, name: str, *args) -> dsl.GradError:
    """The error of calling `name` from `source` on `args`."""
    module = dsl.loads(source, FILE)
    with pytest.raises(dsl.GradError) as info:
        getattr(module, name)(*args)
    return info.value


def assert_at_annotation(err: dsl.GradError, source: str, annotation: str, message: str,
                         entry: str = ""):
    """`err` is `message`, at `annotation` (the first `-> annotation` of
    `source`), with the line and a caret under the annotation; and where
    the annotated function is not `entry` (the one called from Python), a
    note naming the call that reached it."""
    offset = source.index(f"-> {annotation}:") + 3
    line = source.count("\n", 0, offset) + 1
    col = offset - (source.rfind("\n", 0, offset) + 1) + 1
    assert (err.file, err.line, err.col) == (FILE, line, col), str(err)
    assert err.message == message
    rendered = str(err).splitlines()
    assert rendered[0] == f"{FILE}:{line}:{col}: error: {message}"
    assert rendered[1:3] == ["    " + source.splitlines()[line - 1],
                             "    " + " " * (col - 1) + "^" * len(annotation)]
    annotated = re.findall(r"def (\w+)\(", source[:offset])[-1]
    if entry and annotated != entry:
        call = source.index(f"{annotated}(", offset)
        at = f"{source.count(NEWLINE, 0, call) + 1}:{call - source.rfind(NEWLINE, 0, call)}"
        assert rendered[3:] == [f"note: in {annotated}(), called at {FILE}:{at}"]
    else:
        assert rendered[3:] == []


NEWLINE = "\n"
X3 = np.array([0.5, -1.0, 2.0])
X4 = np.array([0.5, -1.0, 2.0, 3.0])

# (source, function, arguments, annotation, message)
MISMATCHES = [
    ("def f(x: f64[n]) -> f32[n]:\n    return x * 2.0\n", "f", (X3,), "f32[n]",
     "the result of f() has dtype f64, but its annotation says f32"),
    # an integer result is not a float, as an integer array is no f64 argument
    ("def f(x: i64[n]) -> f64[n]:\n    return x + 1\n", "f", (np.arange(3),), "f64[n]",
     "the result of f() has dtype i64, but its annotation says f64"),
    ("def f(x) -> f64:\n    return sin(x)\n", "f", (X3,), "f64",
     "the result of f() has rank 1 (shape [3]), but its annotation f64 has rank 0"),
    ("def f(x) -> f64[n, m]:\n    return x\n", "f", (X3,), "f64[n, m]",
     "the result of f() has rank 1 (shape [3]), but its annotation f64[n, m] has rank 2"),
    ("def f(x) -> f64[4]:\n    return x\n", "f", (X3,), "f64[4]",
     "the result of f() has size 3 on axis 0, but its annotation says 4"),
    ("def f(x: f64[n], y: f64[m]) -> f64[n]:\n    return y * 2.0\n", "f", (X3, X4), "f64[n]",
     "the result of f() has size 4 on axis 0, but its annotation says n, which is 3 for 'x'"),
    # a name no parameter binds is bound by the result: k, k is square
    ("def f(x, y) -> f64[k, k]:\n    return reshape(x, [-1, 1]) * y\n", "f", (X3, X4),
     "f64[k, k]",
     "the result of f() has size 4 on axis 1, but its annotation says k, which is 3 on its "
     "axis 0"),
    ("def g(x):\n    return x, x\n\ndef f(x) -> f64[...]:\n    return g(x)\n", "f", (X3,),
     "f64[...]", "the result of f() is a tuple of 2 values, but its annotation f64[...] "
     "describes one array"),
    ("def f() -> i64:\n    return 0.5\n", "f", (), "i64",
     "the result 0.5 of f() is not a value of its dtype i64"),
    ("def f(x) -> bool:\n    return x.shape[0]\n", "f", (X3,), "bool",
     "the result 3 of f() is not a value of its dtype bool"),
    ("def f() -> i32:\n    return 3000000000\n", "f", (), "i32",
     "the constant 3000000000 does not fit in i32"),
    # a grad block changes nothing: the function's result is checked
    ("def f(x: f64[n]) -> f32[n]:\n    return x * x\ngrad(g):\n    return 2.0 * g * x\n",
     "f", (X3,), "f32[n]", "the result of f() has dtype f64, but its annotation says f32"),
    ("@pass_through\ndef f(x) -> f64:\n    return x * 1.0\n", "f", (X3,), "f64",
     "the result of f() has rank 1 (shape [3]), but its annotation f64 has rank 0"),
    # an inlined callee's annotation is checked where it is written
    ("def h(x) -> f64[2]:\n    return x\n\ndef f(x):\n    return h(x) + 1.0\n", "f", (X3,),
     "f64[2]", "the result of h() has size 3 on axis 0, but its annotation says 2"),
    ("def f(x: f64[n]) -> f64[n]:\n    return concatenate([x, x])\n", "f", (X3,), "f64[n]",
     "the result of f() has size 6 on axis 0, but its annotation says n, which is 3 for 'x'"),
]


@pytest.mark.parametrize("source,name,args,annotation,message", MISMATCHES)
def test_a_result_that_contradicts_its_annotation_is_an_error_there(
        source, name, args, annotation, message):
    assert_at_annotation(error_of(source, name, *args), source, annotation, message, name)


def test_several_results_cannot_be_annotated():
    source = "def f(x) -> f64:\n    return x, x\n"
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, FILE)  # at load: the count is syntax
    assert_at_annotation(info.value, source, "f64",
                         "f() returns 2 values, but a return annotation describes one result "
                         "(several results cannot be annotated)")


def test_the_error_points_into_the_module_that_holds_the_annotation(tmp_path):
    (tmp_path / "lib.grad").write_text("def twice(x) -> f32[...]:\n    return x * 2.0\n")
    main_file = tmp_path / "main.grad"
    main_file.write_text("from lib import twice\n\ndef f(x):\n    return twice(x)\n")
    with pytest.raises(dsl.GradError) as info:
        dsl.load(main_file).f(X3)
    err = info.value
    assert (err.file, err.line, err.col) == (str(tmp_path / "lib.grad"), 1, 17)
    assert str(err).splitlines()[1:] == ["    def twice(x) -> f32[...]:",
                                         "    " + " " * 16 + "^" * 8,
                                         f"note: in twice(), called at {main_file}:4:12"]


SOURCE = """\
def product(a: f64[n, k], b: f64[k, m]) -> f64[n, m]:
    return a @ b

def outer(x, y) -> f64[p, q]:
    return reshape(x, [-1, 1]) * y

def square(x: f64[n]) -> f64[n, n]:
    return reshape(x, [-1, 1]) * x

def total(x: f32[...]) -> f32:
    return sum(x)

def count(x) -> i64:
    return x.shape[0]

def scaled(x) -> f64[...]:
    return x * count(x)

def half() -> f32:
    return 0.5

def one() -> f64:
    return 1

def cube(x: f64[n]) -> f64[n]:
    return x * x * x
grad(g):
    return 3.0 * g * x * x
"""


@pytest.fixture(scope="module")
def module():
    return dsl.loads(SOURCE, FILE)


def test_correct_annotations_leave_values_unchanged(module):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(3, 4))
    np.testing.assert_allclose(module.product(a, b), a @ b, rtol=1e-12)
    np.testing.assert_allclose(module.outer(X3, X4), np.outer(X3, X4), rtol=1e-12)
    np.testing.assert_allclose(module.square(X3), np.outer(X3, X3), rtol=1e-12)
    total = module.total(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert total.dtype == np.float32 and total == 15.0
    count = module.count(X4)
    assert count.dtype == np.int64 and count == 4
    # the annotated size stays a compile-time value for callers
    np.testing.assert_allclose(module.scaled(X3), X3 * 3, rtol=0)


def test_a_compile_time_result_takes_the_annotated_dtype(module):
    half, one = module.half(), module.one()
    assert (half.dtype, half) == (np.float32, 0.5)
    assert (one.dtype, one) == (np.float64, 1.0)


def test_an_annotated_function_keeps_its_grad_block(module):
    x = np.array([0.5, -1.5, 2.0])
    np.testing.assert_allclose(module.cube(x), x ** 3, rtol=1e-12)
    grad = dsl.grad(module.cube)(x)
    np.testing.assert_allclose(grad, 3 * x * x, rtol=1e-12)
    np.testing.assert_allclose(grad, central_difference(module.cube, [x], 0), rtol=1e-6)


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_a_product_annotated_by_its_sizes_holds_for_any_sizes(module, n, k, m):
    rng = np.random.default_rng(n * 16 + k * 4 + m)
    a, b = rng.normal(size=(n, k)), rng.normal(size=(k, m))
    np.testing.assert_allclose(module.product(a, b), a @ b, rtol=1e-12)


# ----------------------------------------------- the rule, on lowering alone

NAMES = ("n", "m", "k")
SIZES = (1, 2, 3)


def expected_error(param_dims, x_shape, ret_dims, y_shape) -> str | None:
    """The check as language.md states it, for `def f(x: f64[param_dims],
    y) -> f64[ret_dims]: return y`: None when y's shape satisfies the
    annotation, else the error message."""
    bound = {d: (s, "for 'x'") for d, s in zip(param_dims, x_shape) if isinstance(d, str)}
    where = "the result of f()"
    if len(y_shape) != len(ret_dims):
        text = f"f64[{', '.join(map(str, ret_dims))}]" if ret_dims else "f64"
        return (f"{where} has rank {len(y_shape)} (shape {list(y_shape)}), but its "
                f"annotation {text} has rank {len(ret_dims)}")
    for axis, (d, size) in enumerate(zip(ret_dims, y_shape)):
        if isinstance(d, int):
            if size != d:
                return f"{where} has size {size} on axis {axis}, but its annotation says {d}"
        elif d not in bound:
            bound[d] = (size, f"on its axis {axis}")
        elif bound[d][0] != size:
            return (f"{where} has size {size} on axis {axis}, but its annotation says {d}, "
                    f"which is {bound[d][0]} {bound[d][1]}")
    return None


dims = st.lists(st.one_of(st.sampled_from(NAMES), st.sampled_from(SIZES)), max_size=3)


@st.composite
def cases(draw):
    """An annotation for x and a shape x satisfies it with, a return
    annotation, and a shape for y, often one that satisfies it."""
    param_dims = draw(dims)
    sizes = {n: draw(st.sampled_from(SIZES)) for n in NAMES}
    x_shape = tuple(d if isinstance(d, int) else sizes[d] for d in param_dims)
    ret_dims = draw(dims)
    if draw(st.booleans()):
        y_shape = tuple(d if isinstance(d, int) else sizes[d] for d in ret_dims)
    else:
        y_shape = tuple(draw(st.lists(st.sampled_from(SIZES), max_size=3)))
    return tuple(param_dims), x_shape, tuple(ret_dims), y_shape


def annotation(dims_) -> str:
    return f"f64[{', '.join(map(str, dims_))}]" if dims_ else "f64"


@settings(max_examples=150, deadline=None)
@given(cases())
def test_the_check_is_the_rule_of_language_md(case):
    param_dims, x_shape, ret_dims, y_shape = case
    header = f"def f(x: {annotation(param_dims)}, y) -> "
    f = dsl.loads(f"{header}{annotation(ret_dims)}:\n    return y\n", FILE).functions["f"]
    expected = expected_error(param_dims, x_shape, ret_dims, y_shape)
    concrete = {"x": TensorType("f64", x_shape), "y": TensorType("f64", y_shape)}
    if expected is None:
        f.lower(concrete)
    else:
        with pytest.raises(dsl.GradError) as info:
            f.lower(concrete)
        assert info.value.message == expected
        assert (info.value.line, info.value.col) == (1, len(header) + 1)
    # as dsl lowers a call for every size of its pattern (equal sizes share a
    # symbol, 1 stays 1): the same verdict, or concrete sizes needed where a
    # fixed size meets a symbol
    symbolic = symbolic_types({"x": np.empty(x_shape), "y": np.empty(y_shape)})
    try:
        f.lower(symbolic)
        assert expected is None
    except NeedsConcrete:
        assert any(isinstance(d, int) for d in param_dims + ret_dims)
    except dsl.GradError:
        assert expected is not None


# ------------------------------------------------------- the other ways in


BAD = "def f(x: f64[n], y: f64[m]) -> f64[n]:\n    return y\n"


def test_gradc_show_reports_the_annotation(tmp_path, capsys):
    path = tmp_path / FILE
    path.write_text(BAD)
    assert main(["show", str(path), "--emit", "lower", "--sig", "f(f64[3], f64[4])"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[:3] == [
        f"{path}:1:32: error: the result of f() has size 4 on axis 0, but its annotation says "
        "n, which is 3 for 'x'",
        "    def f(x: f64[n], y: f64[m]) -> f64[n]:",
        "    " + " " * 31 + "^" * 6]
    assert "Traceback" not in err


def test_gradc_compile_for_any_size_names_the_sizes(tmp_path, capsys):
    path = tmp_path / FILE
    path.write_text(BAD)
    # two ':' sizes are different sizes, as when shapes broadcast
    assert main(["compile", str(path), "-o", str(tmp_path / "out"),
                 "--sig", "f(f64[:], f64[:])"]) == 1
    err = capsys.readouterr().err
    assert f"{path}:1:32: error: the result of f() has size a1 on axis 0, but its " \
           "annotation says n, which is a0 for 'x'" in err
    assert "note: each ':' in a signature is a size of its own" in err
    # named alike, they agree: the module is written
    assert main(["compile", str(path), "-o", str(tmp_path / "out"),
                 "--sig", "f(f64[n], f64[n])"]) == 0
    assert (tmp_path / "out" / "ret.py").exists()


def test_gradc_compile_needs_concrete_sizes_for_a_fixed_one(tmp_path, capsys):
    path = tmp_path / FILE
    path.write_text("def f(x) -> f64[3]:\n    return x\n")
    assert main(["compile", str(path), "-o", str(tmp_path / "out"),
                 "--sig", "f(f64[:])"]) == 2  # a usage error: the signature
    assert "a size of the result of f() meets a fixed size; give concrete sizes in --sig" \
        in capsys.readouterr().err
    assert main(["compile", str(path), "-o", str(tmp_path / "out"),
                 "--sig", "f(f64[3])"]) == 0
    # the example it gives is the signature with sizes, every argument kept
    # (x[-1]: the last row, whose place depends on the size; x[0] compiles,
    # checked at run time)
    path.write_text("def g(x, n: i64, k: const i64, y):\n    return x[-1] * n * k * y\n")
    assert main(["compile", str(path), "-o", str(tmp_path / "out"),
                 "--sig", "g(f64[:, 2], i64, 3, f32[m])"]) == 2
    assert "e.g. g(f64[128, 2], i64, 3, f32[128])\n" in capsys.readouterr().err


CHECKED = "def narrow(x) -> f32[...]:\n    return x * x\n\ndef wide(x) -> f64[...]:\n" \
          "    return x * x\n"


def test_the_gradient_checker_runs_at_the_dtype_a_return_annotation_fixes():
    module = dsl.loads(CHECKED, FILE)
    # -> f64: no f32 run, which the annotation would refuse
    wide = dsl.check_gradients(module.wide, np.array([0.5, -1.0]), order=1)
    assert wide and {c.dtype for c in wide} == {"f64"}
    # -> f32: sampled in f32 (as for an argument annotated f32), and passes
    narrow = check_function(module.narrow, order=1)
    assert narrow and "f32" in {c.dtype for c in narrow}
