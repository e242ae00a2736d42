#!/usr/bin/env python3
"""What each memory driver call costs on this machine's GPU: the figures behind the lab's driver
cost model (src/device/costs.rs), measured instead of taken from the A100 column of
reference/vmm-costs.md.

    python3 bench/driver_costs.py [--out DIR] [--quick]

Calls libcuda directly through ctypes (``TORCH_ARENA_LIBCUDA`` names another library, e.g. the
fake driver, to try the script without a GPU), so every figure is one driver call plus the
ctypes call overhead, which is measured too (``cuDriverGetVersion``) and reported beside them.

What it measures, on an idle GPU unless said otherwise:

- the VMM calls one by one at handle sizes 2, 20 and 200 MiB: cuMemCreate, cuMemMap,
  cuMemSetAccess, cuMemUnmap, cuMemRelease, each per handle;
- a contiguous run of 1 to 32 handles granted with one cuMemSetAccess and unmapped with one
  cuMemUnmap (what the arena's map_run does), against one call per handle;
- one handle mapped as 1 to 32 pieces (cuMemMap at an offset) and granted with one
  cuMemSetAccess: whether a grant costs per handle or per mapping it covers;
- one handle mapped at two addresses at once (the arena's lending): allowed, its cost, and that
  both addresses show the same bytes;
- cuMemAddressReserve / cuMemAddressFree of 8 GiB;
- cuMemAlloc / cuMemFree (cudaMalloc / cudaFree) at 2 MiB, 20 MiB, 200 MiB and 1 GiB;
- the event and synchronisation calls the arena makes, and cuMemGetInfo;
- with torch present: which calls wait for work queued on the GPU (a sleep kernel of ~100 ms on
  the default stream), on memory the kernel does not touch.

Writes ``driver-costs.json`` (every sample's statistics) and ``driver-costs.txt`` (a costs file
for ``--driver-costs``: per-call averages at 2 MiB, and per-GiB terms for the calls that take
longer with size) into
``--out`` (default: the current folder), and prints a table.
"""

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
# Runs of 2 MiB handles granted and unmapped with one call each: does the cost follow the calls
# or the handles?
RUNS = (1, 2, 4, 10, 32)

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CUDA_ERROR_NOT_READY = 600


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


class DriverError(RuntimeError):
    pass


