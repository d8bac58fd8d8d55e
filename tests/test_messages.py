"""What a user reads when a call goes wrong: each error names the function
or transform as the caller wrote it (`hessian(f)`, not the `jacfwd(grad(f))`
it is made of), and a source error the operation the source wrote, at its
line and column, with a caret."""
import traceback

import numpy as np
import pytest

import dsl

CUBES = dsl.loads("def f(x):\n    return sum(x * x * x)\n", "cubes.grad")


def message(call) -> str:
    with pytest.raises(dsl.ArgumentError) as info:
        call()
    text = str(info.value)
    assert text.startswith("cubes.grad:1:5: error: "), text
    assert "Traceback" not in text and "t0" not in text
    return text


def test_a_hessian_is_named_as_written():
    text = message(lambda: dsl.hessian(CUBES.f)(np.ones((2, 2), dtype=np.int64)))
    assert "error: hessian(f): cannot differentiate with respect to 'x': it has dtype i64" \
        in text, text
    assert "jacfwd" not in text and "grad(f)" not in text


@pytest.mark.parametrize("call,expected", [
    # (each said vmap(grad(f)): the vmap of the Jacobian's function)
    (lambda h: h(np.ones((2, 3)), np.ones(3)),
     "vmap(hessian(f)) maps axis 0, and for each example: f() takes 1 argument(s) but 2 "
     "were given"),
    (lambda h: h("abc"), "argument 'x' of vmap(hessian(f)) is not numeric: got str"),
    (lambda h: h(None), "argument 'x' of vmap(hessian(f)) is None"),
    # (this one said `cannot differentiate f()`, lowering the gradient of f)
    (lambda h: h(np.ones((2, 3), dtype=np.int64)),
     "vmap(hessian(f)): cannot differentiate with respect to 'x': it has dtype i64"),
])
def test_a_vmap_of_a_hessian_is_named_as_written(call, expected):
    text = message(lambda: call(dsl.vmap(dsl.hessian(CUBES.f))))
    assert expected in text, text
    assert "vmap(grad(f))" not in text


def test_a_vmap_of_a_jacobian_is_named_as_written():
    # (it said vmap(f): binding is the vmap of f's)
    text = message(lambda: dsl.vmap(dsl.jacrev(CUBES.f))(np.ones((2, 3)), 1.0))
    assert "vmap(jacrev(f)) maps axis 0, and for each example: f() takes 1 argument(s) but " \
           "2 were given" in text, text


def test_a_named_vmap_of_a_hessian_still_gives_each_examples_hessian():
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]])
    got = dsl.vmap(dsl.hessian(CUBES.f))(x)
    np.testing.assert_allclose(got, np.stack([np.diag(6 * row) for row in x]), rtol=1e-12)
    np.testing.assert_allclose(dsl.hessian(CUBES.f)(x[0]), np.diag(6 * x[0]), rtol=1e-12)


def dask_error(source: str, call) -> str:
    da = pytest.importorskip("dask.array")
    m = dsl.loads(source, "rows.grad")
    x = da.from_array(np.arange(12.0).reshape(4, 3), chunks=(2, 3))
    with pytest.raises(dsl.GradError) as info:
        call(m, x)
    text = str(info.value)
    assert "Traceback" not in text
    return text


def test_a_dask_refusal_quotes_the_operation_the_source_wrote():
    # (it named the IR's op, `sub`)
    text = dask_error("def f(x):\n    return x - mean(x, axis=0)\n", lambda m, x: m.f(x))
    assert text.startswith("rows.grad:2:12: error: `x - mean(x, axis=0)` uses a value reduced "
                           "over the batch row by row, so this function does not decompose "
                           "over the rows of its Dask arguments"), text
    assert text.endswith("\n        return x - mean(x, axis=0)\n               "
                         + "^" * len("x - mean(x, axis=0)")), text


