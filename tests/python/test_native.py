"""The installed package: library loading, raw allocations through the public API, errors,
configuration, the console command, the autostart .pth, and the file-name placeholders."""

import ctypes
import importlib.metadata
import itertools
import logging
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch_arena
from conftest import CAPACITY, REPO, run_python
from torch_arena import _native, _paths, stats

pytestmark = pytest.mark.usefixtures("no_leaked_allocations")

# ---------------------------------------------------------------------------------------------
# The package and its library.


def test_versions_agree_with_cargo_toml_and_the_installed_metadata():
    cargo = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M)
    assert cargo is not None
    assert torch_arena.__version__ == cargo.group(1)
    assert importlib.metadata.version("torch-arena") == cargo.group(1)


def test_the_library_ships_inside_the_installed_package():
    path = Path(torch_arena.library_path())
    assert path.is_file()
    assert path.parent == Path(torch_arena.__file__).parent
    assert path.name == "_native_lib.abi3.so"
    # The hooks PyTorch is given are exported under the names the header documents.
    for name in ("torch_arena_malloc", "torch_arena_free", "torch_arena_empty_cache"):
        assert _native.symbol_address(name) != 0


def test_the_public_api_is_complete():
    expected = {
        "OutOfMemoryError",
        "caching_allocator_alloc",
        "caching_allocator_delete",
        "configure",
        "defragment",
        "empty_cache",
        "growth",
        "library_path",
        "max_memory_allocated",
        "max_memory_reserved",
        "memory_allocated",
        "memory_reserved",
        "memory_stats",
        "memory_stats_as_nested_dict",
        "memory_summary",
        "pages",
        "reset_accumulated_memory_stats",
        "reset_max_memory_allocated",
        "reset_peak_memory_stats",
        "set_per_process_memory_fraction",
        "enable",
        "is_enabled",
        "pool",
        "__version__",
    }
    assert expected <= set(torch_arena.__all__)
    assert expected <= set(dir(torch_arena))
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = torch_arena.no_such_name


