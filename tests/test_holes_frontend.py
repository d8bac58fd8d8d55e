"""Front-end holes, each pinned: constants that do not fit their dtype,
compile-time arithmetic that would not finish, negative sizes, and call
graphs that were walked quadratically or recursively, or inlined into
programs exponentially large."""
import numpy as np
import pytest

import dsl
from dsl.function import _types
from gradlang.compiler import batching, linearity, lower, namespace, staging, vectorize
from gradlang.compiler.interpret import interpret
from gradlang.compiler.ir import Function, Var
from gradlang.compiler.lower import MAX_CALL_DEPTH
from gradlang.compiler.namespace import param_reads
from gradlang.compiler.pipeline import front_end
from gradlang.compiler.shapes import NeedsConcrete, Sym
from helpers import central_difference

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


def test_a_product_beyond_every_dtype_is_refused_before_it_is_computed():
    # as an integer power is: `a = a * a` doubled its bits each time (30
    # times took hours), and 6 times gave an integer of 3840 bits
    squares = "    a = a * a\n" * 5
    m = dsl.loads(f"def f(x):\n    a = 2 ** 60\n{squares}    a = -a * a\n    return x + (a < 0)\n",
                  "bad.grad")
    with pytest.raises(dsl.GradError) as info:
        m.f(F64)
    assert (info.value.line, info.value.col) == (8, 9), str(info.value)
    assert "the integer product is beyond the range of every dtype" in info.value.message
    # (a product within the range stays exact, as a float beside arrays)
    got = dsl.loads("def f(x):\n    return x * (2 ** 64 * 2 ** 64 * 3)\n").f(np.array([1.0]))
    np.testing.assert_array_equal(got, [3.0 * 2.0 ** 128])


def test_a_size_squared_again_and_again_is_an_error_not_a_hang():
    # a symbolic size's factors doubled with each product (a call is
    # lowered with symbols first): 30 squarings built 2**30 of them
    n = Sym.named("n")
    with pytest.raises(NeedsConcrete, match="a product of more than 1024 sizes"):
        for _ in range(11):
            n = n * n
    squares = "    a = a * a\n" * 30
    m = dsl.loads(f"def f(x):\n    a = x.shape[0]\n{squares}    return x * a\n", "bad.grad")
    with pytest.raises(dsl.GradError) as info:  # (with the sizes: the numbers' bound)
        m.f(np.ones(2))
    assert (info.value.line, info.value.col) == (13, 9), str(info.value)
    assert "the integer product is beyond the range of every dtype" in info.value.message


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
    # the same error from a fresh load (not one from a half-written kernel)
    for f in (m.f, dsl.loads(src, "bad.grad").f):
        with pytest.raises(dsl.GradError, match=f"the constant {10**26} does not fit in i64") as info:
            f(I64)
        assert (info.value.line, info.value.col) == (2, 16), str(info.value)
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


LEAKY_TWO_BLOCKS = """
def leaky(x, alpha: const = 0.2):
    y = maximum(x, x * alpha)
    return y
grad(dy):
    return where(y >= 0, dy, dy * alpha)
grad(ddx):
    return dy=where(y >= 0, ddx, ddx * alpha), x=0
"""


def grad_chain(n: int) -> str:
    """g_k is 1.01 g_(k-1), g0 sin: g_k(x) = 1.01**k sin(x); g_k's block
    takes the in-language grad of g_(k-1)."""
    return "def g0(x):\n    return sin(x)\ngrad(dy):\n    return dy * cos(x)\n" + "".join(
        f"def g{k}(x):\n    return g{k - 1}(x) * 1.01\n"
        f"grad(dy):\n    return dy * 1.01 * grad(g{k - 1})(x)\n" for k in range(1, n))


def run_ir(fn, *args):
    """fn on args through the IR's NumPy interpreter (no kernel compiled)."""
    return interpret(fn.lower(_types(fn.bind(args, {}))), *args)[0]


