"""dsl.vmap against independent references where its rules meet their
edges: a mapped argument that a program uses as a size (each example its
own program), vmap of a vmap that runs one example at a time."""
from __future__ import annotations

import numpy as np
import pytest

import dsl

SOURCE = """
def pooled(v, ids, n):
    return sum(segment_sum(v, ids, n) ** 2)

def segments(v, ids, n):
    return segment_sum(v, ids, n)
"""


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE)


def test_a_mapped_size_runs_one_example_at_a_time(m):
    # n is num_segments: each example's program is compiled for its own n
    # (it used to raise "must be an integer on the host")
    v, ids = np.arange(12.0).reshape(3, 4), np.array([0, 1, 1, 0])
    ns = np.array([2, 3, 4])
    expected = [np.sum(np.bincount(ids, v[i], minlength=n) ** 2) for i, n in enumerate(ns)]
    np.testing.assert_allclose(dsl.vmap(m.pooled, in_axes=(0, None, 0))(v, ids, ns), expected,
                               rtol=1e-15)
    grads = dsl.vmap(dsl.grad(m.pooled), in_axes=(0, None, 0))(v, ids, ns)
    np.testing.assert_allclose(grads, [2 * np.bincount(ids, v[i])[ids] for i in range(3)],
                               rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match=r"vmap\(segments\) .*results of different "
                                                 r"shapes: \[2\] for example 0, \[3\] for "
                                                 "example 1"):
        dsl.vmap(m.segments, in_axes=(0, None, 0))(v, ids, ns)


def test_vmap_of_a_vmap_that_runs_one_example_at_a_time(m):
    # the inner vmap has no program (a mapped index array): the outer one
    # runs it once per outer example (it raised "no program of its own")
    pick = dsl.loads("def pick(x, idx):\n    return sum(x[idx] * 2.0)\n").pick
    x, idx = np.arange(24.0).reshape(2, 4, 3), np.array([[0, 2], [1, 1], [2, 0], [0, 0]])
    expected = [[2 * x[a, b, idx[b]].sum() for b in range(4)] for a in range(2)]
    np.testing.assert_allclose(dsl.vmap(dsl.vmap(pick), in_axes=(0, None))(x, idx), expected,
                               rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match=r"vmap\(pick\) runs one example at a time "
                                                 r"here \(its op take has no rule"):
        dsl.vmap(dsl.grad(dsl.vmap(pick)), in_axes=(0, None))(x, idx)
