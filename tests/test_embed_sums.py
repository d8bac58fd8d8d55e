"""Two rewrites that fusion makes on every target.

Sums of embeds (`compiler.in_place_sums`): a gradient that sums the
transposes of several slices of one array adds each into one buffer in
place (`embed_add`).  Values against NumPy on the CPU and the CUDA
simulator: overlapping regions, strides along several axes, a reversed
slice (steps of -1 and -2 along the last axis too), an embed added to a value that is no embed (a caller's array, left
unchanged), a region of more axes than the CPU's strided kernel takes;
under vmap and jvp (forward over reverse).  Regions proved disjoint
(`compiler.regions`, against brute force) are written, not added: values
where they tile the buffer, where they leave gaps, where some overlap, and
where the base is no embed; and the gradient of random strided slices
(Hypothesis) against NumPy's scatter-add.

Elementwise work between a transpose and its inverse in the untransposed
layout (`compiler.layouts`): values and gradients against NumPy on both
targets, and a region that reads another layout left as it was."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler.fusion import Loop, fuse
from gradlang.compiler.regions import disjoint
from gradlang.compiler.shapes import Sym

SOURCE = '''
def slices(x, a, b, c, d):
    return sum(x[1:4] * a) + sum(x[:, 1:] * b) + sum(x[::2, ::2] * c) + sum(x[::-1] * d)

def regions(x, y, z, w, v, a, b, c, d, e, f, g, h, k, m, n):
    tiles = sum(x[::2, ::2] * a) + sum(x[::2, 1::2] * b) + sum(x[1::2, ::2] * c) + \
        sum(x[1::2, 1::2] * d)
    gaps = sum(y[::-3] * e) + sum(y[1::3, 1:] * f)
    overlapping = sum(z[::2] * g) + sum(z[2::2] * h) + sum(z[1::2, ::2] * k)
    onto = sum(w[::2] * m) + sum(w * v) + sum(w[1::2] * n)
    return tiles + gaps + overlapping + onto

def mixed(x, y, a):
    return sum(x * y) + sum(x[1:, ::-2] * a)

def flipped(x, a):
    return sum(x[::-2, ::-1] * a)

def deep(x, a):
    return sum(x[::2, :, ::2, :, ::2] * a) + sum(x * x)

def activation(x, w):
    return sum(tanh(transpose(x @ w, [0, 2, 1])) * 3.0)

def mixed_layouts(x, w, c):
    return sum(tanh(transpose(x @ w, [0, 2, 1])) * c)

def activation_alone(x):
    return sum(tanh(transpose(x, [1, 2, 0])) * 3.0)
'''
M = dsl.loads(SOURCE, "embeds.grad")


def slices_gradient(a, b, c, d):
    g = np.zeros((6, 5))
    g[1:4] += a
    g[:, 1:] += b
    g[::2, ::2] += c
    g[::-1] += d
    return g


def arrays(rng):
    x, a, b, c, d = (rng.normal(size=s) for s in ((6, 5), (3, 5), (6, 4), (3, 3), (6, 5)))
    y, e = rng.normal(size=(6, 5)), rng.normal(size=(5, 3))
    z, f = rng.normal(size=(3, 4, 5, 6, 7)), rng.normal(size=(2, 4, 3, 6, 4))
    return x, a, b, c, d, y, e, z, f


def fused_ops(function, *args):
    return [s.op for s in fuse(function.ir(*args)) if not isinstance(s, Loop)]


def fused_perms(function, *args):
    return [tuple(s.p["perm"]) for s in fuse(function.ir(*args))
            if not isinstance(s, Loop) and s.op == "transpose"]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_summed_embeds_add_into_one_buffer(target):
    m = M if target == "cpu" else dsl.loads(SOURCE, "embeds.grad", target=target)
    x, a, b, c, d, y, e, z, f = arrays(np.random.default_rng(0))
    grad = dsl.grad(m.slices)
    # one buffer of zeros, the three other embeds added into it
    assert fused_ops(grad, x, a, b, c, d).count("embed_add") == 3
    np.testing.assert_allclose(grad(x, a, b, c, d), slices_gradient(a, b, c, d), rtol=1e-14)
    single = [v.astype(np.float32) for v in (x, a, b, c, d)]
    got = grad(*single)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, slices_gradient(*single[1:]), rtol=1e-6)
    # an embed added to a caller's array: a copy of it, which stays as it was
    y_before = y.copy()
    gx, gy = dsl.grad(m.mixed, wrt=(0, 1))(x, y, e)
    expected = y.copy()
    expected[1:, ::-2] += e
    np.testing.assert_allclose(gx, expected, rtol=1e-14)
    np.testing.assert_array_equal(y, y_before)
    np.testing.assert_allclose(gy, x, rtol=1e-14)
    expected = np.zeros((6, 5))
    expected[::-2, ::-1] = d[:3]
    np.testing.assert_allclose(dsl.grad(m.flipped)(x, d[:3]), expected, rtol=1e-14)
    # five strided axes, none merging: past the CPU kernel's rank
    expected = 2 * z
    expected[::2, :, ::2, :, ::2] += f
    np.testing.assert_allclose(dsl.grad(m.deep)(z, f), expected, rtol=1e-14)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_disjoint_regions_are_written_not_added(target):
    m = M if target == "cpu" else dsl.loads(SOURCE, "embeds.grad", target=target)
    rng = np.random.default_rng(4)
    x, y, z, w, v = (rng.normal(size=s) for s in ((6, 4), (7, 5), (7, 5), (7, 5), (7, 5)))
    pieces = [rng.normal(size=s) for s in ((3, 2),) * 4 + ((3, 5), (2, 4), (4, 5), (3, 5),
                                                              (3, 3), (4, 5), (3, 5))]
    a, b, c, d, e, f, g, h, k, mm, n = pieces
    grad = dsl.grad(m.regions, wrt=(0, 1, 2, 3))
    tiles = np.zeros((6, 4))
    tiles[::2, ::2], tiles[::2, 1::2], tiles[1::2, ::2], tiles[1::2, 1::2] = a, b, c, d
    gaps = np.zeros((7, 5))  # the rows and column no region reaches stay 0
    gaps[::-3], gaps[1::3, 1:] = e, f
    overlapping = np.zeros((7, 5))  # rows 2, 4, 6 get both g and h
    overlapping[::2] += g
    overlapping[2::2] += h
    overlapping[1::2, ::2] += k
    onto = v.copy()
    onto[::2] += mm
    onto[1::2] += n
    for got, want in zip(grad(x, y, z, w, v, *pieces), (tiles, gaps, overlapping, onto)):
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    single = [u.astype(np.float32) for u in (x, y, z, w, v, *pieces)]
    for got, want in zip(grad(*single), (tiles, gaps, overlapping, onto)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    steps = [s for s in fuse(grad.ir(x, y, z, w, v, *pieces))
             if not isinstance(s, Loop) and s.op == "embed_add"]
    # written: three of the tiles, one of the gaps' two, the overlapping
    # rows' one disjoint window; onto v (a caller's array) every one is added
    assert sum(s.p.get("assign", False) for s in steps) == 5


def _normalized(size, draw):
    """A slice's (start, stop, step) on an axis of `size`, normalized."""
    start, stop = draw(st.one_of(st.none(), st.integers(-8, 8))), \
        draw(st.one_of(st.none(), st.integers(-8, 8)))
    step = draw(st.sampled_from([-3, -2, -1, 1, 2, 3, 5]))
    return slice(start, stop, step).indices(size)