def test_a_chain_of_blocks_taking_the_previous_grad_lowers_each_stage_once(monkeypatch):
    # g_k's body and its block's grad(g_(k-1)) both call g_(k-1): each
    # call lowered its blocks afresh, so g_k cost twice g_(k-1) (n = 12
    # loaded in seconds, n = 14 was too big to compile); a stage is now
    # lowered once per program and shared by the calls alike
    built, noted = [], []
    backward, note = staging.Chain.backward, lower._Notes.eqn
    monkeypatch.setattr(staging.Chain, "backward",
                        lambda self, *a: built.append(self.fdef.name) or backward(self, *a))
    monkeypatch.setattr(lower._Notes, "eqn", lambda self, e: noted.append(e) or note(self, e))
    m = dsl.loads(grad_chain(12), "chain.grad")  # lowers each g_k at load (linearity)
    # one block each for the whole module: the load's check lowered every
    # g_k afresh, each with the blocks of the g_j it calls (k + 1 of them,
    # 78 in all; n = 40 took 2.1 s to load, now 0.1 s)
    assert len(built) == 12  # (was 8178 before stages were shared at all)
    # and each call's equations are walked to note where they were called
    # from, not again what the calls inside it noted (1306692 walked)
    assert len(noted) < 5_000
    x = np.array([0.3, -1.2, 2.0])
    np.testing.assert_allclose(run_ir(dsl.grad(m.g11), x), 1.01 ** 11 * np.cos(x), rtol=1e-14)


def test_the_linearity_check_walks_each_called_function_once(monkeypatch):
    # every block's check walked into each function it calls, and into
    # theirs, again for every block: 2324 walks for n = 24 (cubic in n);
    # a function is now walked once per kinds of its inputs
    walks = []
    original = linearity._walk
    monkeypatch.setattr(linearity, "_walk", lambda *a: walks.append(a[0]) or original(*a))
    dsl.loads(grad_chain(24), "chain.grad")
    assert len(walks) < 4 * 24


def test_vmap_of_the_chains_gradient_vectorizes_each_function_once(monkeypatch):
    # the program holds each stage in several places (every call alike
    # shares it); vectorizing each place afresh took 150049 functions
    # (27 s) for n = 12
    done = []
    original = vectorize._vectorized
    monkeypatch.setattr(vectorize, "_vectorized", lambda fn, *a: done.append(fn) or original(fn, *a))
    m = dsl.loads(grad_chain(12), "chain.grad")
    xs = np.array([[0.3, -1.2], [2.0, 0.5], [1.0, -0.1]])
    np.testing.assert_allclose(run_ir(dsl.vmap(dsl.grad(m.g11)), xs), 1.01 ** 11 * np.cos(xs),
                               rtol=1e-14)
    assert len(done) < 100


def test_dasks_sizes_rewrite_the_chains_program_each_function_once(monkeypatch):
    # as vmap: Dask's block program takes the whole array's sizes in every
    # function the program holds, each place afresh (n = 14: 86 s)
    done = []
    original = batching.with_sizes
    monkeypatch.setattr(batching, "with_sizes", lambda fn, *a: done.append(fn) or original(fn, *a))
    m = dsl.loads(grad_chain(12), "chain.grad")
    x = np.array([0.3, -1.2, 2.0])
    fn = batching.with_sizes(dsl.grad(m.g11).lower(_types(dsl.grad(m.g11).bind((x,), {}))), {})
    np.testing.assert_allclose(interpret(fn, x)[0], 1.01 ** 11 * np.cos(x), rtol=1e-14)
    assert len(done) < 1_000


def test_a_chain_of_blocks_taking_the_previous_grad_has_the_chains_derivatives():
    m = dsl.loads(grad_chain(6) + "def h(x, c: const):\n    return g3(x * c)\n"
                  "grad(dy):\n    return dy * c * grad(g3)(x * c)\n"
                  "def f(x):\n    return h(x, 2) + h(x, 3) * g5(x)\n", "chain.grad")
    x = np.array([0.3, -1.2, 2.0])
    s = 1.01 ** 5
    np.testing.assert_allclose(run_ir(m.g5, x), s * np.sin(x), rtol=1e-14)
    np.testing.assert_allclose(run_ir(dsl.grad(m.g5), x), s * np.cos(x), rtol=1e-14)
    np.testing.assert_allclose(run_ir(dsl.grad(dsl.grad(m.g5)), x), -s * np.sin(x), rtol=1e-14)
    np.testing.assert_allclose(run_ir(dsl.grad(m.g5), x),
                               central_difference(lambda x: run_ir(m.g5, x), [x], 0), rtol=1e-8)
    # h's stages for c = 2 and c = 3 are two, each called alike twice
    f = 1.01 ** 3 * (np.sin(2 * x) + np.sin(3 * x) * s * np.sin(x))
    df = 1.01 ** 3 * (2 * np.cos(2 * x) + s * (3 * np.cos(3 * x) * np.sin(x)
                                               + np.sin(3 * x) * np.cos(x)))
    np.testing.assert_allclose(run_ir(m.f, x), f, rtol=1e-14)
    np.testing.assert_allclose(run_ir(dsl.grad(m.f), x), df, rtol=1e-13)
    np.testing.assert_allclose(run_ir(dsl.grad(m.f), x),
                               central_difference(lambda x: run_ir(m.f, x), [x], 0), rtol=1e-8)