def test_importing_the_package_does_not_import_torch(tmp_path):
    code = (
        "import sys, torch_arena\n"
        "torch_arena.memory_stats(); torch_arena.memory_summary()\n"
        "torch_arena.caching_allocator_delete(torch_arena.caching_allocator_alloc(1 << 20))\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
        "print('ok')\n"
    )
    r = run_python(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


# ---------------------------------------------------------------------------------------------
# caching_allocator_alloc / caching_allocator_delete.


def test_alloc_write_read_free_round_trip():
    sizes = [1, 512, 1000, 4096, 70_000, 1 << 20, 3 * (1 << 20) + 1]
    ptrs = [torch_arena.caching_allocator_alloc(n) for n in sizes]
    try:
        spans = sorted((p, p + n) for p, n in zip(ptrs, sizes, strict=True))
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two live allocations overlap"
        for i, (p, n) in enumerate(zip(ptrs, sizes, strict=True)):
            assert p % 512 == 0
            ctypes.memset(p, 0x11 + i, n)  # sim_backing: the memory is real host memory
        for i, (p, n) in enumerate(zip(ptrs, sizes, strict=True)):
            assert ctypes.string_at(p, n) == bytes([0x11 + i]) * n
    finally:
        for p in ptrs:
            torch_arena.caching_allocator_delete(p)


def test_size_zero_is_null_and_deleting_null_does_nothing():
    assert torch_arena.caching_allocator_alloc(0) == 0
    torch_arena.caching_allocator_delete(0)


def test_base_alloc_finds_the_allocation_around_an_interior_pointer():
    p = torch_arena.caching_allocator_alloc(10_000)
    try:
        base, size = _native.base_alloc(p + 1234)
        assert base == p
        assert size >= 10_000
    finally:
        torch_arena.caching_allocator_delete(p)
    with pytest.raises(ValueError):
        _native.base_alloc(p)


@pytest.mark.parametrize("kind", ["int", "cuda_stream", "as_parameter"])
def test_stream_arguments(kind):
    class TorchLikeStream:
        cuda_stream = 0x5000

    class CtypesLikeStream:
        _as_parameter_ = ctypes.c_void_p(0x6000)

    stream = {"int": 0x4000, "cuda_stream": TorchLikeStream(), "as_parameter": CtypesLikeStream()}
    handle = {"int": 0x4000, "cuda_stream": 0x5000, "as_parameter": 0x6000}[kind]
    p = torch_arena.caching_allocator_alloc(4096, device=0, stream=stream[kind])
    assert stats._raw[p] == (4096, 0, handle)  # freed later with the stream it was allocated on
    torch_arena.caching_allocator_delete(p)


def test_bad_arguments_raise_before_allocating():
    with pytest.raises(TypeError):
        torch_arena.caching_allocator_alloc(64, stream="default")
    with pytest.raises(ValueError, match="size"):
        torch_arena.caching_allocator_alloc(-1)
    with pytest.raises(ValueError, match="does not exist"):
        torch_arena.caching_allocator_alloc(64, device=7)
    with pytest.raises(ValueError, match="CUDA device"):
        torch_arena.caching_allocator_alloc(64, device="cpu")


def test_ints_that_ctypes_would_wrap_are_refused_naming_the_argument_and_range():
    # ctypes keeps the low bits: device 2**64 became device 0, every=-1 became 2**64 - 1.
    from torch_arena import _native

    with pytest.raises(
        ValueError, match=r"device 18446744073709551616 is out of range: expected 0 to 2147483647"
    ):
        _native.set_memory_fraction(0.25, 2**64)
    with pytest.raises(ValueError, match=r"device -1 is out of range"):
        _native.stats(-1)
    with pytest.raises(
        ValueError, match=r"every -1 is out of range: expected 1 to 18446744073709551615"
    ):
        _native.set_sites("none", every=-1)
    with pytest.raises(ValueError, match=r"min_bytes 18446744073709551616 is out of range"):
        _native.set_sites("none", 1, 2**64)
    with pytest.raises(TypeError, match=r"every must be an int"):
        _native.set_sites("none", every=1.5)
    with pytest.raises(TypeError, match=r"fraction must be a float"):
        _native.set_memory_fraction("half", 0)
    with pytest.raises(ValueError, match=r"max_entries -1 is out of range"):
        _native.history_enable(True, -1)


def test_arguments_of_the_wrong_type_are_type_errors():
    with pytest.raises(TypeError, match=r"conf .* must be a str, not int 123"):
        torch_arena.configure(123)
    with pytest.raises(TypeError, match=r"mem_ptr must be an int .* not list \[\]"):
        torch_arena.caching_allocator_delete([])
    with pytest.raises(TypeError, match=r"mem_ptr must be an int"):
        torch_arena.caching_allocator_delete(None)


def test_deleting_an_unknown_pointer_or_twice_raises_value_error():
    with pytest.raises(ValueError, match="not returned by caching_allocator_alloc"):
        torch_arena.caching_allocator_delete(0xDEAD000)
    p = torch_arena.caching_allocator_alloc(256)
    torch_arena.caching_allocator_delete(p)
    with pytest.raises(ValueError):
        torch_arena.caching_allocator_delete(p)


def test_the_library_reports_a_bad_free_as_value_error():
    bad_before = _native.bad_free_count()
    with pytest.raises(ValueError, match="0xdead000"):
        _native.try_free(0xDEAD000, 64, 0)
    assert _native.bad_free_count() == bad_before + 1


def test_out_of_memory_raises_and_the_process_can_allocate_afterwards():
    ooms = torch_arena.memory_stats()["num_ooms"]
    with pytest.raises(torch_arena.OutOfMemoryError) as info:
        torch_arena.caching_allocator_alloc(CAPACITY + (1 << 30))
    assert isinstance(info.value, RuntimeError)
    assert str(info.value).startswith("CUDA out of memory. Tried to allocate 5.00 GiB")
    assert torch_arena.memory_stats()["num_ooms"] == ooms + 1
    p = torch_arena.caching_allocator_alloc(64 << 20)
    ctypes.memset(p, 0x5A, 64 << 20)
    torch_arena.caching_allocator_delete(p)


# ---------------------------------------------------------------------------------------------
# Configuration.


def test_configure_accepts_the_running_configuration_and_refuses_a_change():
    torch_arena.configure()  # TORCH_ARENA_CONF, which is what the allocator runs with
    with pytest.raises(ValueError, match="already initialised"):
        torch_arena.configure("device:sim,sim_capacity_mb:1024")


@pytest.mark.parametrize(
    ("conf", "key"),
    [
        ("device:sim,bogus_key:1", "bogus_key"),
        ("device:sim,sim_capacity_mb:lots", "sim_capacity_mb"),
    ],
)
def test_a_bad_torch_arena_conf_raises_value_error_naming_the_key(tmp_path, conf, key):
    code = (
        "import torch_arena\n"
        "for call in (torch_arena.memory_stats, lambda: torch_arena.caching_allocator_alloc(64)):\n"
        "    try:\n"
        "        call()\n"
        "    except ValueError as e:\n"
        "        print('ValueError:', e)\n"
    )
    r = run_python(code, tmp_path, TORCH_ARENA_CONF=conf)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    for line in lines:
        assert line.startswith("ValueError: ")
        assert key in line


def test_configure_installs_a_configuration_before_first_use(tmp_path):
    code = (
        "import torch_arena\n"
        "try:\n"
        "    torch_arena.configure('device:sim,stitch:yes')\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
        "torch_arena.configure('device:sim,sim_capacity_mb:512')\n"
        "print('536870912 bytes' in torch_arena.memory_summary())\n"
    )
    r = run_python(code, tmp_path, TORCH_ARENA_CONF="this is not read")
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first.startswith("ValueError: ")
    assert "stitch" in first
    assert second == "True"  # the capacity row shows the configured 512 MiB


# ---------------------------------------------------------------------------------------------
# The console command and the autostart .pth.


def test_the_console_command_runs_the_demo():
    exe = Path(sysconfig.get_path("scripts")) / "torch-arena"
    assert exe.is_file(), f"{exe} was not installed"
    r = subprocess.run(
        [str(exe), "demo", "--steps", "2"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "PyTorch CUDA memory summary, device ID 0" in r.stdout
    assert "torch-arena summary, device ID 0" in r.stdout


def test_the_autostart_pth_is_installed_and_is_one_guarded_line():
    pth = Path(sysconfig.get_path("purelib")) / "torch-arena-autostart.pth"
    lines = pth.read_text().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("import os;")
    assert 'os.environ.get("TORCH_ARENA", "0") not in ("", "0")' in lines[0]


@pytest.mark.parametrize("value", [None, "", "0"])
def test_the_pth_imports_nothing_unless_torch_arena_is_set(tmp_path, value):
    env = {} if value is None else {"TORCH_ARENA": value}
    r = run_python("pass", tmp_path, **env)
    assert r.returncode == 0, r.stderr
    full_env = {k: v for k, v in os.environ.items() if k != "TORCH_ARENA"}
    full_env.update(env)
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    modules = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()]
    assert "site" in modules  # importtime did report the start-up imports
    assert not [m for m in modules if m.startswith("torch")]


# ---------------------------------------------------------------------------------------------
# File names under torchrun.


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, "0"),
        ({"LOCAL_RANK": "2"}, "2"),
        ({"RANK": "5", "LOCAL_RANK": "1"}, "5"),
        ({"RANK": ""}, "0"),
    ],
)
def test_paths_take_the_rank_and_pid(monkeypatch, env, rank):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _paths.expand("leaks-{rank}-{pid}.txt") == f"leaks-{rank}-{os.getpid()}.txt"
    assert _paths.expand("/tmp/{x}/{rank}") == f"/tmp/{{x}}/{rank}"
    assert _paths.default_name("torch-arena-leaks", "txt") == f"torch-arena-leaks-rank{rank}.txt"
    assert _paths.rank() == int(rank)


