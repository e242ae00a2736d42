"""The torch integration (torch_arena._torch, torch_arena._autostart) against the real torch from
PyPI, on a machine without a GPU.

Without a GPU, torch still imports, CUDAPluggableAllocator and change_current_allocator succeed,
and only CUDA tensors fail. So these tests check the wiring: TORCH_ARENA=1 installs the allocator
as `import torch` runs (through the installed .pth), every hook is set, torch.cuda's statistics
functions answer from the arena (on the simulated device, via torch_arena.caching_allocator_alloc,
since torch's own would need CUDA), errors leave torch untouched. A swap is once per process, so
each test runs in a fresh interpreter. Tests marked `gpu` need CUDA; tests/gpu/ has the real
suite.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

SIM = "device:sim,sim_capacity_mb:4096"
MiB = 1 << 20
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Variables of the caller's environment that would change what the child does.
_SCRUB = (
    "TORCH_ARENA",
    "TORCH_ARENA_CONF",
    "PYTHONPATH",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
)


def run(*parts: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    """Run the code ``parts`` (each dedented, then joined) in a fresh interpreter of this
    environment (site-packages, so the autostart .pth, included) with ``env`` added to a
    scrubbed environment."""
    full = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    full.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join(textwrap.dedent(part) for part in parts)],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"child failed ({proc.returncode}):\n--- stdout\n{proc.stdout}\n--- stderr\n"
            f"{proc.stderr}"
        )
    return proc


def result(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object the child printed on its last stdout line starting with RESULT."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT ") :])


# Printed by every child: whether torch-arena is PyTorch's allocator.
STATE = """
import json, sys
def state(**extra):
    import torch, torch_arena, torch_arena._torch
    cur = torch.cuda.memory._get_current_allocator().allocator()
    ours = torch_arena._torch._global.allocator
    out = dict(
        backend=torch.cuda.get_allocator_backend(),
        enabled=torch_arena.is_enabled(),
        ours=ours is not None and cur is ours.allocator(),
        hooks=list(torch_arena._torch.installed_hooks()),
        patched=torch.cuda.memory_stats is torch_arena.stats.memory_stats,
    )
    out.update(extra)
    print("RESULT " + json.dumps(out), flush=True)
"""


# ---------------------------------------------------------------------------------------------
# Autostart: TORCH_ARENA=1 and the .pth.


def test_torch_arena_1_installs_the_allocator_when_torch_is_imported():
    proc = run(
        STATE,
        """
        before = "torch" in sys.modules
        import torch_arena._autostart as auto
        waiting = auto._hook is not None and auto._hook.installed()
        import torch
        state(before=before, waiting=waiting, hook_left=auto._hook.installed(),
              cuda_init=torch.cuda.is_initialized())
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    # torch is imported by the program, not by the .pth; the hook waited for it, then left.
    assert r["before"] is False
    assert r["waiting"] is True
    assert r["hook_left"] is False
    assert r["backend"] == "pluggable"
    assert r["enabled"] is True
    assert r["ours"] is True
    assert r["patched"] is True
    assert r["cuda_init"] is False
    assert r["hooks"] == [
        "set_init_fn",
        "set_reset_fn",
        "set_memory_fraction_fn",
        "set_record_stream_fn",
        "set_base_alloc_fn",
        "set_begin_allocate_to_pool",
        "set_end_allocate_to_pool_fn",
        "set_release_pool",
    ]


