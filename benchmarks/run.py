"""The benchmark suite: the dsl against NumPy by hand, JAX (`jit`,
`custom_vjp`) and PyTorch (eager, `autograd.Function`) when importable.

    python benchmarks/run.py [--quick] [--only log1pexp r1 ...] [--output FILE]

Workloads (see workloads.py, startup.py): log1pexp value + gradient (f32,
f64; 1e3, 1e5, 1e7), StyleGAN's R1 penalty and its gradient (second order;
1e5, 1e7), a 4096x512 @ 512x512 f32 dense layer + bias + softplus + sum
with gradients for w and b, attention (8 x 8 heads, seq 128, dim 64, f32:
softmax(q k^T / sqrt(d)) v, value + gradient for q, k, v), a conv layer
(32x16x32x32, 32 kernels 3x3, padding 1, softplus, f32: value + gradient
for x and the kernel), max pooling (2x2, and 3x3 at stride 2 with padding
1; 32x16x32x32 f32, softplus: value + gradient), a batch norm over NCHW
(32x64x32x32 f32, per-channel scale and shift, softplus: value + gradients),
sum(x * x), sin(x) cos(x) and x ** y value +
gradient (f32, f64; 1e6), value + gradient per call at n = 16
(and benchmarks/bench_call.py when present), log1pexp at 1e7 into reused
`out=` buffers against fresh results, a 1,000-step loop's value and
gradient and @recompute's residual bytes (issue 10), an RK4 fit to 300
observations (value + gradient), forward mode: jvp
against value_and_grad and jacfwd (issue 11), gathers and scatter-adds, `to_torch`
and Dask (issue 12), time to first gradient in
fresh processes (cold and warm caches, beside JAX's jit), and
benchmarks/bench_cuda.py when a CUDA GPU is present.

Every implementation is checked against NumPy's results before it is
timed.  Times are medians over interleaved rounds (timing.py); a ratio is
the dsl's time over the other's: below 1 the dsl is faster.  A ratio that
is an acceptance figure between two of the dsl's own calls (jvp against
value_and_grad) is measured again as a median of paired rounds' ratios.  The report is
printed and written as Markdown to benchmarks/results/<date>-<host>.md
with the machine's description and its load average at start and end.
`--quick` runs fewer rounds (same sizes, but a tenth of the loop's elements
and of the Dask rows).
"""
from __future__ import annotations

import argparse
import datetime
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import startup  # noqa: E402
import timing  # noqa: E402
import workloads  # noqa: E402

OTHERS = ("numpy", "jax", "torch")
WORKLOADS = ("log1pexp", "r1", "per_example", "dense", "attention", "conv", "pool", "norm",
             "broadcast", "fused_sum", "sincos_pow", "call", "out",
             "loop", "forward", "indexing", "interop", "startup", "cuda")


