"""Front-end holes, each pinned: constants that do not fit their dtype,
compile-time arithmetic that would not finish, negative sizes, and call
graphs that were walked quadratically or recursively, or inlined into
programs exponentially large."""
import numpy as np
import pytest

import dsl
from dsl.function import _types
from gradlang.compiler import lower, namespace
from gradlang.compiler.interpret import interpret
from gradlang.compiler.lower import MAX_CALL_DEPTH
from gradlang.compiler.namespace import param_reads
from gradlang.compiler.pipeline import front_end

I64 = np.array([1, 2], dtype=np.int64)
I32 = np.array([1, 2], dtype=np.int32)
F64 = np.array([1.0, 2.0])
F32 = np.array([1.0, 2.0], dtype=np.float32)
HUGE = "9" * 400


def call_error(body: str, x: np.ndarray) -> dsl.GradError:
    m = dsl.loads(f"def f(x):\n    {body}\n", "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(x)
    return info.value


# ---------------------------------------------------- constants and dtypes

@pytest.mark.parametrize("body,x,col,text", [
    ("return x + 10**26", I64, 16, "the constant 100000000000000000000000000 does not fit in i64"),
    ("return x + 3000000000", I32, 16, "the constant 3000000000 does not fit in i32"),
    ("return x - 2147483649", I32, 16, "does not fit in i32"),
    (f"return x + {HUGE}", F64, 16, "the constant (about 10**400) is beyond the range of f64"),
    ("return x * 1e39", F32, 16, "the constant 1e+39 is beyond the range of f32"),
    ("return x < 10**26", I64, 16, "does not fit in i64"),
    ("x += 10**26\n    return x", I64, 10, "does not fit in i64"),
    ("return maximum(x, 10**19)", I64, 12, "does not fit in i64"),
    ("return full_like(x, 1e20)", I64, 12, "the constant 1e+20 does not fit in i64"),
    ("return full_like(x, 3000000000)", I32, 12, "does not fit in i32"),
    ("return x + 9 ** 9 ** 9", F64, 16, "the integer power is beyond the range of every dtype"),
    ("return x + (-3) ** 2000", F64, 16, "beyond the range of every dtype"),
    ("return x + 1e300 * 1e300", F64, 16, "the result is beyond the range of f64"),
    ("return x + 2 ** 1023 * 2.0", F64, 16, "compile-time arithmetic failed"),
    ("return broadcast_to(x, (-1, 3))", F64, 12, "invalid shape [-1, 3]: sizes cannot be "
                                                 "negative"),
])
def test_a_constant_that_does_not_fit_is_an_error_at_it(body, x, col, text):
    err = call_error(body, x)
    assert (err.file, err.line, err.col) == ("bad.grad", 2, col), str(err)
    assert text in err.message, str(err)
    assert "^" in str(err).splitlines()[-1]


@pytest.mark.parametrize("cotangent,x,text", [
    ("1e39", F32, "the constant 1e+39 is beyond the range of f32"),
    ("2 ** 1000 * 2 ** 100", F64, "(about 10**331) is beyond the range of f64"),
])
def test_a_constant_cotangent_that_does_not_fit_is_an_error_at_it(cotangent, x, text):
    # (a constant cotangent alone is not linear in dz: an error at load)
    m = dsl.loads(f"def f(x):\n    return x * 2\ngrad(dz):\n    return dz * ({cotangent})\n",
                  "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        dsl.grad(m.f)(x)
    assert (info.value.line, info.value.col) == (4, 18), str(info.value)
    assert text in info.value.message


def test_a_failed_constant_leaves_the_module_usable():
    # The overflow used to happen while writing the kernel, leaving a
    # broken file in the kernel cache.
    src = "def f(x):\n    return x + 10**26\ndef g(x):\n    return x + 10**18\n"
    m = dsl.loads(src, "bad.grad")
    with pytest.raises(dsl.GradError):
        m.f(I64)
    with pytest.raises(dsl.GradError):
        dsl.loads(src, "bad.grad").f(I64)
    np.testing.assert_array_equal(m.g(I64), I64 + 10**18)


def test_infinity_is_written_1e400_but_never_stored_in_an_integer():
    m = dsl.loads("def inf32(x):\n    return maximum(x, -1e400)\n"
                  "def nan(x):\n    return x + (1e400 - 1e400)\n"
                  "def int_plus_inf(x):\n    return x + 1e400\n", "inf.grad")
    np.testing.assert_array_equal(m.inf32(np.array([-np.inf, 1.0], dtype=np.float32)),
                                  [-np.inf, 1.0])
    assert np.isnan(m.nan(F64)).all()
    np.testing.assert_array_equal(m.int_plus_inf(I64), [np.inf, np.inf])  # a float: f64
    for body, text in [("return full_like(x, -1e400)", "-inf cannot be stored in i64"),
                       ("return full_like(x, 1e400 - 1e400)", "nan cannot be stored in i64")]:
        err = call_error(body, I64)
        assert (err.line, err.col) == (2, 12), str(err)
        assert text in err.message, str(err)


def test_constants_at_the_edges_of_their_dtype_still_work():
    m = dsl.loads("def i64_max(x):\n    return x + (2**63 - 3)\n"
                  "def i32_min(x):\n    return x + (-2147483647 - 1)\n"
                  "def f64_big(x):\n    return x * 2 ** 1000\n"
                  "def f32_max(x):\n    return x * 3.4e38\n"
                  "def int_fill(x):\n    return full_like(x, 2.5)\n"
                  "def small_power(x):\n    return x + 2 ** -2000\n")
    assert m.i64_max(I64).tolist() == [2**63 - 2, 2**63 - 1]
    assert m.i32_min(np.array([0, 1], dtype=np.int32)).tolist() == [-2**31, -2**31 + 1]
    np.testing.assert_array_equal(m.f64_big(F64), F64 * 2.0 ** 1000)
    np.testing.assert_array_equal(m.f32_max(np.array([1.0], dtype=np.float32)),
                                  np.float32(3.4e38))
    np.testing.assert_array_equal(m.int_fill(I64), [2, 2])
    np.testing.assert_array_equal(m.small_power(F64), F64)


# ------------------------------------------------------------- call graphs

def chain(n: int) -> str:
    """f0 reads the param p; f_k calls f_{k-1}."""
    return ("param p: f64\ndef f0(x):\n    return x * p\n"
            + "".join(f"def f{k}(x):\n    return f{k - 1}(x)\n" for k in range(1, n)))


def test_each_function_body_is_walked_once_for_param_reads(monkeypatch):
    walked = []
    original = namespace.free_names
    monkeypatch.setattr(namespace, "free_names",
                        lambda body, bound: walked.append(body) or original(body, bound))
    dsl.loads(chain(300), "chain.grad")  # asks each function what it reads
    assert len(walked) == 300  # was 300 * 301 / 2: each function walked its callees again
    module, ns = front_end(chain(5), "chain.grad")
    assert [param_reads(module.func(f"f{k}"), ns) for k in range(5)] == [("p",)] * 5


def test_mutually_recursive_functions_read_the_union_of_their_params():
    module, ns = front_end("param p: f64\nparam q: f64\nparam r: f64\n"
                           "def f(x):\n    return g(x) * p\n"
                           "def g(x):\n    return f(x) * q\n"
                           "def h(x):\n    return f(x) + r\n"
                           "def lone(x):\n    return x\n", "cycle.grad")
    assert param_reads(module.func("h"), ns) == ("p", "q", "r")
    assert param_reads(module.func("f"), ns) == ("p", "q")
    assert param_reads(module.func("g"), ns) == ("p", "q")
    assert param_reads(module.func("lone"), ns) == ()


@pytest.fixture(scope="module")
def long_chain():
    m = dsl.loads(chain(1000), "chain.grad")  # raised RecursionError
    m.params["p"] = np.array(3.0)
    return m


def test_a_chain_of_1000_functions_loads_and_a_64_deep_call_runs(long_chain):
    depth = MAX_CALL_DEPTH - 1
    np.testing.assert_allclose(getattr(long_chain, f"f{depth}")(F64), 3 * F64)


def test_a_call_chain_deeper_than_the_bound_is_an_error_at_the_call(long_chain):
    with pytest.raises(dsl.GradError) as info:
        long_chain.f999(F64)
    err = info.value
    assert f"calls are nested more than {MAX_CALL_DEPTH} deep here (from f999())" \
        in err.message
    # the call that would go one level deeper: f935 inside f936
    assert (err.file, err.line, err.col) == ("chain.grad", 2 * 936 + 3, 12), str(err)
    # its caret, and the call of f936 that reached it (in f937's body)
    assert err.source is not None and "^" in str(err).splitlines()[-2]
    assert str(err).splitlines()[-1] == f"note: in f936(), called at chain.grad:{2 * 937 + 3}:12"



@pytest.mark.parametrize("call", ["g{k}(x) + g{k}(x * 0.5)", "sum(grad(g{k})(x) * x)"])
def test_a_program_that_grows_exponentially_with_its_calls_is_an_error_not_a_hang(
        monkeypatch, call):
    # g_k calls g_(k-1) twice, so g40 inlined is 2**40 copies of g0's sin;
    # or takes its gradient, about three times its size: lowering ran until
    # memory ran out (dsl.load too, for a caller with a grad block, whose
    # linearity is checked at load)
    monkeypatch.setattr(lower, "MAX_PROGRAM_SIZE", 2_000)  # ~10 ms, not seconds
    source = "def g0(x):\n    return sum(sin(x))\n" + "".join(
        f"def g{k}(x):\n    return {call.format(k=k - 1)}\n" for k in range(1, 41))
    m = dsl.loads(source + "def f(x):\n    return g40(x)\ngrad(dy):\n    return dy\n",
                  "grows.grad")
    with pytest.raises(dsl.GradError) as info:
        m.g40(F64)
    err = info.value
    assert "g40() is too big to compile: with its calls inlined it has more than 2000 " \
           "operations" in err.message
    assert (err.file, err.line) == ("grows.grad", 2 * 40 + 2), str(err)  # in g40's body
    assert str(err).splitlines()[-1].strip().startswith("^")
    g2 = m.g2  # well inside the bound
    value = interpret(g2.lower(_types(g2.bind((F64,), {}))), F64)[0]
    x = F64
    expected = (np.sum(np.sin(x) + 2 * np.sin(x / 2) + np.sin(x / 4)) if call[0] == "g"
                else np.sum((np.cos(x) - x * np.sin(x)) * x))  # d/dx sum(cos(x) * x), times x
    np.testing.assert_allclose(value, expected, rtol=1e-14)
