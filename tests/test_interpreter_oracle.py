"""Generated kernels agree with the NumPy reference interpreter of the same
IR, for the examples' functions and their gradients, on random inputs."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from gradlang.compiler.interpret import interpret
from dsl.function import _types

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

PROGRAMS = """
def softmax_xent(logits: f64[b, k], labels: const f64[b, k]):
    z = logits - max(logits, axis=1, keepdims=True)
    logp = z - log(sum(exp(z), axis=1, keepdims=True))
    return -mean(sum(labels * logp, axis=1))

def layer_norm(x: f64[b, k], g: f64[k]):
    mu = mean(x, axis=1, keepdims=True)
    var = mean((x - mu) ** 2, axis=1, keepdims=True)
    return g * (x - mu) / sqrt(var + 1e-5)

def slices(x: f64[n, m]):
    a = x[1:, ::2]
    b = x[0]
    return sum(a * a) + sum(b) + sum(x.T[:, -1]) + max(minimum(x, 0.5)) \
        + sum(cumsum(x, axis=1) * cumsum(b))

def mixed(x, k: const i64 = 3):
    y = clip(x, -1, 1) * k + where(x > 0, x, -x) ** 2
    return concatenate((y, stack((x, x), axis=0)[1]), axis=0)
"""


@pytest.fixture(scope="module")
def module():
    return dsl.loads(PROGRAMS, "programs.grad")


def check_against_oracle(f, args):
    bound = f.bind(args, {})
    program = f.program(bound)
    got = program(*bound.values())
    expected = interpret(f.lower(_types(bound)), *bound.values())
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 4), st.integers(2, 5), st.integers(0, 2**31))
def test_programs_match_interpreter(module, b, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, k))
    labels = rng.dirichlet(np.ones(k), size=b)
    for f, args in ((module.softmax_xent, (x, labels)), (module.layer_norm, (x, rng.normal(size=k))),
                    (module.slices, (rng.normal(size=(b + 1, k)),)), (module.mixed, (x[0],))):
        check_against_oracle(f, args)
        check_against_oracle(dsl.value_and_grad(f), args)


def test_examples_match_interpreter():
    rng = np.random.default_rng(0)
    dense = dsl.load(EXAMPLES / "dense.grad")
    args = (rng.normal(size=(3, 4)), rng.normal(size=(4, 2)), rng.normal(size=2),
            rng.normal(size=(3, 2)))
    check_against_oracle(dense.loss, args)
    check_against_oracle(dsl.value_and_grad(dense.loss, wrt=(0, 1, 2)), args)
    log1pexp = dsl.load(EXAMPLES / "log1pexp.grad").log1pexp
    check_against_oracle(dsl.value_and_grad(log1pexp), (np.linspace(-5, 5, 7),))


def test_softmax_xent_gradient_is_softmax_minus_labels(module):
    rng = np.random.default_rng(3)
    x, labels = rng.normal(size=(4, 5)), rng.dirichlet(np.ones(5), size=4)
    g = dsl.grad(module.softmax_xent)(x, labels)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(g, (p - labels) / 4, rtol=1e-10, atol=1e-14)
