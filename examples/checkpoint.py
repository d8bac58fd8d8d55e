"""Driver for checkpoint.grad: @recompute keeps only the inputs for the
backward pass, the plain chain keeps every activation; gradients agree.

    python examples/checkpoint.py
"""
from pathlib import Path

import numpy as np

import dsl

m = dsl.load(Path(__file__).with_name("checkpoint.grad"))
rng = np.random.default_rng(0)
x, w = rng.normal(size=(64, 32)), rng.normal(size=(32, 32)) / 6
for f in (m.plain, m.checkpointed):
    out, pullback = dsl.vjp(f, x, w)
    dx, dw = pullback(np.ones_like(out))
    print(f"{f.name:>12}: residuals {pullback.residual_bytes:>8} bytes "
          f"(inputs {x.nbytes + w.nbytes}), |dw| = {np.linalg.norm(dw):.12f}")