def test_a_dask_refusal_in_a_gradient_is_at_the_source_it_is_the_gradient_of():
    # the mean's gradient broadcasts its cotangent (a sum over the rows) to
    # the rows: the error named `broadcast_to`, at the `def` line (the
    # gradient's equations had no place)
    text = dask_error("def f(x):\n    return sum(x - mean(x, axis=0))\n",
                      lambda m, x: dsl.grad(m.f)(x))
    assert text.startswith("rows.grad:2:20: error: `mean(x, axis=0)` uses a value reduced over "
                           "the batch row by row"), text
    assert "broadcast_to" not in text and "def f" not in text
    assert text.endswith("\n" + " " * 23 + "^" * len("mean(x, axis=0)")), text


def test_a_dask_refusal_of_a_size_says_what_batch_is():
    # (it said "axis 0 of size batch is indexed", `batch` a compiler symbol)
    text = dask_error("def f(x):\n    return x - x[0]\n", lambda m, x: m.f(x))
    assert text.startswith("rows.grad:2:16: error: f() on Dask arrays: axis 0 of size batch is "
                           "indexed, where `batch` is the number of rows of 'x', which a block "
                           "does not know (it has some of them); call it on in-memory arrays"), \
        text


def test_an_operation_the_source_does_not_show_on_one_line_is_not_quoted():
    from gradlang.runtime.errors import QuotesSource, Span
    source = "def f(x):\n    return x - mean(x,\n                    axis=0)\n"
    one_line, two_lines = Span("a.grad", 2, 12, 2, 31), Span("a.grad", 2, 12, 3, 28)
    assert QuotesSource("the operation", "mixes rows", one_line, source).message == \
        "`x - mean(x,` mixes rows"
    assert QuotesSource("the operation", "mixes rows", two_lines, source).message == \
        "the operation mixes rows"
    # (pickled as its message, which it keeps)
    import pickle
    err = pickle.loads(pickle.dumps(QuotesSource("the loop", "mixes rows", one_line, source)))
    assert err.message == "`x - mean(x,` mixes rows"


def test_a_dask_refusal_of_an_operation_of_no_place_quotes_nothing():
    # (its fallback place is another operation's, or the `def`'s: quoted,
    # `f` was named as the operation)
    from gradlang.compiler.batching import _mixes
    from gradlang.compiler.ir import Eqn
    from gradlang.runtime.errors import Span
    err = _mixes(Eqn("sub", (), ()), "mixes rows", Span("a.grad", 1, 5, 1, 6))
    err.with_source("def f(x):\n    return x - mean(x, axis=0)\n")
    assert err.message.startswith("an operation mixes rows, so this function does not "
                                  "decompose"), err.message
    assert str(err).startswith("a.grad:1:5: error: an operation mixes rows")


@pytest.mark.parametrize("call,expected", [
    (lambda: dsl.grad(None), "grad() takes a function of a loaded .grad module, got None"),
    (lambda: dsl.hessian(np.sin), "hessian() takes a function of a loaded .grad module, got "
                                  "ufunc; Python code is not traced: write it in the .grad "
                                  "module, or chain compiled calls under a dsl.Tape"),
    (lambda: dsl.load(None), "load() takes a path to a .grad file, got None"),
    # (Path('') is '.': it said "cannot read .: it is a directory", at '.:1:1')
    (lambda: dsl.load(""), "load() takes a path to a .grad file, got an empty path"),
    (lambda: dsl.load(b""), "load() takes a path to a .grad file, got an empty path"),
    (lambda: dsl.loads(b"def f(x):\n    return x\n"), "loads() takes source text, got bytes"),
    (lambda: dsl.loads("def f(x):\n    return x\n", 3),
     "loads() takes a file name (a str or a path), got int"),
])
def test_a_value_that_is_no_function_or_source_is_an_argument_error(call, expected):
    # (a plain TypeError, which showed this package's frames above the
    # caller's; an ArgumentError is a TypeError too)
    with pytest.raises(dsl.ArgumentError) as info:
        call()
    assert str(info.value) == f"error: {expected}"  # (None said NoneType)
    assert isinstance(info.value, TypeError)
    files = {frame.filename for frame in traceback.extract_tb(info.value.__traceback__)}
    assert not any(name.endswith(("api.py", "function.py")) for name in files), files


