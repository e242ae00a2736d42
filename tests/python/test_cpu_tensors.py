"""cpu_tensors:True: real torch tensors from the arena without a GPU. With it, enable() makes
torch-arena c10's CPU allocator, so every CPU tensor made afterwards lives on simulated device
0: a real model, autograd and an optimizer run through the arena, and the arena's figures must
match the storages alive, byte for byte, rounded as the arena rounds. Each test runs in a fresh
interpreter (one allocator swap per process)."""

import json
import textwrap

import pytest
from conftest import CONF, REPO, run_python
from torch_arena import _native

pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not _native.has_track(), reason="this torch-arena library has no tracking exports"
)

CPU = CONF + ",cpu_tensors:True"

# The arena's rounding (src/arena/size_class.rs): 512-byte steps up to 4 KiB, then 8 size
# classes per doubling up to slab_max_kb (64 KiB by default), then 512-byte blocks of the heap.
# Each storage's size in the live table is checked against it too.
PRELUDE = """
import gc, json, torch, torch_arena
from torch_arena import _native
torch.manual_seed(0)

def rounded(n):
    if n == 0:
        return 0
    if n <= 4096 or n > 64 << 10:
        return -(-n // 512) * 512
    base = 4096
    while base * 2 < n:
        base *= 2
    step = base // 8
    return base + -(-(n - base) // step) * step

def figures():
    s = torch_arena.memory_stats(0)
    return s["allocated_bytes.all.current"], s["requested_bytes.all.current"]

def live():
    return {a["ptr"]: a for a in _native.live_json(0)["allocations"]}

def storages(tensors):
    out = {}
    for t in tensors:
        if t is not None and t.untyped_storage().nbytes():
            out[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return out

#BEFORE
torch_arena.enable()
BASE = set(live())
ALLOCATED0, REQUESTED0 = figures()

def check(tensors):
    '''The arena's live allocations (made since enable) are exactly the storages of `tensors`,
    each with its bytes requested and the arena's rounding; the statistics agree.'''
    gc.collect()
    table = {p: a for p, a in live().items() if p not in BASE}
    want = storages(tensors)
    allocated, requested = figures()
    return {
        "same_pointers": set(table) == set(want),
        "extra": sorted(a["requested"] for p, a in table.items() if p not in want),
        "missing": sorted(n for p, n in want.items() if p not in table),
        "requested_each": all(table[p]["requested"] == n for p, n in want.items() if p in table),
        "rounded_each": all(table[p]["size"] == rounded(n) for p, n in want.items() if p in table),
        "requested": requested - REQUESTED0,
        "allocated": allocated - ALLOCATED0,
        "true_bytes": sum(want.values()),
        "rounded_bytes": sum(rounded(n) for n in want.values()),
    }
"""


def run(body: str, conf: str = CPU, before: str = "") -> dict:
    """``body`` after PRELUDE, ``before`` in it just before enable(); its last line's JSON."""
    code = PRELUDE.replace("#BEFORE\n", textwrap.dedent(before)) + textwrap.dedent(body)
    r = run_python(code, REPO, TORCH_ARENA_CONF=conf)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def exact(phase: dict) -> None:
    """The arena holds exactly the storages alive, counted as the arena rounds."""
    assert phase["same_pointers"], phase
    assert phase["requested_each"] and phase["rounded_each"], phase
    assert phase["requested"] == phase["true_bytes"], phase
    assert phase["allocated"] == phase["rounded_bytes"], phase


def test_a_tensor_is_allocated_from_the_arena_and_freed_into_it():
    got = run(
        """
        phases = {}
        t = torch.empty(1000)               # 4000 bytes
        phases["made"] = check([t])
        phases["in_arena"] = t.untyped_storage().data_ptr() in live()
        t.fill_(3.0)                        # sim_backing: real memory
        phases["sum"] = float(t.sum())
        u = torch.arange(70_000, dtype=torch.uint8)  # > 64 KiB: the heap
        phases["two"] = check([t, u])
        del t
        phases["one"] = check([u])
        del u
        phases["none"] = check([])
        z = torch.empty(0)                  # no memory at all
        phases["zero"] = check([z])
        z.resize_(10)                       # its storage's allocator is the arena's
        phases["resized"] = check([z])
        print(json.dumps(phases))
        """
    )
    assert got["in_arena"] and got["sum"] == 3000.0
    for name in ("made", "two", "one", "none", "zero", "resized"):
        exact(got[name])
    assert got["made"]["allocated"] == 4096 and got["made"]["requested"] == 4000
    assert got["two"]["allocated"] == 4096 + 70_144
    assert got["none"]["allocated"] == got["zero"]["allocated"] == 0
    assert got["resized"]["requested"] == 40 and got["resized"]["allocated"] == 512


