"""torch_arena.explain() and categorize() on real torch tensors (CPU, no GPU): each category
against a ground truth computed another way, in a fresh interpreter so that no other test's
tensors or graphs are alive.

Ground truths: parameters and gradients from the model's own lists; optimizer state from
``optimizer.state``; activations from ``torch.autograd.graph.saved_tensors_hooks`` (what autograd
packs during the forward), less the parameters it saves, plus the live outputs.
"""

import json
import os

import pytest
from conftest import REPO, run_python

pytest.importorskip("torch")

PRELUDE = """
import json, torch, torch_arena
torch.manual_seed(0)

def storages(tensors):
    out = {}
    for t in tensors:
        s = t.untyped_storage()
        out[(str(t.device), s.data_ptr())] = s.nbytes()
    return out

def total(d):
    return sum(d.values())

def saved_truth(forward):
    '''Run forward(x) and a loss on it under saved_tensors_hooks: (out, loss, the bytes of the
    storages autograd packed, parameters left out, and of out and loss). The hook keeps a
    detached alias: a saved output packed as itself would hold its own grad_fn, a cycle never
    freed.'''
    packed = []
    def pack(t):
        packed.append(t.detach())
        return packed[-1]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(x)
        loss = out.square().mean()
    params = storages(model.parameters())
    saved = {k: v for k, v in storages(packed).items() if k not in params}
    return out, loss, total({**saved, **storages([out, loss])})

model = torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64), torch.nn.Tanh()
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(32, 64)
"""


