"""`@` / `matmul` of any ranks (NumPy's np.matmul: rank-1 operands promoted,
batch axes broadcast) and `einsum` with literal subscripts (np.einsum's):
values against NumPy, gradients and second derivatives against central
differences in f64, jvp against jacrev, vmap, a grad block written with
them (the linearity check), the CUDA simulator, Dask blocks along the batch
axis, and every misuse a GradError at its position."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from helpers import central_difference, optional_module

# (subscripts, operand shapes): explicit and implicit forms, transposes,
# reductions, outer products, size-1 axes broadcast, three operands, a
# scalar operand, upper-case letters (implicit order: A..Z before a..z)
EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij", [(3, 4)]),
    ("ji", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("i,i->", [(4,), (4,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->i", [(4,), (4,)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ijk,kj->i", [(2, 3, 4), (4, 3)]),
    ("ij,ij->ij", [(3, 1), (3, 4)]),
    ("ij,j,jk->ik", [(3, 4), (4,), (4, 5)]),
    ("ab,cd,bc->ad", [(2, 3), (4, 5), (3, 4)]),
    ("bA,a", [(2, 3), (5,)]),
    (",ij->ji", [(), (3, 4)]),
    ("i j , j k -> k i", [(3, 4), (4, 5)]),
]
# whose gradient the tests check against central differences
DIFFERENTIATED = ["ab,cd,bc->ad"]


def _einsum_functions() -> str:
    lines = []
    for n, (subscripts, shapes) in enumerate(EINSUMS):
        names = ", ".join(f"x{i}" for i in range(len(shapes)))
        lines += [f"def e{n}({names}):", f"    return einsum({subscripts!r}, {names})", "",
                  f"def loss_e{n}({names}):", f"    return sum(sin(e{n}({names})))", ""]
    return "\n".join(lines)


SOURCE = '''
def mm(a, b):
    return a @ b

def mm_named(a, b):
    return matmul(a, b)

def loss(a, b):
    return sum(sin(a @ b))

def attention(q, k, v):
    s = einsum("bhqd,bhkd->bhqk", q, k)
    return sum(sin(einsum("bhqk,bhkd->bhqd", sin(s), v)))

# the same with .mT (NumPy 2's, JAX's and torch's transpose of the last two axes)
def attention_mt(q, k, v):
    return sum(sin(sin(q @ k.mT) @ v))

# a grad block of products: linear in g (its other sides are free of it)
def projected(x, w):
    return x @ w
grad(g):
    return x=g @ transpose(w), w=einsum("bmk,bmn->kn", x, g)

def projected_loss(x, w):
    return sum(sin(projected(x, w)))

def merged(x):
    return reshape(x, (x.shape[0] * x.shape[1], x.shape[2])) * 2.0

# -1 for a size holding the batch's: one program for every batch, and rows on Dask
def layer(x, w):
    return reshape(reshape(x, (-1, 4)) @ w, (x.shape[0], -1, 2))

def pairs(x):
    return reshape(x, (-1, 8))

def halves(x):
    return reshape(x, (x.shape[0] * 2, 2)) * 2.0

def doubled(x):
    return concatenate([x, x], axis=0)

# einsums whose lowering merges the batch into a product's columns
def shared_left(a, b):
    return einsum("ij,bjk->bik", a, b)

def contracted(a, b):
    return einsum("bij,bik->jk", a, b)

def fixed(a, b):
    return a @ reshape(b, (4, 5))
''' + _einsum_functions()

M = dsl.loads(SOURCE, "products.grad")
RNG = np.random.default_rng(7)

# (left, right): every way ranks pair up, batch axes broadcast both ways
SHAPES = [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)),
          ((2, 3, 4), (4, 5)), ((2, 3, 4), (4,)), ((4,), (2, 4, 5)), ((3, 4), (2, 4, 5)),
          ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((1, 3, 4), (2, 4, 5))]


def normal(*shapes):
    return [RNG.normal(size=s) for s in shapes]


def np_loss(a, b):
    return np.sum(np.sin(a @ b))


@settings(max_examples=20, deadline=None)
@given(st.data())
def test_matmul_matches_numpy_for_any_ranks_with_batch_axes_broadcast(data):
    m, k, n = (data.draw(st.integers(1, 3)) for _ in range(3))
    batch = data.draw(st.lists(st.integers(1, 3), max_size=2))
    # each side: a rank-1 operand, or matrices under the batch's trailing
    # axes, each kept or made 1 (broadcast)
    def side(matrix: tuple, vector: tuple) -> tuple:
        if data.draw(st.booleans()):
            return vector
        lead = batch[len(batch) - data.draw(st.integers(0, len(batch))):]
        return tuple(d if data.draw(st.booleans()) else 1 for d in lead) + matrix
    a, b = normal(side((m, k), (k,)), side((k, n), (k,)))
    expected = np.matmul(a, b)
    np.testing.assert_allclose(M.mm(a, b), expected, rtol=1e-12, atol=1e-12)
    assert M.mm(a, b).shape == expected.shape
    result = M.mm_named(a.astype(np.float32), b.astype(np.float32))
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape,y_shape", SHAPES)
def test_matmul_gradients_jvp_and_vmap(x_shape, y_shape):
    a, b = normal(x_shape, y_shape)
    ga, gb = dsl.grad(M.loss, wrt=(0, 1))(a, b)
    np.testing.assert_allclose(ga, central_difference(np_loss, (a, b), 0), atol=1e-7)
    np.testing.assert_allclose(gb, central_difference(np_loss, (a, b), 1), atol=1e-7)
    ta, tb = normal(x_shape, y_shape)
    value, tangent = dsl.jvp(M.mm, (a, b), (ta, tb))
    ja, jb = dsl.jacrev(M.mm, wrt=(0, 1))(a, b)
    out = (a @ b).shape
    np.testing.assert_allclose(tangent, ta @ b + a @ tb, atol=1e-12)
    via_jacobian = (ja.reshape(out + (-1,)) @ ta.ravel()) + (jb.reshape(out + (-1,)) @ tb.ravel())
    np.testing.assert_allclose(tangent, via_jacobian, atol=1e-12)
    xs, ys = normal((2,) + x_shape, (2,) + y_shape)
    np.testing.assert_allclose(dsl.vmap(M.mm, in_axes=(0, None))(xs, b),
                               np.stack([x @ b for x in xs]), atol=1e-12)
    np.testing.assert_allclose(dsl.vmap(M.mm, in_axes=(None, 0))(a, ys),
                               np.stack([a @ y for y in ys]), atol=1e-12)
    np.testing.assert_allclose(dsl.vmap(M.mm)(xs, ys),
                               np.stack([x @ y for x, y in zip(xs, ys)]), atol=1e-12)


def test_second_derivatives_of_a_batched_product():
    a, b, u = normal((1, 2, 3), (2, 3, 2), (1, 2, 3))
    gradient, eps = dsl.grad(M.loss), 1e-5
    numeric = (gradient(a + eps * u, b) - gradient(a - eps * u, b)) / (2 * eps)
    np.testing.assert_allclose(dsl.hvp(M.loss, wrt=0)(a, b, u), numeric, atol=1e-8)


@pytest.mark.parametrize("n", range(len(EINSUMS)))
def test_einsum_matches_numpy(n):
    subscripts, shapes = EINSUMS[n]
    xs = normal(*shapes)
    expected = np.einsum(subscripts, *xs)
    result = getattr(M, f"e{n}")(*xs)
    assert np.shape(result) == expected.shape
    np.testing.assert_allclose(result, expected, rtol=1e-12, atol=1e-12)
    if subscripts in DIFFERENTIATED:
        grads = dsl.grad(getattr(M, f"loss_e{n}"), wrt=tuple(range(len(xs))))(*xs)
        for i, g in enumerate(grads):
            numeric = central_difference(lambda *xs: np.sum(np.sin(np.einsum(subscripts, *xs))),
                                         xs, i)
            np.testing.assert_allclose(g, numeric, atol=1e-7)


def np_attention(q, k, v):
    s = np.einsum("bhqd,bhkd->bhqk", q, k)
    return np.sum(np.sin(np.einsum("bhqk,bhkd->bhqd", np.sin(s), v)))


def test_attention_like_products_value_and_gradient():
    q, k, v = normal((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4))
    np.testing.assert_allclose(M.attention(q, k, v), np_attention(q, k, v), rtol=1e-12)
    gradient = dsl.grad(M.attention, wrt=(0, 1, 2))
    for i, g in enumerate(gradient(q, k, v)):
        np.testing.assert_allclose(g, central_difference(np_attention, (q, k, v), i), atol=1e-7)
    # six products, as by hand; no transpose of a transpose (simplify composes them)
    eqns = gradient.ir(q, k, v).eqns
    assert sum(e.op == "matmul" for e in eqns) == 6
    made = {e.outputs[0] for e in eqns if e.op == "transpose"}
    assert not any(e.op == "transpose" and e.inputs[0] in made for e in eqns)


def test_mT_transposes_the_last_two_axes_as_numpy():
    """`q @ k.mT` was "arrays have no attribute 'mT'"."""
    q, k, v = normal((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4))
    np.testing.assert_allclose(M.attention_mt(q, k, v), np_attention(q, k, v), rtol=1e-12)
    for i, g in enumerate(dsl.grad(M.attention_mt, wrt=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(g, central_difference(np_attention, (q, k, v), i), atol=1e-7)
    with pytest.raises(dsl.GradError, match=r"<string>:2:12: error: \.mT transposes the last two "
                                            r"axes, and needs rank 2 or more, got rank 1"):
        dsl.loads("def f(x):\n    return x.mT\n").f(np.ones(3))


def test_a_grad_block_of_products_is_linear_and_its_gradient_is_used():
    x, w = normal((2, 3, 4), (4, 5))
    value = lambda x, w: np.sum(np.sin(x @ w))  # noqa: E731
    gx, gw = dsl.grad(M.projected_loss, wrt=(0, 1))(x, w)
    np.testing.assert_allclose(gx, central_difference(value, (x, w), 0), atol=1e-7)
    np.testing.assert_allclose(gw, central_difference(value, (x, w), 1), atol=1e-7)
    for block in ["return g @ g, w", "return x=einsum('ij,jk->ik', g, g), w=0"]:
        with pytest.raises(dsl.GradError, match="bad.grad:4:1[24]: error: .* not linear .*: "
                                                "a matrix product of two values that depend"):
            dsl.loads(f"def f(x, w):\n    return x @ w\ngrad(g):\n    {block}\n", "bad.grad")


def test_a_symbolic_size_meeting_a_fixed_one_is_compiled_for_its_value():
    a, b = normal((3, 4), (20,))
    np.testing.assert_allclose(M.fixed(a, b), a @ b.reshape(4, 5), atol=1e-12)
    with pytest.raises(dsl.GradError, match=r"products.grad:\d+:12: .*shapes \[3, 5\] and "
                                            r"\[4, 5\] do not match"):
        M.fixed(*normal((3, 5), (20,)))


def test_cuda_simulator_batched_products():
    cuda = dsl.loads(SOURCE, "products.grad", target="cuda")
    a, b = normal((2, 1, 2, 3), (3, 3, 2))
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        x, y = a.astype(dtype), b.astype(dtype)
        result = np.asarray(cuda.mm(x, y))
        assert result.dtype == dtype
        np.testing.assert_allclose(result, a @ b, atol=tol)
    # an empty batch: nothing to copy (the simulator refused the copy)
    empty = cuda.mm(*normal((0, 3, 4), (4, 2)))
    assert np.asarray(empty).shape == (0, 3, 2)
    # (the op table's tests check the batched row's VJP on CUDA: test_ops.py)
    q, k = normal((1, 2, 2, 3), (1, 2, 3, 3))
    np.testing.assert_allclose(np.asarray(cuda.e11(q, k)),
                               np.einsum("bhqd,bhkd->bhqk", q, k), atol=1e-12)


def test_dask_blocks_along_the_batch_axis_and_a_folded_product_keeps_its_rows():
    dask = optional_module("dask", "dask")
    da = optional_module("dask.array", "dask")
    a, b = normal((12, 2, 3, 4), (12, 1, 4, 2))
    blocks = [da.from_array(x, chunks=(4,) + x.shape[1:]) for x in (a, b)]
    # a sequence times a weight (the rows folded into one 2-d product's,
    # blocks of uneven size), and a result whose rows merge the batch's
    x, w = a[:, 0], RNG.normal(size=(4, 2))
    rows = da.from_array(x, chunks=(5, 3, 4))
    with dask.config.set(scheduler="sync"):
        value, grads = dask.compute(*dsl.value_and_grad(M.loss, wrt=(0, 1))(*blocks))
        layer, layer_grads = dask.compute(*dsl.value_and_grad(M.loss, wrt=(0, 1))(rows, w))
        merged = M.merged(rows)
        np.testing.assert_array_equal(merged.compute(), x.reshape(36, 4) * 2.0)
        assert merged.chunks[0] == (15, 15, 6)
        # a gradient elementwise (2 everywhere) of a function that is not one
        # of blocks of any shape: blocks of rows (it was "cannot reshape
        # [batch, axis1] (axis1*batch elements) to [2*batch, 2]", where
        # value_and_grad gave it)
        rows_of_4 = da.from_array(x[:, 0], chunks=(5, 4))
        np.testing.assert_array_equal(dsl.grad(M.halves)(rows_of_4).compute(),
                                      np.full((12, 4), 2.0))
        np.testing.assert_array_equal(M.mm(rows, w).compute(), x @ w)
    expected_value, expected = dsl.value_and_grad(M.loss, wrt=(0, 1))(a, b)
    np.testing.assert_allclose(value, expected_value, rtol=1e-12)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(layer, np_loss(x, w), rtol=1e-12)
    np.testing.assert_allclose(layer_grads[0], np.cos(x @ w) @ w.T, atol=1e-12)
    np.testing.assert_allclose(layer_grads[1], np.einsum("bij,bik->jk", x, np.cos(x @ w)),
                               atol=1e-12)
    # the batch merged into a product's columns: (3, batch * 4), then back
    left, y = RNG.normal(size=(2, 3)), RNG.normal(size=(12, 3, 4))
    ys = da.from_array(y, chunks=(5, 3, 4))
    with dask.config.set(scheduler="sync"):
        # (atol: an element that cancels to 3e-4 differed by 1e-13 of itself,
        # an ulp of its terms, from BLAS's order of the sum to einsum's)
        np.testing.assert_allclose(M.shared_left(left, ys).compute(),
                                   np.einsum("ij,bjk->bik", left, y), rtol=1e-13, atol=1e-15)
        contracted, grads = dask.compute(*dsl.value_and_grad(M.contracted, wrt=(0, 1))(ys, ys))
    np.testing.assert_allclose(contracted, np.einsum("bij,bik->jk", y, y), rtol=1e-13,
                               atol=1e-14)
    for got in grads:  # d sum(y^T y) / dy, each side: y summed over its last axis
        np.testing.assert_allclose(got, np.broadcast_to(y.sum(axis=2, keepdims=True), y.shape),
                                   rtol=1e-13)
    # a -1 the other sizes divide symbolically; one they do not needs the batch's length
    with dask.config.set(scheduler="sync"):
        np.testing.assert_array_equal(M.layer(rows, w).compute(),
                                      (x.reshape(-1, 4) @ w).reshape(12, 3, 2))
    with pytest.raises(dsl.ArgumentError, match=r"the size 12\*batch is divided by 8"):
        M.pairs(rows)
    np.testing.assert_array_equal(M.pairs(x), x.reshape(-1, 8))
    # a pullback takes cotangents of outputs whose rows are the batch's
    _, pullback = dsl.vjp(M.merged, rows)
    with pytest.raises(dsl.ArgumentError, match="output 0 has 36 rows, the batch's 12 merged"):
        pullback(np.ones((36, 4)))
    # rows concatenated (2*batch of them, a size since a9f80c4) put a
    # block's rows apart: an error at the op, not blocks concatenated each
    with pytest.raises(dsl.GradError, match=r"products.grad:\d+:12: error: `concatenate\(\[x, "
                                            r"x\], axis=0\)` moves data between the rows"):
        M.doubled(rows)


def call_error(source: str, *shapes) -> str:
    with pytest.raises(dsl.GradError) as info:
        dsl.loads(source, "bad.grad").f(*normal(*shapes))
    return str(info.value)


@pytest.mark.parametrize("body,shapes,where,message", [
    ("a @ b", [(3, 4), (5, 2)], "2:12", r"@ shapes \[3, 4\] and \[5, 2\] do not match"),
    ("a @ b", [(2, 3, 4), (3, 4, 2)], "2:12",
     r"@ shapes \[2, 3, 4\] and \[3, 4, 2\]: the batch axes \[2\] and \[3\] do not broadcast"),
    ("a @ b", [(), (3,)], "2:12", r"rank 1 or more"),
    ("matmul(a, b)", [(4,), (5,)], "2:12", r"do not match"),
    ("einsum('ij,jk->ik', a)", [(3, 4)], "2:19", "name 2 operands, but 1 was given"),
    ("einsum('ij,jk->ik', a, b)", [(3, 4), (4, 5, 1)], "2:19",
     r"operand 1 has rank 3 \(shape \[4, 5, 1\]\) but its subscripts 'jk' name 2 axes"),
    ("einsum('ij,jk->ik', a, b)", [(3, 4), (5, 2)], "2:19", "'j' is 4 long in one operand"),
    ("einsum('ij,jk->iz', a, b)", [(3, 4), (4, 2)], "2:19", "'z' is in no operand"),
    ("einsum('ii->i', a)", [(3, 3)], "2:19", "repeat 'i' within one operand"),
    ("einsum('...i->i', a)", [(3, 3)], "2:19", r"does not take '\.\.\.'"),
    ("einsum('ij->ii', a)", [(3, 3)], "2:19", "output 'ii' repeats 'i'"),
    ("einsum('i2->i', a)", [(3, 3)], "2:19", "not '2'"),
    ("einsum('i->i->i', a)", [(3,)], "2:19", "one '->'"),
    ("einsum(a, b)", [(3,), (3,)], "2:12", "subscripts as a string literal"),
    ("einsum('i->i')", [], "2:12", r"takes at least 2 positional arguments but 1 was given"),
])
def test_misuse_is_a_grad_error_at_its_position(body, shapes, where, message):
    names = ", ".join("ab"[:len(shapes)])
    err = call_error(f"def f({names}):\n    return {body}\n", *shapes)
    assert err.startswith(f"bad.grad:{where}: error: "), err
    assert re.search(message, err), err


@pytest.mark.parametrize("source,where", [
    ("def f(a):\n    s = 'ij'\n    return einsum(s, a)\n", "2:9"),
    ("def f(a):\n    return a + 'ij'\n", "2:16"),
])
def test_a_string_anywhere_but_einsums_subscripts_is_refused_at_load(source, where):
    with pytest.raises(dsl.GradError, match=f"bad.grad:{where}: error: a string can only be "
                                            "einsum"):
        dsl.loads(source, "bad.grad")
