"""Time to first gradient in a fresh Python process, cold and warm.

Each sample is a new process that imports its library, loads or defines a
function and computes its first gradient; the time is measured inside the
process from before the import to after the gradient.  dsl cold: empty
GRADC_CACHE_DIR and NUMBA_CACHE_DIR; dsl warm: a second process on the
directories the cold one filled; dsl aot: importing what
`gradc compile --sig` made (dense loss only).  JAX: the same function under
`jax.jit` in a fresh process (no persistent compilation cache).  Each
body's first line is its imports; "dsl warm after imports" is the warm
time less the imports (numpy, numba, lark and gradlang's own modules): the
front end, the pipeline, and loading the cached kernels.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

TIMED = """
import time; t0 = time.perf_counter()
{imports}
t1 = time.perf_counter()
{work}
print(t1 - t0, time.perf_counter() - t0)
"""

# name: (dsl body, JAX body); both end after the first gradient is computed.
FUNCTIONS = {
    "log1pexp": (f"""
import numpy as np, dsl, dsl.api  # dsl imports its API on first use
m = dsl.load({str(EXAMPLES / 'log1pexp.grad')!r})
dsl.value_and_grad(m.log1pexp)(np.linspace(-5.0, 5.0, 1000))
""", """
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
@jax.custom_vjp
def log1pexp(x):
    return jnp.log1p(jnp.exp(x))
def fwd(x):
    e = jnp.exp(x)
    return jnp.log1p(e), e
log1pexp.defvjp(fwd, lambda e, dy: (dy * (1 - 1 / (1 + e)),))
@jax.jit
def value_and_grad(x):
    v, pullback = jax.vjp(log1pexp, x)
    return v, pullback(jnp.ones_like(v))[0]
jax.block_until_ready(value_and_grad(np.linspace(-5.0, 5.0, 1000)))
"""),
    "dense loss": (f"""
import numpy as np, dsl, dsl.api  # dsl imports its API on first use
m = dsl.load({str(EXAMPLES / 'dense.grad')!r})
dsl.grad(m.loss, wrt=(0, 1, 2))(np.ones((8, 4)), np.ones((4, 3)), np.ones(3), np.zeros((8, 3)))
""", """
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
@jax.custom_vjp
def softplus(z):
    return jnp.maximum(z, 0) + jnp.log1p(jnp.exp(-jnp.abs(z)))
softplus.defvjp(lambda z: (softplus(z), z), lambda z, dz: (dz * jax.nn.sigmoid(z),))
def loss(x, w, b, target):
    err = softplus(x @ w + b) - target
    return jnp.mean(jnp.sum(err * err, axis=1))
g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
jax.block_until_ready(g(np.ones((8, 4)), np.ones((4, 3)), np.ones(3), np.zeros((8, 3))))
"""),
    "checkpoint plain": (f"""
import numpy as np, dsl, dsl.api  # dsl imports its API on first use
m = dsl.load({str(EXAMPLES / 'checkpoint.grad')!r})
dsl.grad(m.plain, wrt=(0, 1))(np.full((8, 8), 0.1), np.eye(8))
""", """
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
def plain(x, w):
    h = x
    for _ in range(20):
        h = jnp.tanh(h @ w)
    return jnp.sum(h)
g = jax.jit(jax.grad(plain, argnums=(0, 1)))
jax.block_until_ready(g(np.full((8, 8), 0.1), np.eye(8)))
"""),
}

AOT_SIGNATURE = "loss(f64[b, i], f64[i, o], f64[o], f64[b, o])"
AOT = """
import sys; sys.path.insert(0, {out!r}); import numpy as np, dense
dense.loss.grad(np.ones((8, 4)), np.ones((4, 3)), np.ones(3), np.zeros((8, 3)))
"""


def run_cold(template: str, body: str, **fields) -> str:
    """The output of `template` (formatted with the body's first line as
    `imports`, the rest as `work`, and `fields`) run in a fresh process
    with empty kernel and Numba caches, with bytecode as an installed
    package has it (the measurements of bench_collection.py and
    bench_lean_compile.py)."""
    imports, _, work = body.strip().partition("\n")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GRADC_CACHE_DIR": f"{tmp}/gradc", "NUMBA_CACHE_DIR":
               f"{tmp}/numba", "PYTHONPATH": str(ROOT)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        code = template.format(imports=imports, work=work, **fields)
        result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                                capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return result.stdout


def time_process(body: str, env: dict) -> tuple[float, float]:
    """(seconds of the body's first line, its imports; seconds of it all)."""
    imports, _, work = body.strip().partition("\n")
    result = subprocess.run([sys.executable, "-c", TIMED.format(imports=imports, work=work)],
                            env=env, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"startup sample failed:\n{result.stderr[-2000:]}")
    import_s, total_s = map(float, result.stdout.strip().splitlines()[-1].split())
    return import_s, total_s


def measure(repeats: int, with_jax: bool) -> dict[str, dict[str, float]]:
    """{function: {column: median seconds}} over `repeats` fresh cache dirs."""
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in FUNCTIONS}
    for _ in range(repeats):
        for name, (dsl_body, jax_body) in FUNCTIONS.items():
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "GRADC_CACHE_DIR": f"{tmp}/gradc",
                       "NUMBA_CACHE_DIR": f"{tmp}/numba", "PYTHONPATH": str(ROOT)}
                # Python's bytecode cache, as an installed package has it:
                # with PYTHONDONTWRITEBYTECODE every process would compile
                # the modules gradlang imports on first use, and the kernel
                # modules, from source (10-20 ms, which no user pays).
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                row = samples[name]
                row.setdefault("dsl cold", []).append(time_process(dsl_body, env)[1])
                import_s, warm_s = time_process(dsl_body, env)
                row.setdefault("dsl warm", []).append(warm_s)
                row.setdefault("dsl warm after imports", []).append(warm_s - import_s)
                if name == "dense loss":
                    out = f"{tmp}/aot"
                    subprocess.run([sys.executable, "-m", "dsl.cli", "compile",
                                    str(EXAMPLES / "dense.grad"), "-o", out,
                                    "--sig", AOT_SIGNATURE],
                                   env=env, cwd=ROOT, check=True, capture_output=True)
                    row.setdefault("dsl aot import", []).append(
                        time_process(AOT.format(out=out), env)[1])
                if with_jax:
                    row.setdefault("jax jit", []).append(time_process(jax_body, env)[1])
    return {name: {col: statistics.median(s) for col, s in row.items()}
            for name, row in samples.items()}