@pytest.mark.parametrize(
    "statement", ["import torch.cuda", "from torch import nn", "import torch.nn.functional as F"]
)
def test_any_first_form_of_torch_import_switches_it_on(statement):
    proc = run(
        STATE,
        statement,
        "state()",
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert (r["backend"], r["enabled"], r["ours"]) == ("pluggable", True, True)


def test_looking_for_torch_before_importing_it_does_not_use_the_hook_up():
    # Availability checks (transformers' is_torch_available, ...) call find_spec("torch") and
    # never load it; the program's import torch must still switch torch-arena on.
    proc = run(
        STATE,
        """
        import importlib.util
        found = importlib.util.find_spec("torch") is not None
        loaded = "torch" in sys.modules
        import torch
        state(found=found, loaded=loaded)
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert (r["found"], r["loaded"]) == (True, False)
    assert (r["backend"], r["enabled"], r["ours"]) == ("pluggable", True, True)


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_torch_arena_torch_keeps_its_native_allocator(value):
    env = {"TORCH_ARENA_CONF": SIM}
    if value is not None:
        env["TORCH_ARENA"] = value
    proc = run(
        """
        import json, sys
        import torch
        print("RESULT " + json.dumps(dict(
            backend=torch.cuda.get_allocator_backend(),
            imported=sorted(m for m in sys.modules if m.startswith("torch_arena")),
            hooks=[type(f).__name__ for f in sys.meta_path if "torch_arena" in type(f).__module__],
        )))
        """,
        **env,
    )
    assert result(proc) == {"backend": "native", "imported": [], "hooks": []}


def test_a_process_that_never_imports_torch_never_loads_it():
    proc = run(
        """
        import json, sys
        import json as _j  # any other import goes through the hook untouched
        print("RESULT " + json.dumps(dict(
            torch=sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
            autostart="torch_arena._autostart" in sys.modules,
        )))
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
    )
    assert result(proc) == {"torch": [], "autostart": True}


@pytest.mark.parametrize(
    ("conf", "key"),
    [("device:sim,bogus_key:1", "bogus_key"), ("device:gpu", "device"), ("stitch:yes", "stitch")],
)
def test_a_bad_torch_arena_conf_stops_the_program_at_import_torch(conf, key):
    # The exception a program that catches it sees, and that torch was not loaded at all.
    proc = run(
        """
        import json, sys
        try:
            import torch
            print("RESULT " + json.dumps(dict(error=None)))
        except ValueError as e:
            print("RESULT " + json.dumps(dict(error=str(e), torch="torch" in sys.modules)))
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=conf,
    )
    r = result(proc)
    assert r["error"] is not None and key in r["error"]
    assert r["torch"] is False
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("torch-arena:")]
    assert len(line) == 1 and key in line[0] and "TORCH_ARENA" in line[0]

    # A program that does not catch it stops with a ValueError traceback.
    proc = run(
        "import torch\nprint('still running')", check=False, TORCH_ARENA="1", TORCH_ARENA_CONF=conf
    )
    assert proc.returncode != 0
    assert "still running" not in proc.stdout
    assert "ValueError" in proc.stderr and key in proc.stderr


def test_torch_already_imported_when_autostart_runs_enables_at_once():
    proc = run(
        STATE,
        """
        import torch
        import torch_arena._autostart
        state()
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert (r["backend"], r["enabled"], r["ours"]) == ("pluggable", True, True)


def test_the_rank_is_logged():
    proc = run(
        """
        import logging
        logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
        import torch
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
        RANK="3",
        LOCAL_RANK="1",
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("torch_arena INFO")]
    assert any("RANK=3" in ln and "LOCAL_RANK=1" in ln for ln in lines), proc.stderr


def test_under_torchrun_every_rank_switches_itself_on(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, torch, torch_arena
            out = os.path.join(os.path.dirname(__file__), f"rank{os.environ['RANK']}.json")
            with open(out, "w") as f:
                json.dump(dict(backend=torch.cuda.get_allocator_backend(),
                               enabled=torch_arena.is_enabled(),
                               keys=len(torch.cuda.memory_stats())), f)
            """
        )
    )
    run(
        f"""
        import sys
        from torch.distributed.run import main
        main(["--nproc-per-node=2", "--standalone", "--monitor-interval=0.1", {str(script)!r}])
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
    )
    for rank in (0, 1):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r == {"backend": "pluggable", "enabled": True, "keys": 122}


# ---------------------------------------------------------------------------------------------
# Statistics parity.

STATS = (
    STATE
    + """
import warnings
import torch, torch_arena
MiB = 1 << 20
out = {}
mods = {"torch.cuda": torch.cuda, "torch.cuda.memory": torch.cuda.memory}
names = ["memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
         "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_summary",
         "reset_peak_memory_stats", "reset_max_memory_allocated",
         "reset_accumulated_memory_stats"]
out["same_functions"] = all(
    getattr(m, n) is getattr(torch_arena.stats, n) for m in mods.values() for n in names)
out["originals_kept"] = all(
    torch_arena._torch.original(n, mn) is not None
    and torch_arena._torch.original(n, mn).__module__ == "torch.cuda.memory"
    for mn in mods for n in names)
s0 = torch.cuda.memory_stats()
out["keys"] = list(s0)
out["arena_keys"] = list(torch_arena.memory_stats())
p = torch_arena.caching_allocator_alloc(3 * MiB)
s1 = torch.cuda.memory.memory_stats(0)
out["allocated_delta"] = s1["allocated_bytes.all.current"] - s0["allocated_bytes.all.current"]
out["requested_delta"] = s1["requested_bytes.all.current"] - s0["requested_bytes.all.current"]
out["alloc_count_delta"] = s1["allocation.all.allocated"] - s0["allocation.all.allocated"]
out["memory_allocated"] = torch.cuda.memory_allocated()
out["max_memory_allocated"] = torch.cuda.max_memory_allocated("cuda:0")
out["memory_reserved"] = torch.cuda.memory_reserved(torch.device("cuda", 0))
out["max_memory_reserved"] = torch.cuda.max_memory_reserved()
out["memory_cached"] = torch.cuda.memory_cached()  # deprecated alias, follows
acc = torch.accelerator
out["accelerator"] = [
    acc.memory_allocated(), acc.memory.memory_allocated(0), len(acc.memory_stats()),
    acc.memory_stats is torch_arena.stats.memory_stats,
]
nested = torch.cuda.memory_stats_as_nested_dict()
out["nested"] = nested["allocated_bytes"]["all"]["current"]
summary = torch.cuda.memory_summary()
out["summary_torch_table"] = summary.startswith("|" + "=" * 75 + "|")
out["summary_device"] = "PyTorch CUDA memory summary, device ID 0" in summary
out["summary_arena"] = "torch-arena summary" in summary
out["abbreviated_shorter"] = len(torch.cuda.memory_summary(abbreviated=True)) < len(summary)
torch_arena.caching_allocator_delete(p)
out["after_free"] = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
out["peak_after_reset"] = torch.cuda.max_memory_allocated()
p = torch_arena.caching_allocator_alloc(MiB)
torch_arena.caching_allocator_delete(p)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    torch.cuda.reset_max_memory_allocated()
out["reset_max_warns"] = [type(x.message).__name__ for x in w]
out["peak_after_reset_max"] = torch.cuda.max_memory_allocated()
torch.cuda.memory.reset_accumulated_memory_stats()
s2 = torch.cuda.memory_stats()
out["accumulated_after_reset"] = [s2["allocation.all.allocated"], s2["allocation.all.freed"]]
torch.cuda.reset_max_memory_cached()  # deprecated alias, follows
state(**out)
"""
)


@pytest.mark.parametrize("how", ["autostart", "enable"])
def test_torch_cuda_statistics_answer_from_the_arena(how):
    if how == "autostart":
        proc = run(STATS, TORCH_ARENA="1", TORCH_ARENA_CONF=SIM)
    else:
        proc = run("import torch, torch_arena\ntorch_arena.enable()", STATS, TORCH_ARENA_CONF=SIM)
    r = result(proc)
    assert r["enabled"] and r["backend"] == "pluggable"
    assert r["same_functions"] and r["originals_kept"]
    assert len(r["keys"]) == 122
    assert r["keys"] == r["arena_keys"] == sorted(r["keys"])
    assert "allocated_bytes.all.current" in r["keys"] and "num_ooms" in r["keys"]
    assert r["allocated_delta"] == 3 * MiB
    assert r["requested_delta"] == 3 * MiB
    assert r["alloc_count_delta"] == 1
    assert r["memory_allocated"] == r["max_memory_allocated"] == r["nested"] == 3 * MiB
    assert r["memory_reserved"] >= 3 * MiB and r["max_memory_reserved"] >= r["memory_reserved"]
    assert r["memory_cached"] == r["memory_reserved"]
    assert r["accelerator"] == [3 * MiB, 3 * MiB, 122, True]
    assert r["summary_torch_table"] and r["summary_device"] and r["summary_arena"]
    assert r["abbreviated_shorter"]
    assert r["after_free"] == 0
    assert r["peak_after_reset"] == 0
    assert r["reset_max_warns"] == ["FutureWarning"]
    assert r["peak_after_reset_max"] == 0
    assert r["accumulated_after_reset"] == [0, 0]


# ---------------------------------------------------------------------------------------------
# enable() from code: errors change nothing, repeats are no-ops.


def test_enable_when_cuda_is_initialised_raises_and_changes_nothing():
    proc = run(
        STATE,
        """
        import torch, torch_arena
        original = torch.cuda.memory_stats
        torch.cuda.is_initialized = lambda: True      # pretend CUDA has started
        try:
            torch_arena.enable()
            error = None
        except RuntimeError as e:
            error = str(e)
        state(error=error, untouched=torch.cuda.memory_stats is original)
        """,
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert "CUDA is already initialised" in r["error"]
    assert "TORCH_ARENA=1" in r["error"] and "torch_arena.enable()" in r["error"]
    assert (r["backend"], r["enabled"], r["ours"], r["patched"]) == ("native", False, False, False)
    assert r["untouched"] is True and r["hooks"] == []


@pytest.mark.parametrize(("conf", "key"), [("bogus_key:1", "bogus_key"), ("device:tpu", "device")])
def test_enable_with_a_bad_conf_raises_value_error_naming_the_key(conf, key):
    proc = run(
        STATE,
        f"""
        import torch, torch_arena
        try:
            torch_arena.enable({conf!r})
            error = None
        except ValueError as e:
            error = str(e)
        state(error=error)
        """,
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert r["error"] is not None and key in r["error"]
    assert (r["backend"], r["enabled"], r["patched"]) == ("native", False, False)


def test_enable_twice_is_a_no_op_and_another_conf_is_refused():
    proc = run(
        STATE,
        """
        import torch, torch_arena
        torch_arena.enable("device:sim, sim_capacity_mb:4096")
        first = torch_arena._torch._global.allocator
        torch_arena.enable()
        torch_arena.enable("device:sim,sim_capacity_mb:4096")
        same = torch_arena._torch._global.allocator is first
        try:
            torch_arena.enable("device:sim,sim_capacity_mb:2048")
            error = None
        except RuntimeError as e:
            error = str(e)
        state(same=same, error=error)
        """,
    )
    r = result(proc)
    assert r["same"] is True
    assert r["error"] is not None and "process-wide" in r["error"]
    assert (r["backend"], r["enabled"], r["ours"]) == ("pluggable", True, True)


def test_enable_after_another_pluggable_allocator_raises():
    proc = run(
        STATE,
        """
        import torch, torch_arena
        so = torch_arena.library_path()
        other = torch.cuda.memory.CUDAPluggableAllocator(so, "torch_arena_malloc",
                                                         "torch_arena_free")
        torch.cuda.memory.change_current_allocator(other)
        try:
            torch_arena.enable()
            error = None
        except RuntimeError as e:
            error = str(e)
        state(error=error)
        """,
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert "another pluggable CUDA allocator" in r["error"]
    assert (r["enabled"], r["ours"], r["patched"]) == (False, False, False)


def test_pool_refuses_to_run_under_the_global_arena():
    proc = run(
        """
        import json, torch, torch_arena
        try:
            with torch_arena.pool():
                pass
            error = None
        except RuntimeError as e:
            error = str(e)
        print("RESULT " + json.dumps(dict(error=error)))
        """,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=SIM,
    )
    error = result(proc)["error"]
    assert error is not None and "NOT the global allocator" in error


def test_importing_the_integration_does_not_import_torch():
    proc = run(
        """
        import json, sys
        import torch_arena, torch_arena._torch
        torch_arena.is_enabled()
        print("RESULT " + json.dumps(dict(torch="torch" in sys.modules)))
        """,
        TORCH_ARENA_CONF=SIM,
    )
    assert result(proc) == {"torch": False}


# ---------------------------------------------------------------------------------------------
# Warnings at enable time.

WARNINGS = (
    STATE
    + """
import warnings
import torch, torch_arena
from torch_arena._torch import TorchArenaWarning
def caught(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn()
    return [str(x.message) for x in w if issubclass(x.category, TorchArenaWarning)]
"""
)


def test_enable_warns_about_pytorch_cuda_alloc_conf():
    proc = run(
        WARNINGS,
        "state(w=caught(torch_arena.enable))",
        TORCH_ARENA_CONF=SIM,
        PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,pinned_use_cuda_host_register:True",
    )
    (message,) = result(proc)["w"]
    assert "PYTORCH_CUDA_ALLOC_CONF" in message and "TORCH_ARENA_CONF" in message
    # Named as the keys that no longer apply; the pinned host allocator's options still do.
    assert "no longer applies to CUDA memory (expandable_segments)" in message

    # Host (pinned) options still apply: no warning.
    proc = run(
        WARNINGS,
        "state(w=caught(torch_arena.enable))",
        TORCH_ARENA_CONF=SIM,
        PYTORCH_CUDA_ALLOC_CONF="pinned_use_cuda_host_register:True",
    )
    assert result(proc)["w"] == []


def test_cudnn_benchmark_warns_at_enable_and_when_set_later():
    proc = run(
        WARNINGS,
        """
        torch.backends.cudnn.benchmark = True
        at_enable = caught(torch_arena.enable)
        torch.backends.cudnn.benchmark = False
        later = caught(lambda: setattr(torch.backends.cudnn, "benchmark", True))
        value = torch.backends.cudnn.benchmark
        again = caught(lambda: setattr(torch.backends.cudnn, "benchmark", True))
        state(at_enable=at_enable, later=later, value=value, again=again)
        """,
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert len(r["at_enable"]) == 1
    assert "torch.backends.cudnn.benchmark = False" in r["at_enable"][0]
    assert "cacheInfo" in r["at_enable"][0]
    assert r["enabled"] is True
    assert r["value"] is True  # the setting itself still works
    assert r["again"] == []  # once is enough


def test_a_warning_turned_into_an_error_stops_enable_before_the_swap():
    proc = run(
        STATE,
        """
        import warnings
        import torch, torch_arena
        from torch_arena._torch import TorchArenaWarning
        warnings.simplefilter("error", TorchArenaWarning)
        torch.backends.cudnn.benchmark = True
        try:
            torch_arena.enable()
            error = None
        except Warning as e:
            error = type(e).__name__
        state(error=error)
        """,
        TORCH_ARENA_CONF=SIM,
    )
    r = result(proc)
    assert r["error"] == "TorchArenaWarning"
    assert (r["backend"], r["enabled"], r["patched"]) == ("native", False, False)


# ---------------------------------------------------------------------------------------------
# With a GPU (tests/gpu/ has the full suite).


@gpu
def test_cuda_tensors_come_from_the_arena():
    proc = run(
        STATE,
        """
        import torch
        x = torch.ones(1 << 20, device="cuda")
        y = (x * 2).sum().item()
        state(y=y, allocated=torch.cuda.memory_allocated())
        """,
        TORCH_ARENA="1",
    )
    r = result(proc)
    assert r["y"] == 2.0 * (1 << 20)
    assert r["allocated"] >= 4 << 20
    assert (r["backend"], r["ours"]) == ("pluggable", True)


@gpu
def test_pool_mode_routes_a_block_through_the_arena():
    proc = run(
        """
        import json, torch, torch_arena
        with torch_arena.pool() as pool:
            x = torch.ones(1 << 20, device="cuda")
        print("RESULT " + json.dumps(dict(
            backend=torch.cuda.get_allocator_backend(),
            arena=torch_arena.memory_allocated(),
            native=torch.cuda.memory_allocated(),
            value=x.sum().item(),
        )))
        """,
    )
    r = result(proc)
    assert r["backend"] == "native"
    assert r["arena"] >= 2 << 20  # the segment torch-arena supplied
    assert r["native"] >= 4 << 20  # native stats still count the tensor
    assert r["value"] == float(1 << 20)


def test_statistics_before_cuda_starts_answer_as_pytorch_does_without_a_driver():
    # No CUDA driver here: under TORCH_ARENA=1 (device cuda) PyTorch's own functions would
    # return 0 / {} before CUDA initialises; ours must too, with no error line per call.
    proc = run(
        """
        import json, torch
        out = dict(
            allocated=[torch.cuda.memory_allocated() for _ in range(3)],
            max_allocated=torch.cuda.max_memory_allocated(),
            reserved=torch.cuda.memory_reserved(),
            max_reserved=torch.cuda.max_memory_reserved(),
            stats=dict(torch.cuda.memory_stats()),
            nested=torch.cuda.memory_stats_as_nested_dict(),
            stats_type=type(torch.cuda.memory_stats()).__name__,
        )
        print("RESULT " + json.dumps(out), flush=True)
        """,
        STATE,
        "state()",
        TORCH_ARENA="1",
        TORCH_ARENA_CONF="",
    )
    r = result(proc)
    if torch.cuda.is_available():
        pytest.skip("a CUDA driver is present: this checks the driverless case")
    r0 = json.loads(proc.stdout.splitlines()[0][len("RESULT ") :])
    assert r0["allocated"] == [0, 0, 0]
    assert r0["max_allocated"] == r0["reserved"] == r0["max_reserved"] == 0
    assert r0["stats"] == {} and r0["nested"] == {} and r0["stats_type"] == "OrderedDict"
    assert r["enabled"] and r["patched"]
    assert "error" not in proc.stderr.lower(), proc.stderr


def test_torch_cuda_empty_cache_and_memory_fraction_reach_the_arena_on_the_simulated_device():
    # torch's CUDA never initialises on the simulated device: torch.cuda.empty_cache() did
    # nothing and set_per_process_memory_fraction() raised "Found no NVIDIA driver". On a GPU
    # both reach the arena through the allocator's hooks; here enable() points them at
    # torch_arena's, and torch_arena.set_per_process_memory_fraction is the equivalent.
    r = result(
        run(
            """
            import json, torch, torch_arena
            torch_arena.enable()
            p = torch_arena.caching_allocator_alloc(64 << 20)
            torch_arena.caching_allocator_delete(p)
            cached = torch.cuda.memory_reserved()
            torch.cuda.empty_cache()
            after = torch.cuda.memory_reserved()
            torch.cuda.set_per_process_memory_fraction(0.25)
            try:
                torch_arena.caching_allocator_alloc(2048 << 20)  # half of 4 GiB: over the cap
                capped = False
            except torch_arena.OutOfMemoryError:
                capped = True
            torch_arena.set_per_process_memory_fraction(1.0, device=0)
            q = torch_arena.caching_allocator_alloc(2048 << 20)
            torch_arena.caching_allocator_delete(q)
            print("RESULT", json.dumps(dict(cached=cached, after=after, capped=capped)))
            """,
            TORCH_ARENA_CONF=SIM,
        )
    )
    assert r["cached"] >= 64 << 20
    assert r["after"] == 0
    assert r["capped"] is True