def cases_for(name: str, quick: bool) -> tuple[str, list[workloads.Case]]:
    if name == "log1pexp":
        return ("log1pexp: value + gradient (examples/log1pexp.grad, grad block)",
                workloads.log1pexp_cases([10**3, 10**5, 10**7], [np.float32, np.float64]))
    if name == "r1":
        return ("StyleGAN R1 penalty + gradient w.r.t. w (examples/stylegan_r1.grad, "
                "second order)", workloads.r1_cases([10**5, 10**7]))
    if name == "per_example":
        return ("per-example gradients: dsl.vmap(dsl.grad(loss, wrt=2), in_axes=(0, 0, None)) of "
                "a logistic loss, one program (jax: jit(vmap(grad)); torch: torch.func; "
                "dsl through to_jax: jit(vmap(grad)) of dsl.to_jax(loss)); then each example's "
                "jvp: dsl.jvp(dsl.vmap(loss)), jit(vmap(jvp)) of JAX's loss and of to_jax(loss), "
                "torch.func.vmap(jvp)",
                workloads.per_example_cases(10**5, 64))
    if name == "dense":
        return ("dense: sum(softplus(x @ w + b)), gradients for w and b "
                "(benchmarks/dense_f32.grad)", workloads.dense_cases(4096, 512, 512))
    if name == "attention":
        return ("attention: sum(o * o), o = softmax(q k^T / sqrt(d)) v with einsum, gradients "
                "for q, k and v (benchmarks/attention.grad)",
                workloads.attention_cases(8, 8, 128, 64))
    if name == "conv":
        return ("conv: sum(softplus(conv2d(x, k, padding=1))), gradients for x and k "
                "(benchmarks/conv.grad)", workloads.conv_cases(32, 16, 32, 32, 3))
    if name == "pool":
        return ("pool: sum(softplus(max_pool2d(x, ...))), gradient for x (benchmarks/pool.grad)",
                workloads.pool_cases(32, 16, 32))
    if name == "norm":
        return ("batch norm: sum(softplus(gamma * (x - mean) / std + beta)) per channel over "
                "NCHW, gradients for x, gamma and beta (benchmarks/norm.grad)",
                workloads.norm_cases(32, 64, 32))
    if name == "broadcast":
        return ("broadcasts along middle axes: x * y + 1.0 (values), and a softmax under a "
                "padding and a causal mask (value + gradient; dsl's written by hand, and with "
                "std's softmax, whose grad block, as JAX's and PyTorch's softmax, sends no "
                "gradient through the max)", workloads.broadcast_cases())
    if name == "fused_sum":
        return ("sum(x * x), value only (one fused loop)", workloads.fused_sum_cases([10**7]))
    if name == "sincos_pow":
        return ("sin(x) cos(x), x ** y, tanh(x) and the exact gelu(x): value + gradient",
                workloads.sincos_pow_cases([10**6], [np.float32, np.float64]))
    if name == "call":
        return ("per call: log1pexp value + gradient at n = 16, and a loss's value and "
                "gradient for the module params it reads",
                workloads.log1pexp_cases([16], [np.float64])
                + workloads.params_call_cases(8, 4, 3))
    if name == "out":
        return ("log1pexp value + gradient in a loop: into reused buffers (out=) or fresh",
                workloads.out_cases([2 * 10**5, 10**7], [np.float64, np.float32]))
    if name == "loop":
        return ("loop: 1,000 steps of u = u + kappa * (u * (1 - u)), then sum(u * u); value + "
                "gradient w.r.t. u and kappa (jax: jit(value_and_grad) of lax.fori_loop; "
                "numpy: by hand, checkpoints every 31 steps); an RK4 fit of y' = (y1, -k y0 "
                "- c y1) to 300 observations read as obs[i], value + gradient w.r.t. y0, k, c "
                "(jax: jit(value_and_grad) of lax.scan; numpy: by hand, the adjoint); an RNN "
                "h = tanh(h @ w + xs[i]), value + gradient w.r.t. xs, h, w (jax: lax.scan; "
                "torch: a Python loop), its loops hot (compiled; of 512 too, its product "
                "weighed against a trip's steps: R.products_fit) and trip by trip; the same "
                "RNN reading emb[tokens[i]] from a table of 10,000 rows, value + gradient "
                "w.r.t. h, emb, w",
                # at 1e5 (the size) the dsl's residuals take 800 MB
                workloads.loop_cases(10**4 if quick else 10**5, 1000)
                + workloads.fit_cases(300) + workloads.rnn_cases(1000, [16, 64, 256])
                + workloads.rnn_cases(200, [512])
                + workloads.language_model_cases(1000, 10_000, [16, 64]))
    if name == "forward":
        return ("forward mode: dsl.jvp of log1pexp (tangent of ones) against value_and_grad; "
                "jvp(grad) against hvp (rev-over-rev); jacfwd",
                workloads.forward_cases([10**5, 10**7], jacobian_size=100))
    if name == "indexing":
        return ("indexing: runtime.cpu.take / scatter_add (bounds-checked) against np.take, "
                "np.add.at", workloads.indexing_cases(10_000, 64, 20_000, 10**6, 100))
    if name == "interop":
        # the issue asks for 2e7 rows (1.3 GB of x); --quick takes a tenth
        return ("interop: dsl.to_torch, dsl.to_jax against the dsl called directly; logistic "
                "loss on Dask arrays (threaded scheduler)",
                workloads.torch_bridge_cases([16, 10**6])
                + workloads.jax_bridge_cases([16, 10**6])
                + workloads.dask_cases(2 * 10**6 if quick else 2 * 10**7, 8))
    raise ValueError(name)


# rounds of a paired ratio (timing.paired_ratio) in a full run: the
# acceptance ratios it measures are within a few percent of 1, where 11
# rounds' medians of two noisy times swing by 10% and more
PAIRED_ROUNDS = 51