def test_an_mlp_with_adam_is_counted_exactly_at_every_phase_of_a_step():
    # Odd sizes on purpose: 512-byte steps, size classes and heap blocks all appear.
    got = run(
        """
        model = torch.nn.Sequential(
            torch.nn.Linear(50, 300), torch.nn.ReLU(), torch.nn.Linear(300, 70)
        )
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        params = list(model.parameters())
        x, y = torch.randn(32, 50), torch.randn(32, 70)
        phases = {"model": check(params + [x, y])}
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        forward = figures()[0] - ALLOCATED0
        loss.backward()
        del out, loss  # the backward freed what the graph saved
        grads = [p.grad for p in params]
        phases["backward"] = check(params + grads + [x, y])
        opt.step()
        state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        phases["step"] = check(params + grads + state + [x, y])
        opt.zero_grad()  # set_to_none: the gradients go
        del grads
        phases["zero_grad"] = check(params + state + [x, y])
        for _ in range(3):  # steady: nothing more, nothing less
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        phases["steady"] = check(params + state + [x, y])
        del model, opt, params, state
        phases["freed"] = check([x, y])
        print(json.dumps({"phases": phases, "forward": forward}))
        """
    )
    p = got["phases"]
    for phase in p.values():
        exact(phase)
    param_bytes = 4 * (50 * 300 + 300 + 300 * 70 + 70)
    assert p["model"]["true_bytes"] == param_bytes + 4 * (32 * 50 + 32 * 70)
    # Rises with the forward (activations), falls after the backward, rises with the gradients
    # and the optimizer state, falls with zero_grad.
    assert got["forward"] > p["model"]["allocated"]
    assert p["backward"]["allocated"] == 2 * p["model"]["allocated"] - p["freed"]["allocated"]
    # Adam's state: exp_avg and exp_avg_sq like each parameter, and a scalar step each.
    assert p["step"]["true_bytes"] - p["backward"]["true_bytes"] == 2 * param_bytes + 4 * 4
    assert p["zero_grad"]["allocated"] < p["step"]["allocated"]
    assert p["steady"] == p["zero_grad"]


def test_a_small_transformer_with_adam_is_counted_exactly():
    got = run(
        """
        model = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(d_model=48, nhead=4, dim_feedforward=96,
                                             batch_first=True),
            num_layers=2, enable_nested_tensor=False,
        )
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(4, 10, 48)
        params = list(model.parameters())
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
        grads = [p.grad for p in params]
        state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        after_step = check(params + grads + state + [x])
        opt.zero_grad()
        del grads
        after_zero = check(params + state + [x])
        print(json.dumps({"after_step": after_step, "after_zero": after_zero,
                          "params": sum(p.numel() * 4 for p in params)}))
        """
    )
    exact(got["after_step"])
    exact(got["after_zero"])
    assert got["after_step"]["true_bytes"] >= 4 * got["params"]  # params, grads, 2 states


def test_explains_categories_are_the_arenas_tensors():
    # test_explain's first test, with CPU tensors in the arena: the categories still equal the
    # storages' true bytes, and each of those storages is a live arena allocation.
    got = run(
        """
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64), torch.nn.Tanh()
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(32, 64)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        del loss
        r = torch_arena.explain(json=True, device="cpu")
        groups = {
            "parameters": storages(model.parameters()),
            "gradients": storages(p.grad for p in model.parameters()),
            "optimizer_state": storages(
                v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)),
        }
        table = live()
        print(json.dumps({
            "got": r["categories"],
            "truth": {k: sum(v.values()) for k, v in groups.items()},
            "arena": {k: sum(table[p]["requested"] for p in v if p in table)
                      for k, v in groups.items()},
            "arena_rounded": {k: sum(table[p]["size"] for p in v if p in table)
                              for k, v in groups.items()},
            "rounded": {k: sum(rounded(n) for n in v.values()) for k, v in groups.items()},
        }))
        """
    )
    for category, want in got["truth"].items():
        assert got["got"][category] == want == got["arena"][category], category
        assert got["arena_rounded"][category] == got["rounded"][category], category
    assert got["got"]["parameters"] == 4 * (64 * 256 + 256 + 256 * 64 + 64)
    assert got["got"]["activations"] == 0 and got["got"]["held_graphs"] == 0