def test_loads_with_an_empty_file_name_names_the_source_as_the_default_does():
    # an empty name began each message with ":2:14: error" (no file)
    with pytest.raises(dsl.GradError) as info:
        dsl.loads("def f(x):\n    return y\n", "")
    assert str(info.value).startswith("<string>:2:12: error: name 'y' is not defined")


def test_host_results_is_true_or_false():
    # host_results="no" was taken as true
    with pytest.raises(dsl.ArgumentError, match=r"^error: loads\(\)'s host_results is True or "
                                                r"False, got 'no'$"):
        dsl.loads("def f(x):\n    return x\n", host_results="no")
    m = dsl.loads("def f(x):\n    return x * 2.0\n", host_results=np.bool_(True))
    np.testing.assert_array_equal(m.f(np.array([1.0, 2.0])), [2.0, 4.0])


@pytest.mark.parametrize("call,expected", [
    # (NumPy's "setting an array element with a sequence. The requested
    # array has an inhomogeneous shape after 1 dimensions. ...")
    (lambda: dsl.grad(CUBES.f)([[1.0], [1.0, 2.0]]),
     "argument 'x' of f() is not an array: its nested sequences are ragged (of different "
     "lengths or depths)"),
    (lambda: dsl.jvp(CUBES.f, (np.ones(2),), ([1.0, [2.0]],)),
     "the tangent for 'x' of f() is not an array: its nested sequences are ragged (of "
     "different lengths or depths)"),
    # (it said "is not numeric: got NoneType")
    (lambda: dsl.hvp(CUBES.f)(np.ones(2), None),
     "v of hvp(f) is None, where an array or a number goes"),
    (lambda: dsl.vjp(CUBES.f, np.ones(2))[1](None),
     "cotangent 0 of the pullback of f() is None, where an array or a number goes"),
])
def test_a_value_that_is_no_array_says_what_it_is(call, expected):
    text = message(call)
    assert text.splitlines()[0] == f"cubes.grad:1:5: error: {expected}", text


def test_a_pullback_takes_none_for_a_bool_or_integer_outputs_cotangent():
    # a bool output's cotangent had to be an array ("cotangent 1 ... is
    # None, where an array or a number goes"), though nothing reads it (JAX
    # takes float0); a float output's None is still refused
    m = dsl.loads("def f(x):\n    return x * 3.0, x > 0.0, sum(x > 0.0)\n")
    _, pullback = dsl.vjp(m.f, np.array([1.0, -1.0]))
    (dx,) = pullback(np.array([1.0, 2.0]), None, None)
    np.testing.assert_array_equal(dx, [3.0, 6.0])
    with pytest.raises(dsl.ArgumentError, match="cotangent 0 of the pullback of f"):
        pullback(None, None, None)


def test_a_tapes_sources_are_arrays():
    x = np.array([1.0, 2.0])
    with dsl.Tape() as tape:
        tape.watch(x)
        y = CUBES.f(x)
    with pytest.raises(dsl.ArgumentError, match=r"^error: Tape.gradient\(\)'s sources\[1\] is "
                                                r"tuple, not an array: the sources are an array "
                                                r"or a flat list or tuple of arrays$"):
        tape.gradient(y, [x, (x,)])  # (its gradient was None, silently)
    with pytest.raises(dsl.ArgumentError, match=r"tuple of arrays, got None$"):
        tape.gradient(y, None)  # (it said NoneType)
    # refused before the tape counted as used: the gradient is still given
    (g,) = tape.gradient(y, [x])
    np.testing.assert_array_equal(g, 3 * x ** 2)