def test_a_stage_lowered_once_still_counts_each_call_toward_the_size_bound(monkeypatch):
    # g_k (with a block) calls g_(k-1) twice alike: lowered once, g20 is
    # still 2**20 copies of g0 when its calls are inlined
    monkeypatch.setattr(lower, "MAX_PROGRAM_SIZE", 2_000)
    source = "def g0(x):\n    return sin(x)\n" + "".join(
        f"def g{k}(x):\n    return g{k - 1}(x) + g{k - 1}(x)\ngrad(dy):\n    return dy\n"
        for k in range(1, 21))
    m = dsl.loads(source, "grows.grad")
    with pytest.raises(dsl.GradError) as info:
        m.g20.lower(_types(m.g20.bind((F64,), {})))
    assert "g20() is too big to compile" in info.value.message
    np.testing.assert_allclose(run_ir(m.g3, F64), 8 * np.sin(F64), rtol=1e-14)


@pytest.mark.parametrize("deep,text", [
    # f -> d5 -> ... -> d0 -> g -> h60 -> ... -> h0: g's calls nest past the bound there
    ("d5(x)", f"calls are nested more than {MAX_CALL_DEPTH} deep here (from f())"),
    # f -> r(x, 1) -> g -> r(x, 0): a recursive call there
    ("r(x, 1)", "recursive call to r() is not supported")])
def test_a_stage_lowered_once_is_an_error_where_lowering_it_again_would_be(deep, text):
    # g, first lowered under f alone, is reused where its calls would
    # reach too deep or back into a caller: the error lowering there raises
    source = ("def h0(x):\n    return r(x, 0)\n"
              + "".join(f"def h{k}(x):\n    return h{k - 1}(x)\n" for k in range(1, 61))
              + "def g(x):\n    return h60(x)\ngrad(dy):\n    return dy\n"
              + "def d0(x):\n    return g(x)\n"
              + "".join(f"def d{k}(x):\n    return d{k - 1}(x)\n" for k in range(1, 6))
              + "def r(x, n: const):\n    y = x * 2.0\n    if n > 0:\n        y = g(x)\n    return y\n"
              + f"def f(x):\n    return g(x) + {deep}\n")
    m = dsl.loads(source, "reach.grad")
    np.testing.assert_allclose(run_ir(m.g, F64), 2 * F64)
    with pytest.raises(dsl.GradError) as info:
        m.f(F64)
    assert text in info.value.message


def structure(fn, names=None) -> list:
    """fn's IR as comparable items: ops, values numbered in order of
    definition, types, params, and spans with their notes (`via`), into
    the functions its equations hold."""
    names = {"count": 0} if names is None else names

    def define(v):
        names["count"] += 1
        names[v] = names["count"]
        return names[v]
    name = lambda a: names[a] if isinstance(a, Var) else repr(a)  # noqa: E731
    items: list = [(fn.name, [(define(p), p.type) for p in fn.params])]
    for e in fn.eqns:
        ins = [name(a) for a in e.inputs]
        params = [(k, structure(v, names) if isinstance(v, Function) else repr(v))
                  for k, v in e.params]
        outs = [(define(o), o.type) for o in e.outputs]
        items.append((e.op, ins, outs, params, e.span and (e.span, e.span.via)))
    return items + [[name(a) for a in fn.outputs]]


def test_reusing_a_stage_changes_no_program(monkeypatch):
    # a stage reused is the stage lowered afresh: the same equations, and
    # each at the span and with the note of its own call (a two-block
    # function's later stage carries the span of the call)
    source = (grad_chain(4) + LEAKY_TWO_BLOCKS +
              "def f(x):\n    a = sum(leaky(x)) + sum(grad(g3)(x))\n"
              "    return a + sum(grad(leaky)(x) * leaky(x)) + sum(g3(x))\n")
    m = dsl.loads(source, "reuse.grad")
    x = np.array([-2.0, 0.5, 3.0])
    types = _types(m.f.bind((x,), {}))
    reused = structure(m.f.lower(types))
    monkeypatch.setattr(staging.Chain, "key", lambda *_: None)  # lower every call afresh
    assert structure(m.f.lower(types)) == reused
    leaky = np.maximum(x, 0.2 * x)
    s = 1.01 ** 3
    expected = (leaky.sum() + (s * np.cos(x)).sum() + (np.where(x >= 0, 1, 0.2) * leaky).sum()
                + (s * np.sin(x)).sum())
    np.testing.assert_allclose(run_ir(m.f, x), expected, rtol=1e-14)