@st.composite
def two_regions(draw):
    shape = tuple(draw(st.lists(st.integers(0, 8), min_size=1, max_size=3)))
    regions = [tuple(zip(*(_normalized(n, draw) for n in shape))) for _ in range(2)]
    return shape, regions


def elements(region) -> set:
    return set(itertools.product(*(range(*axis) for axis in zip(*region))))


@settings(max_examples=150, deadline=None)
@given(two_regions())
def test_disjoint_regions_against_brute_force(case):
    # a wrong residue or range (a negative step's first index, a period
    # past the first) would claim regions that meet disjoint: their
    # assigned values would overwrite each other
    shape, (r, s) = case
    meet = bool(elements(r) & elements(s))
    assert disjoint(r, s) == (not meet)


def _bound(draw, size):
    return draw(st.one_of(st.none(), st.integers(-size - 2, size + 2)))


@st.composite
def strided_slices(draw):
    """An array's shape and 2-6 slices of it, as Python slices: negative and
    empty ones, steps past the axis, on each axis at once."""
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    steps = st.one_of(st.none(), st.sampled_from([1, 2, 3, 4, 9, -1, -2, -3, -9]))
    count = draw(st.integers(2, 6))
    return shape, [tuple(slice(_bound(draw, n), _bound(draw, n), draw(steps)) for n in shape)
                   for _ in range(count)]


def _text(s: slice) -> str:
    return ":".join("" if v is None else str(v) for v in (s.start, s.stop, s.step))