@pytest.mark.parametrize("value,got", [(np.ones(2, np.int64), "an array of dtype int64"),
                                       (None, "None"), (2.0, "float")])
def test_tape_watch_says_what_it_got(value, got):
    with dsl.Tape() as tape:
        with pytest.raises(dsl.ArgumentError, match=rf"^error: Tape.watch\(\) takes float NumPy "
                                                    rf"\(or GPU\) arrays, got {got}; convert"):
            tape.watch(value)


def test_tape_persistent_is_true_or_false():
    with pytest.raises(dsl.ArgumentError, match=r"^error: Tape\(\)'s persistent is True or "
                                                r"False, got 'yes'$"):
        dsl.Tape("yes")  # (it was persistent)
    assert dsl.Tape(np.bool_(True)).persistent is True


def test_the_sizes_of_a_signatures_colons_are_said_to_be_theirs(tmp_path, capsys):
    # "shape [a1, a2]": names the signature's ':'s were given, which no note
    # explained where only one of them was named
    from dsl.cli import main
    path = tmp_path / "g.grad"
    path.write_text("def g(x: f64[n], y: f64[n]):\n    return x * y\n")
    assert main(["show", str(path), "--emit", "ir", "--sig", "g(f64[:], f64[:, :])"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:1:5: error: argument 'y' of g() has rank 2 (shape [a1, a2]), but its "
        "annotation f64[n] has rank 1",
        "    def g(x: f64[n], y: f64[n]):",
        "        ^",
        "note: a1, a2: the sizes ':'s of the signature stand for (numbered from a0, in order)",
        "note: each ':' in a signature is a size of its own, which need not equal any other; "
        "name the sizes that must agree, as in f(f64[n], f64[n])"]
    assert main(["show", str(path), "--emit", "ir", "--sig", "g(f64[3], f64[:])"]) == 1
    assert capsys.readouterr().err.splitlines()[3:] == [
        "note: a0: the size a ':' of the signature stands for (numbered from a0, in order)"]


def test_a_param_passed_by_keyword_says_where_it_is_set():
    m = dsl.loads("param w: f64[2]\ndef h(x):\n    return sum(x * w)\n", "p.grad")
    m.params["w"] = np.array([2.0, 3.0])
    for call in (lambda: m.h(np.ones(2), w=np.zeros(2)),
                 lambda: dsl.grad(m.h, "w")(np.ones(2), w=np.zeros(2))):
        with pytest.raises(dsl.ArgumentError) as info:
            call()
        # (it said only "h() has no parameter 'w'")
        assert str(info.value).splitlines()[0] == (
            "p.grad:2:5: error: h() has no parameter 'w': 'w' is a param of its module, which "
            "it reads where it is set: module.params['w'] = value")
    np.testing.assert_array_equal(dsl.grad(m.h, "w")(np.array([1.0, -1.0])), [1.0, -1.0])


def test_a_check_of_nothing_says_so():
    result = dsl.check_gradients(CUBES.f, np.ones(3, np.int64))
    assert len(result) == 0 and result  # (nothing failed)
    # (it said "<CheckResult: 0 checks, none failed>", as if it had passed)
    assert repr(result) == "<CheckResult: nothing checked: no differentiable arguments>"


def test_a_vmap_of_an_hvp_missing_an_argument_says_how_it_takes_them():
    with pytest.raises(dsl.ArgumentError) as info:
        dsl.vmap(dsl.hvp(CUBES.f))(np.ones((2, 3)))  # (taken as v: x is missing)
    # (it said "which must then be passed by position", of an x passed so)
    assert str(info.value).splitlines()[0] == (
        "cubes.grad:1:5: error: in_axes maps argument 'x' of vmap(hvp(f)), which was not passed "
        "(a mapped argument is passed by position)")
    assert str(info.value).splitlines()[-1] == \
        "note: hvp(f) takes the arguments of f(), then v"