def test_a_list_of_losses_that_keeps_their_graphs_is_a_leak_with_its_holder_named():
    body = """
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def train(steps):
            history = []
            for _ in range(steps):
                loss = model(torch.randn(32, 64)).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()  # torch-arena's step advances
                val = model(torch.randn(32, 64)).square().mean()  # LEAK
                history.append(val)  # with grad enabled: val keeps its whole graph
            return (torch_arena.leak_report(format="json"), torch_arena.leak_report(),
                    torch_arena.current_step())

        report, text, steps = train(8)
        from torch_arena.leaks import site_location
        print(json.dumps({
            "steps": steps,
            "growing": [
                {"line": (site_location(s["frames"]) or (None, None))[1],
                 "bytes_per_step": s["bytes_per_step"],
                 "holders": [h["expr"] for h in s["holders"]],
                 "types": [h["type"] for h in s["holders"]],
                 "roots": [h["root"] for h in s["holders"]]}
                for s in report["growing"]
            ],
            "text": text,
        }))
        """
    got = run(body, conf=CPU + ",sites:python")
    code = PRELUDE.replace("#BEFORE\n", "") + textwrap.dedent(body)
    leak = next(n for n, t in enumerate(code.splitlines(), 1) if t.endswith("# LEAK"))
    at = [s for s in got["growing"] if s["line"] == leak]
    others = [s for s in got["growing"] if s["line"] != leak]
    assert got["steps"] == 8
    assert at, got["text"]
    assert others == [], got["text"]
    # Per step the graph keeps its input (32 x 64 floats), the ReLU's output (32 x 256), the
    # output of the last Linear (32 x 1) and the loss (one float), in the arena's blocks.
    per_step = sum(s["bytes_per_step"] for s in at)
    assert per_step == pytest.approx(8192 + 32768 + 512 + 512, rel=0.05), got["text"]
    holders = [e or "" for s in at for e in s["holders"]]
    roots = [r or "" for s in at for r in s["roots"]]
    assert any(e.startswith("history[") for e in holders), got["text"]
    assert any("local variable 'history' of train()" in r for r in roots), got["text"]
    assert "history[" in got["text"]
    # Every allocation the graphs keep is named by the kept output whose graph saved it: the
    # activations no Python name refers to (the input and the ReLU's output) as what their
    # backward nodes saved.
    for s in at:
        assert any((e or "").startswith("history[") for e in s["holders"]), (s, got["text"])
        assert None not in s["holders"][:1], (s, got["text"])
    for size in (8192, 32768):
        site = next(s for s in at if s["bytes_per_step"] == size)
        saved = [
            e for e, t in zip(site["holders"], site["types"], strict=True) if t == "autograd graph"
        ]
        assert saved and all(
            e.startswith(("history[", "val.")) and "._saved_mat1" in e for e in saved
        ), (
            site,
            got["text"],
        )
    assert "saved for backward by AddmmBackward0" in got["text"]


def test_threads_allocate_and_free_concurrently():
    got = run(
        """
        import threading
        def work():
            for i in range(300):
                a = torch.randn(100 + i)
                b = (a * 2).sum()
                del a, b
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"left": check([]), "bad_frees": _native.bad_free_count()}))
        """
    )
    exact(got["left"])
    assert got["bad_frees"] == 0


def test_tensors_made_before_enable_are_freed_by_their_own_allocator():
    got = run(
        """
        phases = {"start": check([])}
        before[0].resize_(5000)  # reallocated by the allocator that made its storage
        del before
        phases["freed"] = check([])
        print(json.dumps({"phases": phases, "bad_frees": _native.bad_free_count()}))
        """,
        before="before = [torch.randn(1000) for _ in range(4)]  # the default allocator's\n",
    )
    exact(got["phases"]["start"])
    exact(got["phases"]["freed"])
    assert got["bad_frees"] == 0


