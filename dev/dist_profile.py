"""Where a multi-GPU training step's time goes: run by torchrun, one process per GPU.

    python -m torch.distributed.run --standalone --nproc-per-node 2 dev/dist_profile.py fsdp_train kernelforge

Builds the step of `kforge dist` (kernelforge/e2e_dist.py) for the case and provider, warms up, then on
rank 0 prints: the step's wall time, the GPU's busy time in it (the sum of kernel durations of one step
under torch.profiler; a step much longer than its kernels is bound by the host), the top kernels by
time, and every kernelforge warning (fallbacks) the step raised.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

from kernelforge.e2e_dist import _ce_step, _train_step


def main():
    case, provider = sys.argv[1], sys.argv[2]
    size = sys.argv[3] if len(sys.argv) > 3 else "full"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if case == "vp_ce":
            step, *_ = _ce_step(provider, size, device, torch.bfloat16, world, rank)
        else:
            step, *_ = _train_step(case, provider, size, device, torch.bfloat16, world)
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) / 3 * 1e3
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        step()
        torch.cuda.synchronize()
    if rank == 0:
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_ms = sum(e.self_device_time_total for e in events) / 1e3
        print(f"{case} {provider}: step {wall_ms:.1f} ms wall, GPU kernels {busy_ms:.1f} ms "
              f"({busy_ms / wall_ms:.0%} busy)")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:15]:
            print(f"  {e.self_device_time_total / 1e3:8.2f} ms  {e.count:5d}x  {e.key[:100]}")
        kf_warnings = sorted({str(w.message)[:200] for w in caught if "kernelforge" in str(w.message)})
        print(f"  kernelforge warnings: {len(kf_warnings)}")
        for w in kf_warnings:
            print(f"    {w}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
