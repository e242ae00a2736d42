"""os.fork() while other threads are inside the allocator (issue 37, item 1): the child never
inherits a lock of ours held, and on the simulated device it keeps working. ctypes releases the
GIL around each call, so the threads are inside the library while the main thread forks."""

from conftest import REPO, run_python

CODE = r"""
import os, threading, time, warnings
import torch_arena
from torch_arena import stats

warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the point of the test
stop = threading.Event()

def hammer(k):
    held = []
    i = 0
    while not stop.is_set():
        i += 1
        held.append(torch_arena.caching_allocator_alloc([512, 70_000, 3 << 20, 25 << 20][i % 4]))
        if len(held) > 6:
            torch_arena.caching_allocator_delete(held.pop(0))
        if i % 8 == k:
            stats.memory_stats()
            torch_arena.live_report()
    for p in held:
        torch_arena.caching_allocator_delete(p)

threads = [threading.Thread(target=hammer, args=(k,)) for k in range(3)]
for t in threads:
    t.start()
hung = failed = 0
for _ in range(25):
    inherited = torch_arena.caching_allocator_alloc(1 << 20)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            p = torch_arena.caching_allocator_alloc(5 << 20)
            torch_arena.caching_allocator_delete(p)
            torch_arena.caching_allocator_delete(inherited)
            stats.memory_stats()
            torch_arena.live_report()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            failed += os.waitstatus_to_exitcode(status) != 0
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hung += 1
            break
        time.sleep(0.001)
    torch_arena.caching_allocator_delete(inherited)
stop.set()
for t in threads:
    t.join()
print(f"hung={hung} failed={failed}")
"""


def test_children_forked_under_load_never_hang_and_keep_working():
    r = run_python(CODE, REPO)
    assert r.returncode == 0, r.stderr
    assert "hung=0 failed=0" in r.stdout, (r.stdout, r.stderr[-2000:])
