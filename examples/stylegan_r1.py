"""Driver for stylegan_r1.grad: the R1 penalty and its gradient w.r.t. the
discriminator's weights, and a check that both grad blocks agree with
finite differences.

    python examples/stylegan_r1.py
"""
from pathlib import Path

import numpy as np

import dsl

m = dsl.load(Path(__file__).with_name("stylegan_r1.grad"))
x = np.array([-2.0, -0.5, 0.5, 3.0])
w = np.array([1.5, -1.0, 2.0, 0.7])

print("df/dx        =", dsl.grad(m.discriminator)(x, w))
print("R1           =", m.r1_penalty(x, w))
print("dR1/dw       =", dsl.grad(m.r1_penalty, wrt=1)(x, w))
for check in dsl.check_gradients(m.leaky_relu, x) + dsl.check_gradients(m.r1_penalty, x, w):
    print(check)
