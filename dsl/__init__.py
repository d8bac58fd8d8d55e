"""`dsl`: the Python face of the `.grad` language.

    import dsl
    m = dsl.load("examples/log1pexp.grad")
    y = m.log1pexp(x)
    g = dsl.grad(m.log1pexp)(x)
"""
from dsl.api import Module, grad, load, loads, value_and_grad, vjp
from dsl.errors import ArgumentError, GradError, Span

__all__ = ["ArgumentError", "GradError", "Module", "Span", "grad", "load", "loads",
           "value_and_grad", "vjp"]