def run(body: str) -> dict:
    r = run_python(PRELUDE + body, REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_parameters_gradients_and_optimizer_state_exactly():
    got = run(
        """
loss = model(x).square().mean()
loss.backward()
opt.step()
del loss
r = torch_arena.explain(json=True, device="cpu")
truth = {
    "parameters": total(storages(model.parameters())),
    "gradients": total(storages(p.grad for p in model.parameters())),
    "optimizer_state": total(storages(
        v for st in opt.state.values() for v in st.values() if torch.is_tensor(v))),
}
print(json.dumps({"got": r["categories"], "truth": truth, "remedies": r["remedies"]}))
"""
    )
    for category, want in got["truth"].items():
        assert got["got"][category] == want, category
    assert got["got"]["parameters"] == 4 * (64 * 256 + 256 + 256 * 64 + 64)
    # No graph is alive after the backward: nothing saved, nothing held, nothing to remedy.
    assert got["got"]["activations"] == 0
    assert got["got"]["held_graphs"] == 0
    assert got["remedies"] == []


def test_activations_are_what_autograd_saved_for_the_backward_to_come():
    got = run(
        """
out, loss, truth = saved_truth(model)
r = torch_arena.explain(json=True, device="cpu")
before = r["categories"]["activations"]
loss.backward()
after = torch_arena.explain(json=True, device="cpu")["categories"]["activations"]
print(json.dumps({"activations": before, "truth": truth, "after": after,
                  "out": out.untyped_storage().nbytes() + loss.untyped_storage().nbytes(),
                  "warnings": r["warnings"]}))
"""
    )
    assert got["activations"] == got["truth"] > 32 * 256 * 4
    # The backward frees what was saved; the outputs the program still names stay.
    assert got["after"] == got["out"]
    assert any("no step boundary" in w for w in got["warnings"])


def test_losses_kept_in_a_list_are_held_graphs_and_detach_frees_them():
    got = run(
        """
losses = []
for i in range(3):
    loss = model(x).square().mean()
    losses.append(loss)
    torch_arena.step()
r = torch_arena.explain(json=True, device="cpu")
# What each graph holds, measured: the categories after dropping the list.
del losses, loss
after = torch_arena.explain(json=True, device="cpu")["categories"]
print(json.dumps({"r": r, "after": after}))
"""
    )
    r = got["r"]
    assert len(r["held_graphs"]) == 3
    assert r["categories"]["activations"] == 0
    held = r["categories"]["held_graphs"]
    assert held > 3 * 32 * 256 * 4
    assert got["after"]["held_graphs"] == 0
    assert [m["id"] for m in r["remedies"]] == ["detach"]
    assert r["remedies"][0]["saves_bytes"] == held
    assert "list" in r["remedies"][0]["why"]
    # What it cannot know here, said rather than guessed: no module hooks, no allocator on the CPU.
    assert not any("step boundary" in w for w in r["warnings"]), r["warnings"]
    assert any(w.startswith("track_modules() is off") for w in r["warnings"]), r["warnings"]
    assert any("does not serve this device" in w for w in r["warnings"]), r["warnings"]


def test_evaluation_with_grad_enabled_is_a_held_graph_remedied_by_no_grad():
    """The module's mode is read when explain() runs: here still in evaluation."""
    got = run(
        """
model.eval()
outputs = [model(x) for _ in range(2)]   # grad enabled: each output keeps its graph
torch_arena.step()
loss = model(x).square().mean()          # this step's forward: activations, not held
r = torch_arena.explain(json=True, device="cpu")
print(json.dumps(r))
print(json.dumps({"text": torch_arena.explain(device="cpu"), **r}))
"""
    )
    assert [h["eval_mode"] for h in got["held_graphs"]] == [True, True]
    assert got["categories"]["activations"] > 0
    remedies = {m["id"]: m for m in got["remedies"]}
    assert set(remedies) == {"no_grad", "mixed_precision"}
    assert remedies["no_grad"]["saves_bytes"] == got["categories"]["held_graphs"]
    text = got["text"]
    assert "held_graphs" in text and "remedy no_grad" in text and "torch.no_grad()" in text


def test_a_storage_counts_once_in_the_first_category_that_reaches_it():
    got = run(
        """
view = model[0].weight[:8]            # a view of a parameter: the parameter's storage
extra = torch.empty(1000)             # a tensor of no module or graph: other
r = torch_arena.categorize(device="cpu")
print(json.dumps({"bytes": r.bytes, "storages": r.storages, "x": x.untyped_storage().nbytes()}))
"""
    )
    assert got["storages"]["parameters"] == 4
    assert got["bytes"]["other"] == 4000 + got["x"]
    assert got["storages"]["other"] == 2


def test_the_allocators_cached_and_unusable_bytes_on_a_device_it_serves():
    got = run(
        """
from torch_arena import _explain
MiB = 1 << 20
assert torch_arena.explain(json=True)["cached_bytes"] is None   # torch-arena serves no device yet
_explain.set_devices(lambda: [0])                             # as enable() does
a = torch_arena.caching_allocator_alloc(8 * MiB)
b = torch_arena.caching_allocator_alloc(3 * MiB)
c = torch_arena.caching_allocator_alloc(256 * MiB)
torch_arena.caching_allocator_delete(a)
torch_arena.caching_allocator_delete(c)
r = torch_arena.explain(json=True)
pages = torch_arena.pages(0)
allocated = torch_arena.memory_allocated(0)
cpu = torch_arena.explain(json=True, device="cpu")
text = torch_arena.explain()
torch_arena.caching_allocator_delete(b)
print(json.dumps({"r": r, "pages": pages, "allocated": allocated, "cpu": cpu, "text": text}))
"""
    )
    r, pages = got["r"], got["pages"]
    MiB = 1 << 20
    # The freed 256 MiB block's pages hold nothing: idle, cached for any request (but for the
    # few it shares with the handle of the live block beside it).
    assert r["cached_bytes"] >= 240 * MiB
    assert r["cached_bytes"] == pages["idle_mapped_bytes"] + pages["pooled_bytes"]
    # The freed 8 MiB block's pages share a handle with the live 3 MiB block, which also leaves
    # 1 MiB of its second page free: reserved, but not for any request.
    assert r["unusable_bytes"] >= 8 * MiB + MiB
    assert r["unusable_bytes"] == pages["held_bytes"] + pages["in_use_bytes"] - got["allocated"]
    assert got["cpu"]["cached_bytes"] is None and got["cpu"]["unusable_bytes"] is None
    assert "reserved but unusable" in got["text"]


def test_gradients_zeroed_in_place_call_for_set_to_none():
    got = run(
        """
loss = model(x).square().mean()
loss.backward()
opt.step()
del loss
after_step = torch_arena.explain(json=True, device="cpu")["remedies"]
opt.zero_grad(set_to_none=False)
zeroed = torch_arena.explain(json=True, device="cpu")
opt.zero_grad()                                   # torch's default: set_to_none=True
freed = torch_arena.explain(json=True, device="cpu")
print(json.dumps({"after_step": after_step, "zeroed": zeroed, "freed": freed}))
"""
    )
    # Gradients a backward just made are needed by the step: no remedy.
    assert got["after_step"] == []
    z = got["zeroed"]
    assert [m["id"] for m in z["remedies"]] == ["set_to_none"]
    assert z["remedies"][0]["saves_bytes"] == z["categories"]["gradients"] > 0
    assert got["freed"]["categories"]["gradients"] == 0 and got["freed"]["remedies"] == []


def test_float32_activations_call_for_mixed_precision_estimated_at_half():
    got = run(
        """
x = torch.randn(2048, 64)                 # a batch whose activations outweigh the weights
loss = model(x).square().mean()
fp32 = torch_arena.explain(json=True, device="cpu")
del loss
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = model(x).square().mean()
bf16 = torch_arena.categorize(device="cpu")
print(json.dumps({"fp32": fp32, "bf16": bf16.bytes["activations"]}))
"""
    )
    fp32 = got["fp32"]
    (m,) = fp32["remedies"]
    assert m["id"] == "mixed_precision"
    assert m["saves_bytes"] == fp32["categories"]["activations"] // 2
    # Under autocast the same forward saves about half (measured: it also saves bfloat16
    # copies of the weights, which a batch this size outweighs).
    assert got["bf16"] < 0.6 * fp32["categories"]["activations"]


def test_by_module_names_the_owner_of_parameters_and_the_maker_of_activations():
    got = run(
        """
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 256)
        self.out = torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.out(torch.relu(self.proj(x)))

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return x

net = Net()
torch_arena.track_modules()
x = torch.randn(512, 64)
loss = net(x).square().mean()
r = torch_arena.explain(json=True, device="cpu")
# Ground truth for one module: what autograd saved inside layers.1.proj's forward.
packed = []
with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
    net.layers[1].proj(torch.randn(512, 64))
torch_arena.track_modules(False)
print(json.dumps({"r": r, "rows": {row["module"]: row for row in r["by_module"]}}))
"""
    )
    rows = got["rows"]
    r = got["r"]
    # Parameters by their owner: a Linear(64, 256) holds (64 * 256 + 256) floats.
    assert rows["Net.layers.0.proj"]["parameters"] == 4 * (64 * 256 + 256)
    assert rows["Net.layers.1.out"]["parameters"] == 4 * (256 * 64 + 64)
    assert sum(row.get("parameters", 0) for row in rows.values()) == r["categories"]["parameters"]
    # Activations by the module whose forward saved them: layers.1.out saves its input, the
    # (512, 256) output of relu, made in Block.forward; layers.0.proj saves x (512, 64).
    assert rows["Net.layers.0.proj"]["activations"] == 512 * 64 * 4
    assert rows["Net.layers.1.out"]["activations"] >= 512 * 256 * 4
    # What the loss's square and mean saved, outside every module: the (512, 64) output, and
    # the loss itself.
    assert rows["(outside modules)"]["activations"] == 512 * 64 * 4 + 4
    attributed = sum(row.get("activations", 0) for row in rows.values())
    assert attributed == r["categories"]["activations"]


BLOCKS = """
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 512)
        self.act = torch.nn.GELU()
        self.out = torch.nn.Linear(512, 64)

    def forward(self, x):
        return self.out(self.act(self.proj(x)))

class Net(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block() for _ in range(n)])

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return x

def saved_by_block(net, x):
    '''Ground truth, measured another way: the bytes autograd packs inside each block's forward
    (storages once, parameters left out), and each block's input.'''
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    seen, acts, inputs, current = set(), [0] * len(net.layers), [], [None]
    def pack(t):
        s = t.untyped_storage()
        if current[0] is not None and s.data_ptr() not in params and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            acts[current[0]] += s.nbytes()
        return t
    def enter(i, a):
        current[0] = i
        inputs.append(a[0].untyped_storage().nbytes())
    def leave():
        current[0] = None
    hooks = []
    for i, b in enumerate(net.layers):
        hooks.append(b.register_forward_pre_hook(lambda m, a, i=i: enter(i, a)))
        hooks.append(b.register_forward_hook(lambda m, a, o: leave()))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = net(x)
    for h in hooks:
        h.remove()
    return acts, inputs, out
"""


def test_checkpointing_names_the_repeated_blocks_and_estimates_what_it_saves():
    got = run(
        BLOCKS
        + """
net = Net(6)
x = torch.randn(256, 64)
torch_arena.track_modules()
loss = net(x).square().mean()
r = torch_arena.explain(json=True, device="cpu")
torch_arena.track_modules(False)
acts, inputs, _ = saved_by_block(net, torch.randn(256, 64))
print(json.dumps({"r": r, "acts": acts, "inputs": inputs}))
"""
    )
    r, acts, inputs = got["r"], got["acts"], got["inputs"]
    remedy = {m["id"]: m for m in r["remedies"]}["checkpointing"]
    truth = sum(acts) - sum(inputs) - max(acts)
    assert truth > 0
    assert abs(remedy["saves_bytes"] - truth) <= 0.1 * truth, (remedy, truth)
    assert "6 Block modules under Net.layers" in remedy["why"]


def test_no_checkpointing_remedy_without_module_hooks_and_it_says_so():
    got = run(
        BLOCKS
        + """
net = Net(4)
loss = net(torch.randn(256, 64)).square().mean()
r = torch_arena.explain(json=True, device="cpu")
print(json.dumps(r))
"""
    )
    assert "checkpointing" not in [m["id"] for m in got["remedies"]]
    assert any("checkpointing remedy cannot be judged" in w for w in got["warnings"])


def test_at_oom_mid_forward_the_batch_estimate_counts_what_is_still_to_come():
    # The report an out-of-memory error inside block 3 of 8 would write: the activations still to
    # come (blocks 4 to 7), the gradients and Adam's two state tensors per parameter not made yet.
    got = run(
        BLOCKS
        + """
from torch_arena import _explain
_explain.set_devices(lambda: [0])
net = Net(8)
opt = torch.optim.Adam(net.parameters())
x = torch.randn(128, 64)
reports = []
net.layers[3].register_forward_hook(
    lambda m, a, o: reports.append(_explain.report_at_oom(0, 1 << 20, "cpu")))
torch_arena.track_modules()
loss = net(x).square().mean()
torch_arena.track_modules(False)
acts, inputs, _ = saved_by_block(net, torch.randn(128, 64))
params = sum(p.untyped_storage().nbytes() for p in net.parameters())
# The prelude's model (its optimizer replaced by `opt` above): parameters and gradients to come.
prelude = sum(p.untyped_storage().nbytes() for p in model.parameters())
print(json.dumps({"r": reports[0], "acts": acts, "params": params, "prelude": prelude}))
"""
    )
    r, oom = got["r"], got["r"]["oom"]
    assert oom["request_bytes"] == 1 << 20 and oom["batch"] == 128
    # Fixed: the parameters, their gradients to come and Adam's exp_avg and exp_avg_sq.
    fixed_truth = 4 * got["params"] + 2 * got["prelude"] + r["categories"]["other"]
    assert oom["fixed_bytes"] == fixed_truth
    # Scaling: the whole forward's activations (measured) and the request.
    truth = sum(got["acts"]) + (1 << 20)
    assert abs(oom["scaling_bytes"] - truth) <= 0.05 * truth, (oom, truth)
    # 4 GiB is room for a batch far larger than 128: no smaller_batch remedy.
    assert "smaller_batch" not in [m["id"] for m in r["remedies"]]
    assert oom["limit_bytes"] == 4096 << 20


FRAGMENTED = """
import json, os, torch_arena
MiB = 1 << 20
ptrs = [torch_arena.caching_allocator_alloc(3 * MiB) for _ in range(80)]
for p in ptrs[::2]:
    torch_arena.caching_allocator_delete(p)
pages = torch_arena.pages()
allocated = torch_arena.memory_allocated()
try:
    torch_arena.caching_allocator_alloc(REQUEST * MiB)
except torch_arena.OutOfMemoryError as e:
    message = str(e)
files = sorted(os.listdir("."))
print(json.dumps({"message": message, "pages": pages, "allocated": allocated, "files": files}))
"""


def fragmented(tmp_path, request_mb: int, **env: str) -> dict:
    r = run_python(
        FRAGMENTED.replace("REQUEST", str(request_mb)),
        tmp_path,
        TORCH_ARENA_CONF="device:sim,sim_capacity_mb:256,explain:True",
        **env,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_at_oom_explain_adds_a_line_and_writes_its_report_beside_the_snapshot(tmp_path):
    # 40 live 3 MiB blocks, every other one freed: the freed ones' pages are pinned by their
    # neighbours' handles or shared with them. 120 MiB would fit in those, not without them.
    got = fragmented(tmp_path, 120)
    line = [ln for ln in got["message"].splitlines() if ln.startswith("torch-arena explain:")]
    assert len(line) == 1, got["message"]
    reports = [f for f in got["files"] if f.endswith(".explain.json")]
    snapshots = [f for f in got["files"] if f.endswith(".pickle")]
    assert len(reports) == 1
    assert reports[0] == snapshots[0].removesuffix(".pickle") + ".explain.json"
    assert reports[0] in line[0]
    report = json.loads((tmp_path / reports[0]).read_text())
    pages, MiB = got["pages"], 1 << 20
    unusable = pages["held_bytes"] + pages["in_use_bytes"] - got["allocated"]
    assert report["unusable_bytes"] == unusable
    assert report["oom"]["request_bytes"] == 120 * MiB
    top = report["remedies"][0]
    assert top["id"] == "fragmentation" and top["saves_bytes"] == unusable
    assert "top remedy fragmentation" in line[0]
    # The raw allocations are no tensor's: said as such.
    assert report["outside_tensors_bytes"] == got["allocated"]


def test_at_oom_a_request_larger_than_everything_is_not_called_fragmentation(tmp_path):
    got = fragmented(tmp_path, 1024)
    line = [ln for ln in got["message"].splitlines() if ln.startswith("torch-arena explain:")]
    assert len(line) == 1 and "fragmentation" not in line[0], got["message"]


def test_at_oom_without_explain_or_leaks_the_message_has_no_explain_line(tmp_path):
    r = run_python(
        FRAGMENTED.replace("REQUEST", "120"),
        tmp_path,
        TORCH_ARENA_CONF="device:sim,sim_capacity_mb:256",
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "torch-arena explain" not in got["message"]
    assert not [f for f in got["files"] if f.startswith("torch-arena-oom")]


def test_under_torch_compile_the_compiled_graphs_saved_tensors_are_activations():
    # A compiled forward is one custom autograd node (CompiledFunctionBackward) whose saved
    # tensors are `saved_tensors`, not `_saved_*`; compile also leaves FakeTensors (no memory)
    # in its caches, which must not count or warn.
    got = run(
        """
import warnings
cm = torch.compile(model)
cm(x)  # compiled here; the second call reuses it
out, loss, truth = saved_truth(cm)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    r = torch_arena.explain(json=True, device="cpu")
print(json.dumps({"activations": r["categories"]["activations"], "truth": truth,
                  "warned": [str(w.message)[:80] for w in caught]}))
"""
    )
    assert got["activations"] == got["truth"] > 32 * 256 * 4, got
    assert got["warned"] == []


def test_torch_arena_diff_compares_two_reports_by_category_and_module(tmp_path):
    # Two reports of one run, before and after an evaluation pass with grad enabled kept its
    # outputs past a step: `torch-arena diff` on the files shows held_graphs grew, by the bytes
    # explain() gives, and by module where they were made.
    import subprocess
    import sys
    import sysconfig
    from pathlib import Path

    got = run(
        f"""
torch_arena.track_modules()
torch_arena.step()
with open({str(tmp_path / "a.json")!r}, "w") as f:
    json.dump(torch_arena.explain(json=True, device="cpu"), f)
model.eval()
kept = [model(x) for _ in range(2)]
torch_arena.step()
b = torch_arena.explain(json=True, device="cpu")
with open({str(tmp_path / "b.json")!r}, "w") as f:
    json.dump(b, f)
print(json.dumps(b["categories"]))
"""
    )
    exe = Path(sysconfig.get_path("scripts")) / "torch-arena"
    if not exe.exists():
        exe = Path(sys.executable).parent / "torch-arena"
    out = subprocess.run(
        [str(exe), "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    grew = {r["key"]: r["delta_bytes"] for r in d["grew"]}
    assert grew["held_graphs"] == got["held_graphs"] > 0
    out = subprocess.run(
        [str(exe), "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--by", "module"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "Sequential.0" in out.stdout, out.stdout


def test_the_gpu_suites_explain_truth_holds_on_cpu_tensors_from_the_arena(tmp_path):
    # tests/gpu/workloads.py's explain_truth, run on the CPU with the simulated device serving
    # every CPU tensor (cpu_tensors:True): a real TinyLM with Adam, categories against ground
    # truths, no_grad on a planted evaluation loop, and the smaller_batch estimate written at a
    # real out-of-memory error within 25 % of the largest batch found by trying. The same
    # checks run on a GPU (scripts/gpu-check).
    import importlib.util
    import subprocess
    import sys

    path = REPO / "tests" / "gpu" / "workloads.py"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(
        TORCH_ARENA="1",
        TORCH_ARENA_CONF="device:sim,sim_backing:True,cpu_tensors:True,explain:True",
    )
    proc = subprocess.run(
        [sys.executable, str(path), "explain_truth", "--device", "cpu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT ") :])
    spec = importlib.util.spec_from_file_location("gpu_workloads", path)
    workloads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workloads)
    assert workloads.explain_truth_failures(result) == [], result
    assert result["oom_report"]["oom"]["batch_that_fits"] < result["too_big"]


def test_with_cpu_tensors_the_cpu_report_has_the_arenas_figures():
    r = run_python(
        """
import json, torch, torch_arena
a = torch.empty(3 << 20, dtype=torch.uint8)
b = torch.empty(5 << 20, dtype=torch.uint8)
del a
r = torch_arena.explain(json=True, device="cpu")
p = torch_arena.pages(0)
allocated = torch_arena.memory_allocated(0)
print(json.dumps({"r": r, "p": p, "allocated": allocated}))
""",
        REPO,
        TORCH_ARENA="1",
        TORCH_ARENA_CONF="device:sim,sim_backing:True,cpu_tensors:True",
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    rep, p = got["r"], got["p"]
    assert rep["categories"]["other"] == 5 << 20
    assert rep["cached_bytes"] == p["idle_mapped_bytes"] + p["pooled_bytes"]
    assert rep["unusable_bytes"] == p["held_bytes"] + p["in_use_bytes"] - got["allocated"]
    assert not any("does not serve this device" in w for w in rep["warnings"])