class Driver:
    """The few libcuda entry points the measurements need, each checked."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.path = path
        u64, sz, p = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
        sig = {
            "cuInit": [ctypes.c_uint],
            "cuDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuDeviceGetName": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(p), ctypes.c_int],
            "cuCtxSetCurrent": [p],
            "cuCtxSynchronize": [],
            "cuMemGetAllocationGranularity": [
                ctypes.POINTER(sz),
                ctypes.POINTER(AllocationProp),
                ctypes.c_int,
            ],
            "cuMemAddressReserve": [ctypes.POINTER(u64), sz, sz, u64, u64],
            "cuMemAddressFree": [u64, sz],
            "cuMemCreate": [ctypes.POINTER(u64), sz, ctypes.POINTER(AllocationProp), u64],
            "cuMemRelease": [u64],
            "cuMemMap": [u64, sz, sz, u64, u64],
            "cuMemSetAccess": [u64, sz, ctypes.POINTER(AccessDesc), sz],
            "cuMemUnmap": [u64, sz],
            "cuMemAlloc_v2": [ctypes.POINTER(u64), sz],
            "cuMemFree_v2": [u64],
            "cuMemGetInfo_v2": [ctypes.POINTER(sz), ctypes.POINTER(sz)],
            "cuEventCreate": [ctypes.POINTER(p), ctypes.c_uint],
            "cuEventDestroy_v2": [p],
            "cuEventRecord": [p, p],
            "cuEventQuery": [p],
            "cuEventSynchronize": [p],
            "cuStreamSynchronize": [p],
        }
        for name, args in sig.items():
            fn = getattr(self.lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
            setattr(self, name, fn)
        # Optional (a fake driver may lack them): to check that two mappings show the same bytes.
        optional = {
            "cuMemsetD8_v2": [u64, ctypes.c_ubyte, sz],
            "cuMemcpyDtoH_v2": [p, u64, sz],
        }
        for name, args in optional.items():
            fn = getattr(self.lib, name, None)
            if fn is not None:
                fn.argtypes = args
                fn.restype = ctypes.c_int
            setattr(self, name, fn)

    def check(self, name: str, rc: int) -> None:
        if rc != 0:
            raise DriverError(f"{name} failed with CUresult {rc}")


def timed(drv: Driver, name: str, fn: Callable[..., int], *args: Any, ok: tuple = (0,)) -> float:
    """The wall time of ``fn(*args)`` in µs; raises when the call fails."""
    t0 = time.perf_counter_ns()
    rc = fn(*args)
    t1 = time.perf_counter_ns()
    if rc not in ok:
        drv.check(name, rc)
    return (t1 - t0) / 1000.0


def summarise(samples: list[float]) -> dict[str, Any]:
    s = sorted(samples)
    n = len(s)
    return {
        "n": n,
        "mean_us": round(statistics.fmean(s), 2),
        "p50_us": round(s[n // 2], 2),
        "p99_us": round(s[min(n - 1, (n * 99) // 100)], 2),
        "min_us": round(s[0], 2),
        "max_us": round(s[-1], 2),
    }


class Bench:
    def __init__(self, drv: Driver, device: int, quick: bool) -> None:
        self.drv = drv
        self.device = device
        self.quick = quick
        self.results: dict[str, Any] = {}
        self.prop = AllocationProp()
        self.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = device
        self.access = AccessDesc()
        self.access.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        self.access.location.id = device
        self.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE

    def record(self, key: str, samples: list[float], **extra: Any) -> None:
        entry = summarise(samples)
        entry.update(extra)
        self.results[key] = entry
        print(
            f"  {key:<44} n={entry['n']:>4}  mean {entry['mean_us']:>9.2f} µs"
            f"  p50 {entry['p50_us']:>9.2f}  p99 {entry['p99_us']:>9.2f}"
            f"  max {entry['max_us']:>9.2f}",
            flush=True,
        )

    def reps(self, n: int) -> int:
        return max(2, n // 8) if self.quick else n

    # -- pieces ----------------------------------------------------------------------------

    def reserve(self, size: int) -> int:
        va = ctypes.c_uint64()
        self.drv.check(
            "cuMemAddressReserve", self.drv.cuMemAddressReserve(ctypes.byref(va), size, 0, 0, 0)
        )
        return va.value

    def grant(self, at: int, size: int) -> int:
        """cuMemSetAccess: read/write for this device over ``size`` bytes at ``at``."""
        return self.drv.cuMemSetAccess(at, size, ctypes.byref(self.access), 1)

    def create(self, size: int) -> tuple[int, float]:
        h = ctypes.c_uint64()
        drv = self.drv
        us = timed(
            drv, "cuMemCreate", drv.cuMemCreate, ctypes.byref(h), size, ctypes.byref(self.prop), 0
        )
        return h.value, us

    # -- measurements ----------------------------------------------------------------------

    def overhead(self) -> None:
        v = ctypes.c_int()
        samples = [
            timed(self.drv, "cuDriverGetVersion", self.drv.cuDriverGetVersion, ctypes.byref(v))
            for _ in range(self.reps(2000))
        ]
        self.record("ctypes overhead (cuDriverGetVersion)", samples)

    def vmm_per_handle(self, size: int, n: int) -> None:
        """n handles of `size`: create, map, grant, unmap, release, one call per handle."""
        drv = self.drv
        n = self.reps(n)
        base = self.reserve(size * n)
        handles, t = [], {k: [] for k in ("create", "map", "set_access", "unmap", "release")}
        try:
            for _ in range(n):
                h, us = self.create(size)
                handles.append(h)
                t["create"].append(us)
            for i, h in enumerate(handles):
                at = base + i * size
                t["map"].append(timed(drv, "cuMemMap", drv.cuMemMap, at, size, 0, h, 0))
            for i in range(n):
                at = base + i * size
                t["set_access"].append(timed(drv, "cuMemSetAccess", self.grant, at, size))
            for i in range(n):
                at = base + i * size
                t["unmap"].append(timed(drv, "cuMemUnmap", drv.cuMemUnmap, at, size))
            for h in handles:
                t["release"].append(timed(drv, "cuMemRelease", drv.cuMemRelease, h))
            handles = []
        finally:
            for h in handles:
                drv.cuMemRelease(h)
            drv.cuMemAddressFree(base, size * n)
        mib = size // MiB
        for call, name in (
            ("create", "cuMemCreate"),
            ("map", "cuMemMap"),
            ("set_access", "cuMemSetAccess"),
            ("unmap", "cuMemUnmap"),
            ("release", "cuMemRelease"),
        ):
            self.record(f"{name} {mib} MiB", t[call], size=size)

    def vmm_run(self, size: int, n: int) -> None:
        """n handles of `size` mapped back to back, granted with one cuMemSetAccess and
        unmapped with one cuMemUnmap over the whole run (the arena's map_run)."""
        drv = self.drv
        base = self.reserve(size * n)
        grant, unmap = [], []
        handles = [self.create(size)[0] for _ in range(n)]
        try:
            for _ in range(self.reps(16)):
                for i, h in enumerate(handles):
                    drv.check("cuMemMap", drv.cuMemMap(base + i * size, size, 0, h, 0))
                grant.append(timed(drv, "cuMemSetAccess", self.grant, base, size * n))
                unmap.append(timed(drv, "cuMemUnmap", drv.cuMemUnmap, base, size * n))
        finally:
            for h in handles:
                drv.cuMemRelease(h)
            drv.cuMemAddressFree(base, size * n)
        mib = size // MiB
        self.record(f"cuMemSetAccess run of {n} x {mib} MiB", grant, size=size, handles=n)
        self.record(f"cuMemUnmap run of {n} x {mib} MiB", unmap, size=size, handles=n)

    def vmm_pieces(self, size: int, n: int) -> None:
        """One handle of n x `size` mapped as n pieces (cuMemMap at an offset into it) back to
        back, granted with one cuMemSetAccess over them: whether a grant costs per handle it
        covers or per mapping (the fit issue's pieces of handles; `vmm_run` cannot tell, since
        each of its handles is one mapping)."""
        drv = self.drv
        base = self.reserve(size * n)
        grant, unmap = [], []
        h = self.create(size * n)[0]
        try:
            for _ in range(self.reps(16)):
                for i in range(n):
                    drv.check("cuMemMap", drv.cuMemMap(base + i * size, size, i * size, h, 0))
                grant.append(timed(drv, "cuMemSetAccess", self.grant, base, size * n))
                unmap.append(timed(drv, "cuMemUnmap", drv.cuMemUnmap, base, size * n))
        finally:
            drv.cuMemRelease(h)
            drv.cuMemAddressFree(base, size * n)
        mib = size // MiB
        self.record(
            f"cuMemSetAccess {n} pieces x {mib} MiB of one handle", grant, size=size, pieces=n
        )
        self.record(f"cuMemUnmap {n} pieces x {mib} MiB of one handle", unmap, size=size, pieces=n)

    def vmm_alias(self, size: int) -> None:
        """One handle mapped at two addresses at once (the arena lends idle pages at the limit
        so): whether the driver allows it, what the second map and its grant cost, and, where the
        driver has cuMemsetD8 and cuMemcpyDtoH, that bytes set through one address read back
        through the other."""
        drv = self.drv
        base = self.reserve(2 * size)
        h = self.create(size)[0]
        second, grant = [], []
        same = None
        try:
            drv.check("cuMemMap", drv.cuMemMap(base, size, 0, h, 0))
            drv.check("cuMemSetAccess", self.grant(base, size))
            for _ in range(self.reps(16)):
                second.append(timed(drv, "cuMemMap", drv.cuMemMap, base + size, size, 0, h, 0))
                grant.append(timed(drv, "cuMemSetAccess", self.grant, base + size, size))
                if same is None and drv.cuMemsetD8_v2 and drv.cuMemcpyDtoH_v2:
                    drv.check("cuMemsetD8", drv.cuMemsetD8_v2(base, 0x5A, size))
                    buf = ctypes.create_string_buffer(4096)
                    drv.check("cuMemcpyDtoH", drv.cuMemcpyDtoH_v2(buf, base + size, 4096))
                    same = buf.raw == b"\x5a" * 4096
                drv.check("cuMemUnmap", drv.cuMemUnmap(base + size, size))
            drv.check("cuMemUnmap", drv.cuMemUnmap(base, size))
        finally:
            drv.cuMemRelease(h)
            drv.cuMemAddressFree(base, 2 * size)
        mib = size // MiB
        self.record(f"cuMemMap {mib} MiB, mapped elsewhere already", second, size=size)
        self.record(
            f"cuMemSetAccess {mib} MiB, mapped elsewhere already", grant, size=size, same=same
        )

    def address(self) -> None:
        drv = self.drv
        res, free = [], []
        for _ in range(self.reps(64)):
            va = ctypes.c_uint64()
            res.append(
                timed(
                    drv,
                    "cuMemAddressReserve",
                    drv.cuMemAddressReserve,
                    ctypes.byref(va),
                    8 * GiB,
                    0,
                    0,
                    0,
                )
            )
            free.append(timed(drv, "cuMemAddressFree", drv.cuMemAddressFree, va.value, 8 * GiB))
        self.record("cuMemAddressReserve 8 GiB", res)
        self.record("cuMemAddressFree 8 GiB", free)

    def plain(self, size: int, n: int) -> None:
        drv = self.drv
        n = self.reps(n)
        ptrs, alloc, free = [], [], []
        try:
            for _ in range(n):
                p = ctypes.c_uint64()
                alloc.append(timed(drv, "cuMemAlloc", drv.cuMemAlloc_v2, ctypes.byref(p), size))
                ptrs.append(p.value)
            while ptrs:
                free.append(timed(drv, "cuMemFree", drv.cuMemFree_v2, ptrs[-1]))
                ptrs.pop()
        finally:
            for p in ptrs:
                drv.cuMemFree_v2(p)
        label = f"{size // GiB} GiB" if size >= GiB else f"{size // MiB} MiB"
        self.record(f"cuMemAlloc {label}", alloc, size=size)
        self.record(f"cuMemFree {label}", free, size=size)

    def events(self) -> None:
        drv = self.drv
        n = self.reps(1000)
        ev = ctypes.c_void_p()
        create, record, query, sync, destroy, ssync, csync, info = ([] for _ in range(8))
        f, t = ctypes.c_size_t(), ctypes.c_size_t()
        for _ in range(n):
            create.append(timed(drv, "cuEventCreate", drv.cuEventCreate, ctypes.byref(ev), 0))
            record.append(timed(drv, "cuEventRecord", drv.cuEventRecord, ev, None))
            sync.append(timed(drv, "cuEventSynchronize", drv.cuEventSynchronize, ev))
            query.append(
                timed(drv, "cuEventQuery", drv.cuEventQuery, ev, ok=(0, CUDA_ERROR_NOT_READY))
            )
            destroy.append(timed(drv, "cuEventDestroy", drv.cuEventDestroy_v2, ev))
            ssync.append(timed(drv, "cuStreamSynchronize", drv.cuStreamSynchronize, None))
            csync.append(timed(drv, "cuCtxSynchronize", drv.cuCtxSynchronize))
            info.append(
                timed(drv, "cuMemGetInfo", drv.cuMemGetInfo_v2, ctypes.byref(f), ctypes.byref(t))
            )
        for key, samples in (
            ("cuEventCreate", create),
            ("cuEventRecord", record),
            ("cuEventQuery", query),
            ("cuEventSynchronize (idle)", sync),
            ("cuEventDestroy", destroy),
            ("cuStreamSynchronize (idle)", ssync),
            ("cuCtxSynchronize (idle)", csync),
            ("cuMemGetInfo", info),
        ):
            self.record(key, samples)

    def under_load(self) -> None:
        """Which calls wait for a kernel that is still running (on memory it does not touch)."""
        try:
            import torch
        except ImportError:
            print("  (torch not importable: the calls under GPU load are not measured)")
            return
        if not torch.cuda.is_available():
            print("  (torch sees no GPU: the calls under GPU load are not measured)")
            return
        drv = self.drv
        # Calibrate the sleep kernel: cycles per µs, from a short run.
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        torch.cuda._sleep(10_000_000)
        torch.cuda.synchronize()
        per_us = 10_000_000 / max(1.0, (time.perf_counter_ns() - t0) / 1000.0)
        cycles = int(per_us * 100_000)  # ~100 ms
        size = 2 * MiB
        out: dict[str, Any] = {"kernel_cycles": cycles}

        # How long the kernel runs when nobody waits for it.
        t0 = time.perf_counter_ns()
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        kernel_us = (time.perf_counter_ns() - t0) / 1000.0
        out["kernel_us"] = round(kernel_us, 1)
        print(f"  sleep kernel alone: {kernel_us:.0f} µs", flush=True)

        def case(
            name: str,
            setup: Callable[[], Any],
            call: Callable[[Any], int],
            teardown: Callable[[Any], None],
        ) -> None:
            samples = []
            for _ in range(3):
                state = setup()
                torch.cuda.synchronize()
                torch.cuda._sleep(cycles)
                t = timed(drv, name, call, state)
                torch.cuda.synchronize()
                teardown(state)
                samples.append(t)
            waited = statistics.fmean(samples) > 0.5 * kernel_us
            out[name] = {"us": [round(s, 1) for s in samples], "waits_for_gpu": waited}
            print(
                f"  {name:<28} under a running kernel: {', '.join(f'{s:.0f}' for s in samples)} µs"
                f" -> {'WAITS for the GPU' if waited else 'does not wait'}",
                flush=True,
            )

        def mapped() -> tuple[int, int]:
            base = self.reserve(size)
            h, _ = self.create(size)
            drv.check("cuMemMap", drv.cuMemMap(base, size, 0, h, 0))
            drv.check("cuMemSetAccess", self.grant(base, size))
            return base, h

        def unmapped(state: tuple[int, int]) -> None:
            base, h = state
            drv.cuMemUnmap(base, size)
            drv.cuMemRelease(h)
            drv.cuMemAddressFree(base, size)

        def unmap_then(state: tuple[int, int]) -> int:
            return drv.cuMemUnmap(state[0], size)

        def after_unmap(state: tuple[int, int]) -> None:
            drv.cuMemRelease(state[1])
            drv.cuMemAddressFree(state[0], size)

        case("cuMemUnmap", mapped, unmap_then, after_unmap)

        def unmapped_handle() -> tuple[int, int]:
            base, h = mapped()
            drv.check("cuMemUnmap", drv.cuMemUnmap(base, size))
            return base, h

        case(
            "cuMemRelease",
            unmapped_handle,
            lambda s: drv.cuMemRelease(s[1]),
            lambda s: drv.cuMemAddressFree(s[0], size),
        )

        def map_grant(state: tuple[int, int]) -> int:
            base, h = state
            rc = drv.cuMemMap(base, size, 0, h, 0)
            return rc or self.grant(base, size)

        def fresh() -> tuple[int, int]:
            return self.reserve(size), self.create(size)[0]

        case("cuMemMap + cuMemSetAccess", fresh, map_grant, unmapped)

        handles: list[int] = []

        def create_one(_: Any) -> int:
            h = ctypes.c_uint64()
            rc = drv.cuMemCreate(ctypes.byref(h), size, ctypes.byref(self.prop), 0)
            handles.append(h.value)
            return rc

        case("cuMemCreate", lambda: None, create_one, lambda _: drv.cuMemRelease(handles.pop()))

        ptrs: list[int] = []

        def alloc_one(_: Any) -> int:
            p = ctypes.c_uint64()
            rc = drv.cuMemAlloc_v2(ctypes.byref(p), size)
            ptrs.append(p.value)
            return rc

        case("cuMemAlloc", lambda: None, alloc_one, lambda _: drv.cuMemFree_v2(ptrs.pop()))

        def plain_ptr() -> int:
            p = ctypes.c_uint64()
            drv.check("cuMemAlloc", drv.cuMemAlloc_v2(ctypes.byref(p), size))
            return p.value

        case("cuMemFree", plain_ptr, lambda p: drv.cuMemFree_v2(p), lambda _: None)
        self.results["under_load"] = out


def costs_file(results: dict[str, Any], gpu: str, driver: int) -> str:
    """A --driver-costs file from the 2 MiB per-call means (the arena's page size)."""

    def mean(key: str) -> float | None:
        entry = results.get(key)
        return entry["mean_us"] if entry else None

    rows = [
        ("cuMemAddressReserve", "cuMemAddressReserve 8 GiB"),
        ("cuMemAddressFree", "cuMemAddressFree 8 GiB"),
        ("cuMemCreate", "cuMemCreate 2 MiB"),
        ("cuMemRelease", "cuMemRelease 2 MiB"),
        ("cuMemMap", "cuMemMap 2 MiB"),
        ("cuMemUnmap", "cuMemUnmap 2 MiB"),
        ("cuMemSetAccess", "cuMemSetAccess 2 MiB"),
        ("cuMemAlloc", "cuMemAlloc 2 MiB"),
        ("cuMemFree", "cuMemFree 2 MiB"),
        ("cuEventCreate", "cuEventCreate"),
        ("cuEventDestroy", "cuEventDestroy"),
        ("cuEventRecord", "cuEventRecord"),
        ("cuEventQuery", "cuEventQuery"),
        ("cuEventSynchronize", "cuEventSynchronize (idle)"),
        ("cuStreamSynchronize", "cuStreamSynchronize (idle)"),
        ("cuCtxSynchronize", "cuCtxSynchronize (idle)"),
        ("cuMemGetInfo", "cuMemGetInfo"),
    ]
    lines = [
        f"# Driver call latencies measured by bench/driver_costs.py on {gpu}, driver {driver},",
        f"# {time.strftime('%Y-%m-%d')}: mean µs per call, 2 MiB handles, idle GPU, one thread.",
        "# Use with: torch-arena replay ... --driver-costs FILE",
    ]
    # Calls that take longer with size: the slope between 2 MiB and the largest size measured.
    slopes = {
        "cuMemCreate": ("cuMemCreate 2 MiB", "cuMemCreate 200 MiB", 200 * MiB),
        "cuMemRelease": ("cuMemRelease 2 MiB", "cuMemRelease 200 MiB", 200 * MiB),
        "cuMemAlloc": ("cuMemAlloc 2 MiB", "cuMemAlloc 1 GiB", GiB),
        "cuMemFree": ("cuMemFree 2 MiB", "cuMemFree 1 GiB", GiB),
    }
    for name, key in rows:
        value = mean(key)
        if value is not None:
            lines.append(f"{name} = {value}")
        small, big, size = slopes.get(name, (None, None, 0))
        if small and mean(small) is not None and mean(big) is not None:
            per_gib = (mean(big) - mean(small)) / ((size - 2 * MiB) / GiB)
            lines.append(f"{name} per GiB = {round(max(per_gib, 0.0), 1)}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", default=".", help="folder for driver-costs.json and driver-costs.txt"
    )
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="an eighth of the repetitions")
    args = parser.parse_args()

    path = os.environ.get("TORCH_ARENA_LIBCUDA", "libcuda.so.1")
    try:
        drv = Driver(path)
    except OSError as exc:
        print(f"driver_costs: cannot load the CUDA driver {path!r}: {exc}", file=sys.stderr)
        return 2
    # torch first (when present), so its context is the primary context we retain too.
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()
    except ImportError:
        pass
    drv.check("cuInit", drv.cuInit(0))
    dev, ctx, version = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
    drv.check("cuDeviceGet", drv.cuDeviceGet(ctypes.byref(dev), args.device))
    drv.check(
        "cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)
    )
    drv.check("cuCtxSetCurrent", drv.cuCtxSetCurrent(ctx))
    drv.check("cuDriverGetVersion", drv.cuDriverGetVersion(ctypes.byref(version)))
    name = ctypes.create_string_buffer(256)
    drv.check("cuDeviceGetName", drv.cuDeviceGetName(name, 256, dev.value))
    gpu = name.value.decode()

    bench = Bench(drv, dev.value, args.quick)
    gran = ctypes.c_size_t()
    drv.check(
        "cuMemGetAllocationGranularity",
        drv.cuMemGetAllocationGranularity(
            ctypes.byref(gran), ctypes.byref(bench.prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM
        ),
    )
    print(
        f"driver_costs: {gpu}, driver {version.value}, granularity {gran.value // 1024} KiB,"
        f" library {path}"
    )
    started = time.time()
    steps: list[tuple[str, Callable[[], None]]] = [
        ("ctypes overhead", bench.overhead),
        ("VMM per handle, 2 MiB", lambda: bench.vmm_per_handle(2 * MiB, 256)),
        ("VMM per handle, 20 MiB", lambda: bench.vmm_per_handle(20 * MiB, 64)),
        ("VMM per handle, 200 MiB", lambda: bench.vmm_per_handle(200 * MiB, 8)),
        ("one grant and one unmap per run", lambda: [bench.vmm_run(2 * MiB, n) for n in RUNS]),
        ("one grant and one unmap per run, 20 MiB handles", lambda: bench.vmm_run(20 * MiB, 10)),
        (
            "one grant over pieces of one handle",
            lambda: [bench.vmm_pieces(2 * MiB, n) for n in RUNS],
        ),
        ("one handle at two addresses", lambda: bench.vmm_alias(2 * MiB)),
        ("address reservations", bench.address),
        ("cuMemAlloc/cuMemFree 2 MiB", lambda: bench.plain(2 * MiB, 128)),
        ("cuMemAlloc/cuMemFree 20 MiB", lambda: bench.plain(20 * MiB, 64)),
        ("cuMemAlloc/cuMemFree 200 MiB", lambda: bench.plain(200 * MiB, 8)),
        ("cuMemAlloc/cuMemFree 1 GiB", lambda: bench.plain(GiB, 4)),
        ("events and synchronisation", bench.events),
        ("calls under a running kernel", bench.under_load),
    ]
    failures = {}
    for i, (label, step) in enumerate(steps, 1):
        print(f"[{i}/{len(steps)}] {label}", flush=True)
        try:
            step()
        except Exception as exc:  # one failed measurement must not lose the others
            failures[label] = f"{type(exc).__name__}: {exc}"
            print(f"  FAILED: {failures[label]}", flush=True)
    report = {
        "gpu": gpu,
        "driver": version.value,
        "granularity": gran.value,
        "library": path,
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.time() - started, 1),
        "quick": args.quick,
        "results": bench.results,
        "failures": failures,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "driver-costs.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "driver-costs.txt"), "w") as f:
        f.write(costs_file(bench.results, gpu, version.value))
    print(
        f"driver_costs: {len(bench.results)} figures, {len(failures)} failed,"
        f" in {report['seconds']} s;"
        f" written to {args.out}/driver-costs.json and driver-costs.txt"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
