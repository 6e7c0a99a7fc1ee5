"""The timing core of `kforge bench`: median device time with L2 flushed before every run, CUDA-graph
replay, wall clock around eager calls, and the device-to-device copy that sets the speed of light.

Every measurement of the bench goes through one Timer, so the ops, the peers and copy@size (a copy of
the same bytes) are timed the same way: before each run the L2 is flushed by zero-filling a buffer of
twice its size, the GPU is held by a ~0.5 ms sleep kernel so the host is ahead when the timed work
starts, and the median of the runs is reported.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Budget:
    """How long each measurement runs: warm-up and timed milliseconds, repetition bounds."""

    warm_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 10
    max_reps: int = 1000
    graph_calls: int = 100
    graph_replays: int = 20
    call_loop: int = 1000
    call_repeats: int = 5


QUICK = Budget(warm_ms=2.0, rep_ms=5.0, min_reps=3, max_reps=20, graph_calls=20, graph_replays=3,
               call_loop=100, call_repeats=2)
# --sweep: hundreds of cases in a few minutes; the same method with fewer timed runs (at least 10).
SWEEP = Budget(warm_ms=10.0, rep_ms=40.0)


HEAD_START_CYCLES = 1_000_000  # GPU clock cycles of torch.cuda._sleep before each timed run
HEAD_START_MS = 0.5            # about that (H100 ~1.75-1.98 GHz), for the repetition budget


class Timer:
    """Median device time of fn, L2 flushed before every run (CUDA events), or wall clock on CPU."""

    def __init__(self, device: torch.device, budget: Budget):
        self.device = device
        self.cuda = device.type == "cuda"
        self.budget = budget
        self.flush_buf = None
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
            self.flush_buf = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _estimate_ms(self, fn, pre) -> float:
        self.sync()
        t0 = time.perf_counter()
        n = 0
        while True:
            pre()
            fn()
            n += 1
            self.sync()
            el = (time.perf_counter() - t0) * 1e3
            if el > 2.0 or n >= 3:
                return el / n

    def median_ms(self, fn: Callable, pre: Callable = lambda: None, flush: bool = True) -> float:
        b = self.budget
        est = max(self._estimate_ms(fn, pre), 1e-3)
        n_warm = int(min(max(b.warm_ms / est, 1), 200))
        n_rep = int(min(max(b.rep_ms / (est + (HEAD_START_MS if self.cuda else 0.0)), b.min_reps), b.max_reps))
        for _ in range(n_warm):
            pre()
            fn()
        if not self.cuda:
            times = []
            for _ in range(n_rep):
                pre()
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            pre()
            if flush:
                self.flush_buf.zero_()
            # A GPU-side wait before the start event, so that the host is ahead of the GPU when the
            # timed work begins: the interval then holds GPU time only (the host time of a call is
            # what fwd_call measures). Without it, short steps whose host path outlasts the flush
            # (forward + autograd backward: ~150 µs) measured host gaps, up to 30 % between runs.
            torch.cuda._sleep(HEAD_START_CYCLES)
            starts[i].record()
            fn()
            ends[i].record()
        self.sync()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))

    def graph_ms(self, fn: Callable) -> float:
        """Capture graph_calls calls in one CUDA graph; median replay time / calls."""
        if not self.cuda:
            raise RuntimeError("CUDA graphs need a CUDA device")
        b = self.budget
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(b.graph_calls):
                fn()
        graph.replay()
        self.sync()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(b.graph_replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(b.graph_replays)]
        for s, e in zip(starts, ends):
            s.record()
            graph.replay()
            e.record()
        self.sync()
        ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / b.graph_calls
        del graph
        return ms

    def call_ms(self, fn: Callable) -> float:
        """Eager per-call time with the host path: wall clock around a loop of calls, one sync."""
        b = self.budget
        for _ in range(10):
            fn()
        self.sync()
        times = []
        for _ in range(b.call_repeats):
            t0 = time.perf_counter()
            for _ in range(b.call_loop):
                fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3 / b.call_loop)
        return statistics.median(times)


def measure_copy_at(nbytes: int, timer: "Timer") -> float:
    """GB/s of dst.copy_(src) moving `nbytes` (half read, half written), timed by `timer` like the
    ops (L2 flushed, GPU head start, median): the speed of light at that size, fixed costs included
    (launch, ramp-up, and the write-back of the dirty lines the zero-fill flush leaves in L2)."""
    src = torch.randint(0, 256, (nbytes // 2,), dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * (nbytes // 2) / (ms * 1e-3) / 1e9


def measure_copy_gbps(device: torch.device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy of a 1 GiB buffer, bytes read + written over the median time."""
    if device.type != "cuda":
        return float("nan")
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        dst.copy_(src)
        e.record()
    torch.cuda.synchronize(device)
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9