# ---------------------------------------------------------------------------------------------
# Log records forwarded to Python's logging.


@pytest.mark.skipif(not _native.has_log(), reason="this library build has no log exports")
def test_attached_log_records_reach_the_torch_arena_logger(caplog):
    assert _native.drain_logs() == []  # detached: nothing is queued
    level = _native.log_level()
    _native.set_log_level("debug")
    _native.attach_logs(True)
    try:
        with caplog.at_level(logging.DEBUG, logger="torch_arena"):
            torch_arena.defragment()  # a public call: its debug report is forwarded at once
        assert _native.drain_logs() == []
    finally:
        _native.attach_logs(False)
        _native.set_log_level(["off", "error", "warn", "info", "debug", "trace"][level])
    records = [r for r in caplog.records if r.name == "torch_arena"]
    assert records, "no record was forwarded"
    assert any(r.levelno == logging.DEBUG and "defragment" in r.getMessage() for r in records)
    assert all(isinstance(r.target, str) for r in records)
    with pytest.raises(ValueError, match="not a torch-arena log level"):
        _native.set_log_level("loud")


def test_log_fields_are_unescaped():
    assert _native._unescape(r"a\tb\nc\\d\re") == "a\tb\nc\\d\re"
    assert _native._unescape("plain") == "plain"


def test_installed_conf_is_the_librarys_own_reading():
    torch_arena.memory_stats(0)  # initialised with the tests' configuration
    text = _native.installed_conf()
    assert "sim_capacity_mb:4096" in text and "sim_backing:True" in text
    assert "leak_warmup:2" in text  # defaults are spelled out: the library's reading, not ours