@settings(max_examples=40, deadline=None)
@given(strided_slices())
def test_gradient_of_strided_slices_against_a_scatter_add(case):
    # catches: a region proved disjoint (compiler.regions) that is not, its
    # embed_add then written over another slice's cotangent, or a strided
    # add (runtime's _strided_rows_add) that misses or repeats an element:
    # the gradient of sum(x[s_k] * c_k) is each c_k added at its slice's
    # indices, here by np.add.at on index grids, apart from the slicing
    shape, slices = case
    names = [f"c{k}" for k in range(len(slices))]
    terms = [f"sum(x[{', '.join(map(_text, s))}] * {c})" for s, c in zip(slices, names)]
    source = f"def f(x, {', '.join(names)}):\n    return {' + '.join(terms)}\n"
    rng = np.random.default_rng(len(source))
    x = rng.normal(size=shape)
    grids = [np.ix_(*(np.arange(n)[part] for n, part in zip(shape, s))) for s in slices]
    pieces = [rng.normal(size=np.broadcast_shapes(*(g.shape for g in grid))) for grid in grids]
    expected = np.zeros(shape)
    for grid, piece in zip(grids, pieces):
        np.add.at(expected, grid, piece)
    got = dsl.grad(dsl.loads(source, "strided.grad").f)(x, *pieces)
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-15)


def test_disjoint_regions_of_symbolic_sizes():
    n = Sym.named("n")
    whole = ((0, 0), (n, 6), (1, 2))  # every row, even columns, of n rows
    odd = ((0, 1), (n, 6), (1, 2))
    assert disjoint(whole, odd)
    assert not disjoint(whole, ((3, 0), (4, 6), (1, 3)))  # row 3, columns 0 and 3
    assert disjoint(whole, ((3, 1), (4, 4), (1, 2)))  # row 3, columns 1 and 3
    # a symbolic start: nothing is proved
    assert not disjoint(((n,), (8,), (1,)), ((0,), (1,), (1,)))
    # a symbolic stop with a step (`x[::2]`, `x[1:-1:2]`, `shapes.sliced`)
    # is the progression from its start with no end
    shorter = Sym.named("n\u00b7less1")
    assert disjoint(((0,), (n,), (2,)), ((1,), (shorter,), (2,)))
    assert not disjoint(((0,), (n,), (2,)), ((2,), (shorter,), (4,)))


def test_summed_embeds_under_vmap_and_forward_over_reverse():
    rng = np.random.default_rng(1)
    x, a, b, c, d, *_ = arrays(rng)
    grad = dsl.grad(M.slices)
    stacks = [np.stack([v, 2 * v + 1]) for v in (a, b, c, d)]
    batched = dsl.vmap(dsl.grad(M.slices), in_axes=(None, 0, 0, 0, 0))(x, *stacks)
    for k in range(2):
        np.testing.assert_allclose(batched[k], slices_gradient(*(s[k] for s in stacks)),
                                   rtol=1e-14)
    tangents = [rng.normal(size=v.shape) for v in (x, a, b, c, d)]
    value, tangent = dsl.jvp(grad, (x, a, b, c, d), tuple(tangents))
    np.testing.assert_allclose(value, slices_gradient(a, b, c, d), rtol=1e-14)
    np.testing.assert_allclose(tangent, slices_gradient(*tangents[1:]), rtol=1e-14)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_elementwise_work_runs_in_the_untransposed_layout(target):
    m = M if target == "cpu" else dsl.loads(SOURCE, "embeds.grad", target=target)
    rng = np.random.default_rng(2)
    x, w, c = rng.normal(size=(2, 5, 3)), rng.normal(size=(3, 4)), rng.normal(size=(2, 4, 5))
    function = dsl.value_and_grad(m.activation, wrt=(0, 1))
    # the product's transpose and the gradient's transpose back are gone
    assert (0, 2, 1) not in fused_perms(function, x, w)
    value, (gx, gw) = function(x, w)
    y = np.tanh(x @ w)
    slope = 3.0 * (1 - y * y)
    np.testing.assert_allclose(value, np.sum(3.0 * y), rtol=1e-13)
    np.testing.assert_allclose(gx, slope @ w.T, rtol=1e-13)
    np.testing.assert_allclose(gw, np.einsum("bij,bik->jk", x, slope), rtol=1e-13)
    # c is read in the transposed layout: the region stays there
    function = dsl.value_and_grad(m.mixed_layouts, wrt=(0, 1, 2))
    assert (0, 2, 1) in fused_perms(function, x, w, c)
    value, (gx, gw, gc) = function(x, w, c)
    y = np.tanh(x @ w).transpose(0, 2, 1)
    np.testing.assert_allclose(value, np.sum(y * c), rtol=1e-13)
    np.testing.assert_allclose(gc, y, rtol=1e-13)
    np.testing.assert_allclose(gx, (c * (1 - y * y)).transpose(0, 2, 1) @ w.T, rtol=1e-13)
    # the gradient transposed back is returned as it is: the function keeps
    # its outputs (the driver had no name for the one the region renamed)
    function = dsl.value_and_grad(m.activation_alone)
    assert fused_perms(function, x) == []
    value, gx = function(x)
    np.testing.assert_allclose(value, np.sum(3.0 * np.tanh(x)), rtol=1e-13)
    np.testing.assert_allclose(gx, 3.0 * (1 - np.tanh(x) ** 2), rtol=1e-13)
