"""Shared test helpers: central finite differences in f64."""
from __future__ import annotations

import numpy as np


def central_difference(f, args, index, eps=1e-6):
    """d sum(f(args)) / d args[index] by central differences, elementwise."""
    x = np.array(args[index], dtype=np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        plus = list(args)
        minus = list(args)
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        plus[index], minus[index] = xp, xm
        grad[i] = (np.sum(f(*plus)) - np.sum(f(*minus))) / (2 * eps)
    return grad


def weighted(f, u):
    """x -> <u, f(x)>, for VJP checks with a cotangent u."""
    return lambda *args: np.sum(np.asarray(f(*args), dtype=np.float64) * u)
