"""Shared timing for the benchmarks: interleaved rounds, medians, ratios,
Markdown tables and a description of the machine.

`compare(impls, rounds)` times zero-argument callables against each other
in one process.  Every implementation is called once to warm it (page in
outputs, fill pools), then given a batch size so that one sample lasts
about `sample_s`; the rounds run every implementation once each, the one
that goes first rotating from round to round, so that a burst of load from
other processes falls on all of them alike.  The result per implementation
is the median, min and max time per call over the rounds.

`paired_ratio(ours, other, rounds)` measures one ratio more finely than
two medians can: each round times both back to back (the order
alternating) and the result is the median and quartiles of the rounds'
own ratios, so that load that comes and goes between rounds cancels out.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence


@dataclass(frozen=True)
class Timing:
    median: float
    low: float
    high: float
    calls_per_sample: int


def per_call(fn: Callable[[], object], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def calls_per_sample(fn: Callable[[], object], sample_s: float) -> int:
    """Calls in a batch that lasts about sample_s (at least one)."""
    t = per_call(fn, 1)
    if t < sample_s / 4:
        t = per_call(fn, max(1, int(sample_s / 4 / max(t, 1e-9))))
    return max(1, int(sample_s / max(t, 1e-9)))


def compare(impls: dict[str, Callable[[], object]], rounds: int,
            sample_s: float = 0.02) -> dict[str, Timing]:
    """Median time per call of each implementation over interleaved rounds."""
    for fn in impls.values():
        fn()
    numbers = {name: calls_per_sample(fn, sample_s) for name, fn in impls.items()}
    samples: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for r in range(rounds):
        first = r % len(names)
        for name in names[first:] + names[:first]:
            samples[name].append(per_call(impls[name], numbers[name]))
    return {name: Timing(statistics.median(s), min(s), max(s), numbers[name])
            for name, s in samples.items()}


@dataclass(frozen=True)
class PairedRatio:
    median: float
    lower_quartile: float
    upper_quartile: float
    rounds: int

    def __str__(self) -> str:
        return (f"{self.median:.3f}x (quartiles {self.lower_quartile:.3f}x.."
                f"{self.upper_quartile:.3f}x over {self.rounds} paired rounds)")


def paired_ratio(ours: Callable[[], object], other: Callable[[], object],
                 rounds: int, sample_s: float = 0.02) -> PairedRatio:
    """Median and quartiles of ours' time / other's, each round timing a
    batch of each back to back, who goes first alternating."""
    ours(), other()
    numbers = {fn: calls_per_sample(fn, sample_s) for fn in (ours, other)}
    ratios = []
    for r in range(rounds):
        order = (ours, other) if r % 2 == 0 else (other, ours)
        took = {fn: per_call(fn, numbers[fn]) for fn in order}
        ratios.append(took[ours] / took[other])
    lower, median, upper = statistics.quantiles(ratios, n=4)
    return PairedRatio(median, lower, upper, rounds)


def ratio_cells(timings: dict[str, Timing], ours: str, others: Iterable[str]) -> list[str]:
    """`ours` time / each other's time ("0.50x": ours takes half as long)."""
    return [f"{timings[ours].median / timings[o].median:.2f}x" if o in timings else "-"
            for o in others]


def ms(seconds: float) -> str:
    if seconds >= 0.1:
        return f"{seconds * 1e3:.0f}"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f}"
    return f"{seconds * 1e3:.4f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " / ".join(f"{a:.2f}" for a in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def versions() -> dict[str, str]:
    """Versions of the libraries compared ("not installed" where absent)."""
    found = {"python": sys.version.split()[0]}
    for name in ("numpy", "numba", "jax", "jaxlib", "torch"):
        try:
            module = __import__(name)
            found[name] = getattr(module, "__version__", "?")
        except ImportError:
            found[name] = "not installed"
    return found


def machine_lines() -> list[str]:
    import numba
    return [f"- CPU: {cpu_model()}",
            f"- cores: {os.cpu_count()} online, {usable_cores()} usable; "
            f"numba threads {numba.get_num_threads()}",
            f"- platform: {platform.platform()}",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in versions().items())]
