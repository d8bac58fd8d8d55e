"""What a user reads when a call goes wrong: each error names the function
or transform as the caller wrote it (`hessian(f)`, not the `jacfwd(grad(f))`
it is made of), and a source error the operation the source wrote, at its
line and column, with a caret."""
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