def timed_section(name: str, rounds: int, sample_s: float, quick: bool) -> str:
    title, cases = cases_for(name, quick)
    # NumPy, JAX and PyTorch always have columns; a workload's own
    # variants (dsl fresh, numpy out=) follow
    others = OTHERS + tuple(dict.fromkeys(
        n for case in cases for n in case.impls if n != "dsl" and n not in OTHERS))
    rows, notes = [], []
    for case in cases:
        workloads.check(case)
        t = timing.compare(case.impls, rounds, sample_s)
        rows.append([case.label]
                    + [timing.ms(t[o].median) if o in t else "-" for o in ("dsl",) + others]
                    + timing.ratio_cells(t, "dsl", others)
                    + [f"{timing.ms(t['dsl'].low)}..{timing.ms(t['dsl'].high)}"])
        print(f"  {case.label}: dsl {timing.ms(t['dsl'].median)} ms; "
              + ", ".join(f"{o} {timing.ms(t[o].median)}" for o in others if o in t),
              flush=True)
        notes += [f"- {case.label}: {note}" for note in case.notes]
        if case.paired:
            ours, other = case.paired
            paired = timing.paired_ratio(case.impls[ours], case.impls[other],
                                         PAIRED_ROUNDS * rounds // 11, sample_s)
            notes.append(f"- {case.label}: {ours} / {other}, paired: {paired}")
            print(f"  {ours} / {other}, paired: {paired}", flush=True)
    if not cases:
        return f"## {title}\n\nskipped: its libraries are not installed.\n"
    header = (["case"] + [f"{n} ms" for n in ("dsl",) + others]
              + [f"dsl/{o}" for o in others] + ["dsl min..max ms"])
    return "\n".join([f"## {title}", "", timing.markdown_table(header, rows), "", *notes, ""])


def startup_section(repeats: int) -> str:
    with_jax = workloads.jax_modules() is not None
    results = startup.measure(repeats, with_jax)
    columns = (["dsl cold", "dsl warm", "dsl warm after imports", "dsl aot import"]
               + (["jax jit"] if with_jax else []))
    rows = [[name] + [timing.ms(r[c]) if c in r else "-" for c in columns]
            for name, r in results.items()]
    header = ["function"] + [f"{c} ms" for c in columns]
    return (f"## Time to first gradient in a fresh process (median of {repeats})\n\n"
            "From before the import to after the first gradient.  cold: empty "
            "GRADC_CACHE_DIR and NUMBA_CACHE_DIR; warm: caches filled by an earlier "
            "process (after imports: less numpy, numba, lark and gradlang's imports); "
            "aot: `gradc compile --sig` then import (dense only); jax: "
            "`jax.jit` in a fresh process.\n\n"
            f"{timing.markdown_table(header, rows)}\n")


def script_section(title: str, script: Path, args: list[str]) -> str:
    result = subprocess.run([sys.executable, str(script), *args], cwd=HERE.parent,
                            capture_output=True, text=True, timeout=600)
    output = (result.stdout + result.stderr).strip()
    return f"## {title}\n\n```\n$ python benchmarks/{script.name}\n{output}\n```\n"


def call_script_section() -> str:
    script = HERE / "bench_call.py"
    if not script.exists():
        return ""
    return script_section("Per call (benchmarks/bench_call.py)", script, [])


def cuda_section() -> str:
    from numba import config, cuda
    if config.ENABLE_CUDASIM or not cuda.is_available():
        return "## CUDA (benchmarks/bench_cuda.py)\n\nskipped: no CUDA GPU on this machine.\n"
    return script_section("CUDA (benchmarks/bench_cuda.py)", HERE / "bench_cuda.py", [])


def default_output() -> Path:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return HERE / "results" / f"{date}-{socket.gethostname()}.md"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds (5 instead of 11) and one startup sample")
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--output", type=Path, default=None,
                        help="Markdown report (default benchmarks/results/<date>-<host>.md)")
    args = parser.parse_args(argv)
    rounds, sample_s, startup_repeats = (5, 0.01, 1) if args.quick else (11, 0.02, 3)

    started = time.perf_counter()
    load_start = timing.load_average()
    print(f"load average at start: {load_start}", flush=True)
    sections = []
    for name in args.only:
        print(f"{name} ...", flush=True)
        if name == "startup":
            sections.append(startup_section(startup_repeats))
        elif name == "cuda":
            sections.append(cuda_section())
        else:
            sections.append(timed_section(name, rounds, sample_s, args.quick))
            if name == "call":
                sections.append(call_script_section())
    load_end = timing.load_average()

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = "\n".join([
        f"# Benchmarks, {when}, {socket.gethostname()}",
        "",
        f"`python benchmarks/run.py{' --quick' if args.quick else ''}`: "
        f"{rounds} interleaved rounds per case (who goes first rotates), medians; "
        "ratio = dsl time / other time (below 1: the dsl is faster).  Every "
        "implementation's results were checked against NumPy's first.",
        "",
        *timing.machine_lines(),
        f"- load average (1 / 5 / 15 min): start {load_start}, end {load_end}",
        f"- total time: {time.perf_counter() - started:.0f} s",
        "",
        *[s for s in sections if s],
    ])
    print()
    print(report)
    output = args.output or default_output()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(report)
    print(f"written to {output}")


if __name__ == "__main__":
    main()