@pytest.mark.parametrize(
    ("conf", "lacks"),
    [
        ("device:sim,cpu_tensors:True", "sim_backing:True"),
        ("device:sim,sim_backing:False,cpu_tensors:True", "sim_backing:True"),
        ("sim_backing:True,cpu_tensors:True", "device:sim"),
        ("device:cuda,cpu_tensors:True", "device:sim and sim_backing:True"),
    ],
)
def test_cpu_tensors_without_a_backed_simulated_device_is_refused(conf, lacks):
    with pytest.raises(ValueError) as e:
        _native.check_config(conf)
    msg = str(e.value)
    assert "cpu_tensors:True needs device:sim and sim_backing:True" in msg, msg
    assert f"lacks {lacks}:" in msg, msg
    r = run_python(
        textwrap.dedent(
            f"""
            import torch, torch_arena
            try:
                torch_arena.enable({conf!r})
            except ValueError as e:
                print("REFUSED", torch_arena.is_enabled(), e)
            """
        ),
        REPO,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("REFUSED False "), r.stdout
    assert "cpu_tensors:True needs" in r.stdout


def test_torch_arena_1_with_a_bad_combination_stops_at_import_torch():
    r = run_python(
        "import torch",
        REPO,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF="device:sim,cpu_tensors:True",
    )
    assert r.returncode != 0
    assert "cpu_tensors:True needs device:sim and sim_backing:True" in r.stderr, r.stderr


def test_cpu_tensors_false_leaves_cpu_tensors_alone():
    got = run(
        """
        t = torch.empty(1000)
        print(json.dumps({"in_arena": t.untyped_storage().data_ptr() in live(),
                          "left": check([])}))
        """,
        conf=CONF + ",cpu_tensors:False",
    )
    assert not got["in_arena"]
    exact(got["left"])


def test_torch_arena_1_switches_cpu_tensors_on_as_torch_is_imported():
    r = run_python(
        "import json, torch, torch_arena\n"
        "t = torch.ones(1000)\n"
        "print(json.dumps({'requested': torch.cuda.memory_stats()['requested_bytes.all.current'],"
        " 'allocated': torch.cuda.memory_allocated()}))",
        REPO,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF=CPU,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"requested": 4000, "allocated": 4096}


def test_a_cpu_tensor_beyond_the_simulated_capacity_is_torchs_out_of_memory_error():
    got = run(
        """
        try:
            torch.empty(100 << 20)  # 400 MiB on a 64 MiB device
            caught = None
        except torch.OutOfMemoryError as e:
            caught = str(e)
        after = torch.ones(1 << 20)  # and the arena goes on serving
        print(json.dumps({"caught": caught, "after": check([after])}))
        """,
        conf=CPU.replace("sim_capacity_mb:4096", "sim_capacity_mb:64"),
    )
    assert got["caught"].startswith("CUDA out of memory. Tried to allocate 400.00 MiB")
    exact(got["after"])


def test_a_fork_child_leaves_the_arena_to_its_parent():
    # The simulated device's pages are shared with a fork child (a MAP_SHARED memfd): the child
    # must neither take blocks from the arena nor give the inherited ones back.
    got = run(
        """
        import os
        t = torch.ones(1000)
        before = check([t])
        pid = os.fork()
        if pid == 0:
            ok = True
            try:
                mine = [torch.full((1000 + i,), 7.0) for i in range(50)]
                ok = not any(m.untyped_storage().data_ptr() in live() for m in mine)
                ok = ok and float(sum(m.sum() for m in mine)) == 7.0 * sum(range(1000, 1050))
                del t, mine  # an inherited storage is forgotten, not freed into the arena
                ok = ok and len(live()) == len(BASE) + 1
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        # DataLoader workers (fork start method) build batches in the same situation.
        data = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2))
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)
        total = float(sum(b[0].sum() for b in loader))
        del loader, data
        print(json.dumps({"child": os.waitstatus_to_exitcode(status), "before": before,
                          "after": check([t]), "t": float(t.sum()), "total": total}))
        """
    )
    assert got["child"] == 0
    exact(got["after"])
    assert got["after"] == got["before"]
    assert got["t"] == 1000.0
    assert got["total"] == sum(range(64))


def test_a_compiler_that_fails_stops_enable_and_changes_nothing(tmp_path):
    r = run_python(
        textwrap.dedent(
            """
            import torch, torch_arena
            try:
                torch_arena.enable()
            except RuntimeError as e:
                t = torch.ones(1000)
                print("REFUSED", torch_arena.is_enabled(),
                      torch_arena.memory_stats(0)["allocation.all.current"], e)
            """
        ),
        REPO,
        TORCH_ARENA_CONF=CPU,
        TORCH_ARENA_CACHE=str(tmp_path),
        CXX="false",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("REFUSED False 0 "), r.stdout
    assert "compiling torch-arena's CPU allocator failed" in r.stdout


def test_a_tensor_saved_by_a_custom_function_in_a_kept_graph_is_named_by_its_path():
    body = """
        from torch_arena.referrers import find_holders

        class Square(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x * 1.0)  # a tensor only the graph keeps
                return x * x

            @staticmethod
            def backward(ctx, grad):
                (kept,) = ctx.saved_tensors
                return 2 * kept * grad

        keep = {}
        x = torch.randn(1000, requires_grad=True)
        keep["out"] = Square.apply(x).sum()
        node = keep["out"].grad_fn.next_functions[0][0]
        ptr = node.saved_tensors[0].untyped_storage().data_ptr()
        del node
        found = find_holders([ptr])[ptr]
        # After a backward the graph frees what it saved: no holder is invented.
        keep["out"].backward()
        print(json.dumps({"found": found, "after": find_holders([ptr])}))
        """
    got = run(body)
    exprs = [h["expr"] for h in got["found"] if h["type"] == "autograd graph"]
    assert exprs == ["keep['out'].grad_fn.next_functions[0][0].saved_tensors[0]"], got
    assert "'keep'" in got["found"][0]["root"], got
    assert got["found"][0]["chain"][0] == "saved for backward by SquareBackward", got
    after = [h for holders in got["after"].values() for h in holders]
    assert all(h["type"] != "autograd graph" for h in after), got
