"""The op table's type rules as the builder and the IR verifier ask them
(`ops.output_types`): answers remembered for plain params, errors not."""
import numpy as np
import pytest

import dsl
from gradlang.compiler import ops
from gradlang.compiler.ir import TensorType


def test_a_type_error_names_its_own_line_each_time_it_is_met():
    # the same op on the same types fails in both files: a remembered
    # failure would name the first file's line in the second's error
    for line in (2, 4):
        source = "\n" * (line - 2) + "def f(x: f64[2], y: f64[3]):\n    return x + y\n"
        f = dsl.loads(source, "bad.grad").f
        with pytest.raises(dsl.GradError, match="do not broadcast") as error:
            f(np.ones(2), np.ones(3))
        assert f"bad.grad:{line}:12" in str(error.value)


def test_remembered_answers_are_the_rules_and_stay_bounded():
    f64 = TensorType("f64", (3, 4))
    cases = [("reduce_sum", [f64], (("axes", (0,)),)), ("reduce_sum", [f64], (("axes", (1,)),)),
             # (True == 1: the param's type is in the key, so each is asked)
             ("concatenate", [f64, f64], (("axis", 1),)),
             ("concatenate", [f64, f64], (("axis", True),))]
    for op, types, params in cases:
        expected = ops.OPS[op].type_rule(types, dict(params), None)
        assert ops.output_types(op, types, params, None) == expected
        assert ops.output_types(op, types, params, None) == expected
    for n in range(5000):
        ops.output_types("exp", [TensorType("f64", (n,))], (), None)
    assert len(ops._REMEMBERED_TYPES) <= 4096
