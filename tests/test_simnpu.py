"""simnpu: the simulated Ascend NPU (a stand-in torch_npu on the CPU). Real processes, no mocks:
each test starts Python or `accelerate launch` with simnpu/site on PYTHONPATH, as a user would."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import ROOT, processes_mentioning, skip_outside_ci

pytest.importorskip("torch")
if shutil.which("g++") is None and not os.environ.get("CXX"):
    pytest.skip("simnpu builds a small C++ guard at first import: needs g++", allow_module_level=True)

SIMNPU = os.path.join(ROOT, "simnpu")
SITE = os.path.join(SIMNPU, "site")
NPU_SMI = os.path.join(SIMNPU, "bin", "npu-smi")
API = os.path.join(SIMNPU, "api", "torch_npu-{}.json")   # per release the stand-in presents (SIMNPU_TORCH_NPU)
RELEASES = ("2.9.0.post2", "2.14.0")
BIN = os.path.dirname(sys.executable)

GATHER = """\
import torch
from accelerate import Accelerator
accelerator = Accelerator()
x = torch.tensor([1, 2, 3], device=accelerator.device)
(gathered,) = accelerator.gather_for_metrics((x,))
accelerator.print(f'world={accelerator.num_processes}')
accelerator.print(f'device={gathered.device.type}')
accelerator.print(f'gathered={gathered.tolist()}')
print(f'rank={accelerator.process_index} type={accelerator.distributed_type} '
      f'backend={accelerator.state.backend} on={accelerator.device}', flush=True)
accelerator.end_training()
"""

TRAIN = """\
import os, sys, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
set_seed(0)
acc = Accelerator(mixed_precision="bf16")
seen = []
X = torch.randn(64, 8); Y = (X.sum(1) > 0).long()
dl = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt, dl = acc.prepare(model, opt, dl)
first = lambda: acc.unwrap_model(model)[0].weight.detach().cpu().clone()
w0 = first()
for x, y in dl:
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    acc.backward(loss); opt.step(); opt.zero_grad()
w1 = first()
acc.save_state(sys.argv[1]); acc.wait_for_everyone()
with torch.no_grad():
    acc.unwrap_model(model)[0].weight.add_(1.0)
acc.load_state(sys.argv[1])
print(f"rank={acc.process_index} world={acc.num_processes} type={acc.distributed_type} "
      f"wrapped={type(model).__name__} param={next(model.parameters()).device} out={out.dtype} "
      f"inner={seen[-1]} changed={not torch.equal(w0, w1)} restored={torch.equal(w1, first())} "
      f"files={sorted(os.listdir(sys.argv[1]))}", flush=True)
acc.end_training()  # the DDP model still holds the process group here
gloo = [t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().startswith(("pt_gloo", "gloo"))]
print(f"rank={acc.process_index} gloo_threads_after_end_training={len(gloo)}", flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_env(tmp, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIMNPU_", "ASCEND_", "ACCELERATE_", "MASTER_"))}
    env.update(PYTHONPATH=SITE, PATH=os.pathsep.join([BIN, os.path.join(SIMNPU, "bin"), env.get("PATH", "")]),
               SIMNPU_STATE_DIR=str(tmp / "state"))
    env.update(extra)
    return env


def run(cmd, env, cwd, timeout=150) -> subprocess.CompletedProcess:
    """Run in a new session; on timeout kill the whole group (the launcher and its ranks)."""
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"timed out after {timeout}s: {cmd}\n{out[-3000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, "")


def py(code, env, cwd, timeout=90) -> subprocess.CompletedProcess:
    return run([sys.executable, "-c", textwrap.dedent(code)], env, cwd, timeout)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("simnpu")
    (d / "gather_npu.py").write_text(GATHER)
    (d / "train_npu.py").write_text(TRAIN)
    # build the C++ guard once here, so the ranks of the first launch find it built
    r = py("import torch, torch_npu; print(torch_npu.__version__)", sim_env(d), d)
    assert r.returncode == 0, r.stdout
    yield d
    deadline = time.monotonic() + 15
    while running_in(d) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running_in(d) == [], "simulated ranks outlived their test"


def running_in(folder) -> list[int]:
    """Live processes whose working directory is ``folder`` (the launches run there)."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.cwd() == str(folder):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def test_quick_start_gather_launch_as_written(work):
    r = run(["accelerate", "launch", "--num_processes", "2", "gather_npu.py"],
            sim_env(work, ASCEND_RT_VISIBLE_DEVICES="0,1"), work)
    assert r.returncode == 0, r.stdout
    # the ranks share one pipe and their lines can interleave mid-line: look for text, not lines
    for want in ("world=2", "device=npu", "gathered=[1, 2, 3, 1, 2, 3]"):
        assert want in r.stdout, r.stdout
    for rank in (0, 1):
        assert f"rank={rank} type=DistributedType.MULTI_NPU backend=hccl on=npu:{rank}" in r.stdout, r.stdout
    assert "[Gloo]" not in r.stdout   # real HCCL prints no gloo chatter


def launch_gather(work, fault):
    return run(["accelerate", "launch", "--num_processes", "2", "--main_process_port", str(free_port()),
                "gather_npu.py"], sim_env(work, ASCEND_RT_VISIBLE_DEVICES="0,1", SIMNPU_FAULT=fault), work)


def test_fault_one_device_cannot_pass_for_two_ranks(work):
    r = launch_gather(work, "one_device")
    looks_right = ("world=2" in r.stdout and "gathered=[1, 2, 3, 1, 2, 3]" in r.stdout
                   and "on=npu:1" in r.stdout)
    assert not looks_right, r.stdout


def test_fault_allgather_local_does_not_gather(work):
    r = launch_gather(work, "allgather_local")
    assert "world=2" in r.stdout, r.stdout
    assert "gathered=[1, 2, 3, 1, 2, 3]" not in r.stdout, r.stdout


def test_bf16_ddp_training_with_save_and_load_state(work):
    ckpt = work / "ckpt"
    r = run(["accelerate", "launch", "--num_processes", "2", "--main_process_port", str(free_port()),
             "train_npu.py", str(ckpt)], sim_env(work, ASCEND_RT_VISIBLE_DEVICES="0,1"), work)
    assert r.returncode == 0, r.stdout
    for rank in (0, 1):
        # ranks share one pipe: a rank's line may be glued to the other's, so look for it anywhere
        found = re.search(rf"rank={rank} world=.*?files=\[[^\]]*\]", r.stdout)
        assert found, r.stdout
        line = found.group(0)
        assert "world=2 type=DistributedType.MULTI_NPU wrapped=DistributedDataParallel" in line
        assert f"param=npu:{rank} out=torch.float32 inner=torch.bfloat16" in line   # autocast inside
        assert "changed=True restored=True" in line
        assert "model.safetensors" in line and "optimizer.bin" in line
        # hccl's gloo transport is joined by destroy_process_group, not left running into interpreter shutdown
        # (where its threads made a rank abort at exit: "terminate called without an active exception")
        assert f"rank={rank} gloo_threads_after_end_training=0" in r.stdout, r.stdout


FSDP2 = """
import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

acc = Accelerator()
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=32)
model = LlamaForCausalLM(cfg)
full = sum(p.numel() * p.element_size() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, opt = acc.prepare(model, opt)
mine = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
x = torch.randint(0, 64, (2, 8), device=acc.device)
loss = model(input_ids=x, labels=x).loss
acc.backward(loss)
opt.step()
sd = acc.get_state_dict(model)  # DTensor.full_tensor: the functional all-gather, run by the hccl group
print(f"rank={acc.process_index} type={acc.distributed_type.name} backend={acc.state.backend} "
      f"bytes={mine}/{full} keys={len(sd)}", flush=True)
acc.end_training()
"""
FSDP2_CONFIG = """distributed_type: FSDP
num_processes: 2
mixed_precision: 'no'
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_state_dict_type: SHARDED_STATE_DICT
"""


def test_fsdp2_through_accelerate_shards_on_hccl(work):
    """FSDP2 needs what the real torch_npu has: a group name (DeviceMesh), torch.npu.Stream / Event, and the
    functional collectives routed to hccl. Each rank holds half the parameter bytes; get_state_dict gathers all of
    them on rank 0. (Without the three, fully_shard raised "ProcessGroup name not set".)"""
    (work / "fsdp2.py").write_text(FSDP2)
    (work / "fsdp2.yaml").write_text(FSDP2_CONFIG)
    r = run(["accelerate", "launch", "--config_file", "fsdp2.yaml", "--main_process_port", str(free_port()), "fsdp2.py"],
            sim_env(work, ASCEND_RT_VISIBLE_DEVICES="0,1"), work)
    assert r.returncode == 0, r.stdout[-3000:]
    for rank in (0, 1):
        found = re.search(rf"rank={rank} type=FSDP backend=hccl bytes=(\d+)/(\d+) keys=(\d+)", r.stdout)
        assert found, r.stdout[-3000:]
        mine, full, keys = map(int, found.groups())
        # the full state dict lands on rank 0 (9 tensors per layer, embed, norm, lm_head), the others get none
        assert mine * 2 == full and keys == (2 * 9 + 3 if rank == 0 else 0), found.group(0)


SINGLE = """
import torch
print("available", torch.npu.is_available(), "count", torch.npu.device_count(),
      "bf16", torch.npu.is_bf16_supported(), "name", torch.npu.get_device_name(0))
try:
    torch.ones(2, device="npu").to(torch.bfloat16)
    print("bf16 tensor ok")
except RuntimeError as e:
    print("bf16 tensor refused:", e)
"""


def test_data_assignment_takes_effect_like_on_a_real_device(work):
    """`param.data = other` (DeepSpeed, weight tying, many init helpers) swaps the values; the stand-in once kept
    the old ones silently, and ZeRO-2 trained wrong. Identity, grad flag and memory accounting follow."""
    r = py("""
        import torch
        m = torch.nn.Linear(2, 1).to("npu")
        w = m.weight
        m.weight.data = torch.full((1, 2), 5.0, device="npu")
        print("same_param", m.weight is w, "requires_grad", m.weight.requires_grad)
        print("out", round(m(torch.ones(1, 2, device="npu")).item() - m.bias.item(), 4))
        t = torch.zeros(2, device="npu"); t.data = torch.arange(4.0, device="npu")
        print("resized", t.tolist(), tuple(t.shape), "bytes", torch.npu.memory_allocated(0))
        t.data = torch.ones(2)  # CPU and npu tensors are both dense to torch_npu's _has_compatible_shallow_copy_type
        print("host taken:", t.device)
    """, sim_env(work), work)
    assert "same_param True requires_grad True" in r.stdout, r.stdout
    assert "out 10.0" in r.stdout, r.stdout  # 5 * 1 + 5 * 1
    # weight (8 bytes), bias (4) and t (16): the caching allocator pads each by 32 bytes and rounds it up to a
    # 512-byte block; the replaced 2-float tensor is no longer counted
    blocks = sum(-(-(n + 32) // 512) * 512 for n in (8, 4, 16))
    assert f"resized [0.0, 1.0, 2.0, 3.0] (4,) bytes {blocks}" in r.stdout, r.stdout  # arange: an out= resized
    assert "host taken: cpu" in r.stdout, r.stdout


def test_moving_a_module_already_there_keeps_its_weakrefs_like_a_real_device(work):
    """DeepSpeed's engine puts weakref.finalize on every parameter, then calls module.to(device): on the real
    backend that changes nothing; the stand-in once failed ("Cannot swap t1 because it has weakref"). A real
    move (CPU -> npu) still moves."""
    r = py("""
        import weakref, torch
        m = torch.nn.Embedding(4, 2).to("npu:0")
        w = m.weight
        keep = weakref.finalize(w, print, "finalized")
        m.to(torch.device("npu", 0))
        print("same", m.weight is w, m.weight.device)
        c = torch.nn.Linear(2, 2)
        c.to("npu:0")
        print("moved", c.weight.device)
    """, sim_env(work), work)
    assert "same True npu:0" in r.stdout and "moved npu:0" in r.stdout, r.stdout


def test_each_device_has_its_own_generator_like_a_card(work):
    """A card's random numbers come from its own generator: the device's state is saved and restored on its own,
    npu:1's stream is not npu:0's, and drawing on the device (dropout included) leaves the CPU's numbers alone.
    The stand-in once drew everything from the CPU generator, so restoring the CPU's RNG restored the NPU's."""
    r = py("""
        import torch
        torch.manual_seed(0)
        cpu_state = torch.get_rng_state()
        state = torch.npu.get_rng_state()
        a = torch.rand(3, device="npu").cpu()
        torch.nn.functional.dropout(torch.ones(8, device="npu"), 0.5)
        print("cpu untouched", torch.equal(cpu_state, torch.get_rng_state()))
        torch.set_rng_state(cpu_state)
        print("cpu restore restores npu", torch.equal(a, torch.rand(3, device="npu").cpu()))
        torch.npu.set_rng_state(state)
        print("npu restore", torch.equal(a, torch.rand(3, device="npu").cpu()))
        torch.npu.manual_seed_all(5); x = torch.rand(2, device="npu:0").cpu()
        torch.npu.manual_seed_all(5); torch.rand(2, device="npu:1"); y = torch.rand(2, device="npu:0").cpu()
        print("npu:1 apart", torch.equal(x, y))
    """, sim_env(work), work)
    out = r.stdout
    assert "cpu untouched True" in out and "cpu restore restores npu False" in out, out
    assert "npu restore True" in out and "npu:1 apart True" in out, out


# A compiler for CXX="env python fake_cxx.py": it notes its arguments and gives the guard the module built (the
# fixture's g++ build) as its output, so the test pays no second compile.
FAKE_CXX = """
import os, shutil, sys
args = sys.argv[1:]
open(os.environ["CXX_ARGV"], "w").write("\\n".join(args))
shutil.copy(os.environ["BUILT_LIB"], args[args.index("-o") + 1])
"""


def test_cxx_is_split_like_a_shell_splits_it(work, tmp_path):
    """CXX="ccache g++" (a wrapper, or a compiler with flags) builds the guard: it was run as one program name."""
    r = py("import torch, _simnpu._build as b; print(b.build())", sim_env(work), work)
    assert r.returncode == 0, r.stdout
    built = r.stdout.split()[-1]
    (tmp_path / "fake_cxx.py").write_text(FAKE_CXX)
    argv = tmp_path / "argv.txt"
    r = py("import torch; print('count', torch.npu.device_count())",
           sim_env(work, CXX=f"env {sys.executable} {tmp_path / 'fake_cxx.py'}", BUILT_LIB=built, CXX_ARGV=str(argv),
                   SIMNPU_CACHE_DIR=str(tmp_path / "cache")), work)
    assert "count 2" in r.stdout, r.stdout
    said = argv.read_text().split("\n")  # the build's own command line, after the three words of CXX
    assert "-shared" in said and any(a.endswith("simnpu_runtime.cpp") for a in said), said


def test_grad_scaler_takes_the_real_signature_dynamic_included(work):
    """torch.npu.amp.GradScaler(init_scale, growth_factor, backoff_factor, growth_interval, dynamic, enabled), as the
    real wheel's: dynamic=False keeps the scale, True grows it every growth_interval steps without overflow."""
    r = py("""
        import torch
        m = torch.nn.Linear(2, 1).to("npu"); o = torch.optim.SGD(m.parameters(), lr=0.1)
        for dynamic in (False, True):
            s = torch.npu.amp.GradScaler(8.0, 2.0, 0.5, 1, dynamic, True)
            for _ in range(3):
                s.scale(m(torch.ones(1, 2, device="npu")).sum()).backward(); s.step(o); s.update(); o.zero_grad()
            print("dynamic", dynamic, "scale", s.get_scale())
    """, sim_env(work), work)
    assert "dynamic False scale 8.0" in r.stdout and "dynamic True scale 64.0" in r.stdout, r.stdout  # 8 * 2**3


def test_autocast_keeps_softmax_norms_and_losses_in_float32(work):
    """autocast("npu", bf16): matmuls in bf16, softmax, layer_norm and the losses in float32 (torch_npu's lists, as
    CUDA's); the stand-in once ran them all in bf16."""
    r = py("""
        import torch, torch.nn.functional as F
        x, w = torch.randn(4, 8, device="npu"), torch.randn(3, 8, device="npu")
        with torch.autocast("npu", dtype=torch.bfloat16):
            h = F.linear(x, w)
            got = [h, torch.softmax(h, -1), F.log_softmax(h, -1), F.layer_norm(h, (3,)),
                   F.cross_entropy(h, torch.tensor([0, 1, 2, 0], device="npu")), F.mse_loss(h, h.detach()), torch.relu(h)]
            q = torch.randn(1, 2, 4, 8, device="npu")  # float32 query and key beside a bf16 value (transformers 5's
            got.append(F.scaled_dot_product_attention(q, q, q.bfloat16()))  # rotary leaves q, k in float32)
        print("dtypes", [str(t.dtype).split(".")[-1] for t in got])
    """, sim_env(work), work)
    assert ("dtypes ['bfloat16', 'float32', 'float32', 'float32', 'float32', 'float32', 'bfloat16', 'bfloat16']"
            in r.stdout), r.stdout


def test_310p_has_no_bf16_and_one_visible_card(work):
    r = py(SINGLE, sim_env(work, SIMNPU_SOC="Ascend310P3"), work)
    assert "available True count 2 bf16 False name Ascend310P3" in r.stdout, r.stdout
    assert "bf16 tensor refused:" in r.stdout and "DT_BFLOAT16" in r.stdout, r.stdout
    r = py(SINGLE, sim_env(work, ASCEND_RT_VISIBLE_DEVICES="0"), work)
    assert "available True count 1 bf16 True name Ascend910B4" in r.stdout, r.stdout
    assert "bf16 tensor ok" in r.stdout, r.stdout


def test_visible_devices_rules_and_device_api(work):
    code = """
    import os, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    ref.save_pretrained("llama", safe_serialization=True)
    with init_empty_weights():
        m = LlamaForCausalLM(cfg)
    dm = {"model.embed_tokens": "npu:0", "model.rotary_emb": "npu:0", "model.layers.0": "npu:0",
          "model.layers.1": "npu:1", "model.norm": "npu:1", "lm_head": "npu:1"}
    m = load_checkpoint_and_dispatch(m, "llama", device_map=dm)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(m(ids.to("npu:0")).logits.cpu(), ref(ids).logits)
    print("dispatch", sorted({str(p.device) for p in m.parameters()}))
    a0 = torch.npu.memory_allocated(1)
    x = torch.empty(1024, 1024, device="npu:1")
    grew = torch.npu.memory_allocated(1) - a0
    del x
    print("grew", grew, "freed", torch.npu.memory_allocated(1) == a0,
          "peak", torch.npu.max_memory_allocated(1) >= a0 + grew)
    torch.npu.reset_peak_memory_stats(1)
    free, total = torch.npu.mem_get_info(1)
    print("peak reset", torch.npu.max_memory_allocated(1) == a0, "hbm", total, free < total)
    torch.npu.manual_seed(7); torch.npu.manual_seed_all(7)
    s = torch.npu.get_rng_state(); a = torch.randn(4, device="npu"); torch.npu.set_rng_state(s)
    print("rng", torch.equal(a.cpu(), torch.randn(4, device="npu").cpu()))
    torch.npu.set_device(1); torch.npu.synchronize()
    print("current", torch.npu.current_device(), torch.zeros(1, device="npu").device)
    import torch_npu
    print("versions", torch_npu.__version__, torch.version.cann)
    """
    r = py(code, sim_env(work), work, timeout=120)
    assert "dispatch ['npu:0', 'npu:1']" in r.stdout, r.stdout
    block = -(-(4 * 1024 * 1024 + 32) // 512) * 512  # 1M floats, padded by 32 bytes, in 512-byte blocks
    assert f"grew {block} freed True peak True" in r.stdout, r.stdout
    assert f"peak reset True hbm {32 * 2**30} True" in r.stdout, r.stdout
    assert "rng True" in r.stdout and "current 1 npu:1" in r.stdout, r.stdout
    assert "versions 2.9.0.post2+simulated 9.1.0+simulated" in r.stdout, r.stdout  # no CANN was loaded
    probe = """
    import torch
    print("seen", torch.npu.is_available(), torch.npu.device_count(), flush=True)
    torch.ones(1, device="npu")
    """
    r = py(probe, sim_env(work, ASCEND_RT_VISIBLE_DEVICES="1,0"), work)   # not ascending
    assert "seen False 0" in r.stdout and r.returncode != 0, r.stdout
    r = py(probe, sim_env(work, ASCEND_RT_VISIBLE_DEVICES="0,5"), work)   # the host has cards 0 and 1
    assert "seen True 1" in r.stdout and r.returncode == 0, r.stdout + r.stderr  # the valid prefix counts, as on a host
    r = py(probe, sim_env(work, ASCEND_RT_VISIBLE_DEVICES="2"), work)   # no valid prefix at all
    assert "seen False 0" in r.stdout and "error code is 207004" in r.stderr + r.stdout and r.returncode != 0, r.stdout
    reread = """
    import os, torch
    before = torch.npu.device_count()
    os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "1"
    print("counts", before, torch.npu.device_count(), flush=True)
    torch.ones(1, device="npu")  # the first device use initialises the runtime: the count is fixed from here
    os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "0,1"
    print("after init", torch.npu.device_count())
    """
    r = py(reread, sim_env(work), work)
    assert "counts 2 1" in r.stdout and "after init 1" in r.stdout, r.stdout + r.stderr


def test_npu_smi_lists_a_live_holder_until_it_is_killed(work):
    env = sim_env(work)
    marker = str(work / "holder")
    p = subprocess.Popen([sys.executable, "-c", "import sys, time, torch; torch.ones(1, device='npu:1'); "
                          "print('ready', flush=True); time.sleep(120)", marker],
                         env=env, cwd=work, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        out = subprocess.run([NPU_SMI, "info"], env=env, capture_output=True, text=True, check=True).stdout
        assert "npu-smi 25.5.2 (simulated)" in out
        assert "| 0     910B4" in out and "| 1     910B4" in out
        assert "No running processes found in NPU 0" in out
        holder = [line for line in out.splitlines() if f"| {p.pid} " in line]
        assert holder and holder[0].startswith("| 1       1"), out  # NPU 1, chip 1, as the quick-start's host shows it
    finally:
        p.kill()
        p.wait()
    out = subprocess.run([NPU_SMI, "info"], env=env, capture_output=True, text=True, check=True).stdout
    assert str(p.pid) not in out and "No running processes found in NPU 1" in out, out
    bad = subprocess.run([NPU_SMI, "info", "-t", "board", "-i", "0"], env=env, capture_output=True, text=True)
    assert bad.returncode != 0
    assert processes_mentioning(marker) == []


@pytest.mark.parametrize("call", ["is_bf16_supported()", "get_device_name(0)", "get_device_properties(0)",
                                  "is_jit_compile_false()"])
def test_asking_the_card_initialises_it_like_torch_npu(work, call):
    """The real torch_npu initialises the NPU in these (_lazy_init): a fork after them cannot use the NPU."""
    r = py(f"""
        import os, torch
        torch.npu.{call}
        pid = os.fork()
        if pid == 0:
            try:
                torch.ones(1, device="npu"); print("child ok", flush=True)
            except RuntimeError as e:
                print("child refused:", "Cannot re-initialize NPU" in str(e), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
    """, sim_env(work), work)
    assert "child refused: True" in r.stdout, r.stdout


def test_fork_after_npu_init_is_refused_like_torch_npu(work):
    code = f"""
    import os, torch
    from accelerate import Accelerator, notebook_launcher

    def train():
        acc = Accelerator()
        g = acc.gather(torch.tensor([acc.process_index], device=acc.device))
        print(f"rank {{acc.process_index}} {{acc.distributed_type}} {{acc.device}} {{g.tolist()}}", flush=True)

    def child():
        pid = os.fork()
        if pid == 0:
            try:
                torch.ones(1, device="npu")
                print("child ok", torch.npu._is_in_bad_fork(), flush=True)
            except RuntimeError as e:
                print("child refused:", e, torch.npu._is_in_bad_fork(), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)

    notebook_launcher(train, num_processes=2, use_port="{free_port()}")   # forks 2 ranks
    child()                             # nothing initialised in this process yet: fine
    torch.npu.mem_get_info()            # initialises the NPU here
    child()
    try:
        notebook_launcher(train, num_processes=2, use_port="{free_port()}")
        print("launcher ok")
    except Exception as e:
        print("launcher failed:", type(e).__name__)
    """
    r = py(code, sim_env(work), work)
    assert "rank 0 DistributedType.MULTI_NPU npu:0 [0, 1]" in r.stdout, r.stdout
    assert "rank 1 DistributedType.MULTI_NPU npu:1 [0, 1]" in r.stdout, r.stdout
    assert "child ok False\n" in r.stdout, r.stdout
    assert ("child refused: Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, "
            "you must use the 'spawn' start method True\n") in r.stdout, r.stdout
    assert "launcher failed:" in r.stdout and "launcher ok" not in r.stdout, r.stdout
    assert r.stdout.count("Cannot re-initialize NPU in forked subprocess") >= 2, r.stdout   # the ranks too


# ---- honest API: the stand-in defines only what the real torch_npu (2.9.0.post2, or 2.14.0) defines --------
DUMP = """
import inspect, json, torch, torch_npu
import torch.npu.amp, torch.npu.random
out = {}
for name, mod in (("torch_npu", torch_npu), ("torch.npu", torch.npu), ("torch.npu.amp", torch.npu.amp),
                  ("torch.npu.random", torch.npu.random)):
    names = {}
    for n in dir(mod):
        if n.startswith("__") and n != "__all__":
            continue
        v = getattr(mod, n)
        if inspect.ismodule(v):
            names[n] = {"kind": "module"}
        elif inspect.isclass(v):
            names[n] = {"kind": "class"}
            if "__init__" in vars(v) and inspect.isfunction(vars(v)["__init__"]):
                names[n]["init"] = [
                    {"name": p.name, "kind": p.kind.name, "default": None if p.default is p.empty else repr(p.default)}
                    for p in list(inspect.signature(vars(v)["__init__"]).parameters.values())[1:]]
        elif n == "__all__":
            names[n] = {"kind": "value", "names": sorted(v)}
        elif inspect.isfunction(v):
            names[n] = {"kind": "function", "signature": [
                {"name": p.name, "kind": p.kind.name,
                 "default": None if p.default is p.empty else repr(p.default)}
                for p in inspect.signature(v).parameters.values()]}
        else:
            names[n] = {"kind": "value"}
    out[name] = names
print(json.dumps(out))
"""


def same_default(real: str | None, ours: str | None) -> bool:
    if real is None or ours is None:
        return real is ours
    try:
        return _constant(real) == _constant(ours)
    except (ValueError, SyntaxError):
        return real.replace(" ", "") == ours.replace(" ", "")


def _constant(text: str):
    """A default's value: a literal, or arithmetic on literals (the real GradScaler's `2.0 ** 16`)."""
    tree = ast.parse(text, mode="eval")
    if not all(isinstance(n, (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop,
                              ast.Tuple, ast.List, ast.Load)) for n in ast.walk(tree)):
        raise ValueError(text)
    return eval(compile(tree, "<default>", "eval"), {"__builtins__": {}})


def api_problems(dumped: dict, real: dict) -> list[str]:
    problems, release = [], real.get("version", "2.9.0.post2")
    for module, names in dumped.items():
        allowed = real["modules"].get(module)
        if allowed is None:
            problems.append(f"{module}: the real torch_npu has no such module")
            continue
        for name, ours in names.items():
            theirs = allowed.get(name)
            if theirs is None:
                problems.append(f"{module}.{name}: not in the real torch_npu {release}")
            elif theirs["kind"] == "module" and ours["kind"] != "module":
                problems.append(f"{module}.{name}: a module in the real torch_npu, here {ours['kind']}")
            elif name == "__all__":
                # the real list, less the names the stand-in does not define (`import *` would fail on those)
                want = sorted(set(theirs.get("names", [])) & set(names))
                if ours.get("names") != want:
                    problems.append(f"{module}.__all__: {ours.get('names')} != the real one's names defined here {want}")
            else:
                key = "signature" if ours["kind"] == "function" else "init"
                if theirs["kind"] == ours["kind"] and key in ours and key in theirs:
                    if not same_signature(ours[key], theirs[key]):
                        problems.append(f"{module}.{name}: {key} {ours[key]} != real {theirs[key]}")
    return problems


def same_signature(ours: list[dict], theirs: list[dict]) -> bool:
    return [(p["name"], p["kind"]) for p in ours] == [(p["name"], p["kind"]) for p in theirs] and all(
        same_default(x["default"], y["default"]) for x, y in zip(theirs, ours))


@pytest.mark.parametrize("release", RELEASES)
def test_stand_in_defines_only_names_the_real_wheel_has(work, release):
    r = py(DUMP, sim_env(work, SIMNPU_TORCH_NPU=release), work)
    assert r.returncode == 0, r.stdout
    dumped = json.loads(r.stdout.strip().splitlines()[-1])
    with open(API.format(release)) as f:
        real = json.load(f)
    assert api_problems(dumped, real) == []
    # and the check has teeth: a name the real wheel lacks, a class's other parameters, another __all__
    dumped["torch.npu"]["is_simulated"] = {"kind": "function", "signature": []}
    assert api_problems(dumped, real) == [f"torch.npu.is_simulated: not in the real torch_npu {release}"]
    del dumped["torch.npu"]["is_simulated"]
    scaler = dumped["torch.npu.amp"]["GradScaler"]
    scaler["init"] = [p for p in scaler["init"] if p["name"] != "dynamic"]
    dumped["torch.npu"]["__all__"]["names"].append("is_simulated")
    problems = api_problems(dumped, real)
    assert len(problems) == 2 and problems[0].startswith("torch.npu.__all__: ") and "GradScaler: init" in problems[1], problems


@pytest.mark.parametrize("release", RELEASES)
def test_committed_api_matches_the_real_wheel(tmp_path, release):
    wheels = tmp_path / "wheels"
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                          f"torch-npu=={release}", "-d", str(wheels)], capture_output=True, text=True)
    found = sorted(wheels.glob("*.whl")) if wheels.exists() else []
    if got.returncode != 0 or not found:
        skip_outside_ci(f"cannot download torch-npu=={release}: {got.stderr[-500:]}")
    out = tmp_path / "api.json"
    subprocess.run([sys.executable, os.path.join(SIMNPU, "tools", "derive_api.py"), "--version", release,
                    "--wheel", str(found[0]), "--out", str(out)], check=True, capture_output=True)
    with open(API.format(release)) as f:
        committed = json.load(f)
    derived = json.loads(out.read_text())
    committed.pop("wheel", None), committed.pop("wheel_sha256", None)
    derived.pop("wheel", None), derived.pop("wheel_sha256", None)
    assert derived == committed


def test_import_torch_alone_autoloads_the_stand_in(work):
    t0 = time.monotonic()
    r = py("import sys, torch; print('autoloaded', 'torch_npu' in sys.modules, torch.npu.device_count())",
           sim_env(work), work)
    assert "autoloaded True 2" in r.stdout, r.stdout
    assert time.monotonic() - t0 < 60


# ---- behaviour of the real torch_npu 2.9.0.post2 that Accelerate's own test suite runs into --------------
def test_npu_parameters_stay_parameters_so_offload_and_moves_work_like_a_card(work):
    """Items 1-4 of the stand-in's differences: an npu parameter is an nn.Parameter on device npu (it was a wrapper
    class, and accelerate's set_module_tensor_to_device, cpu/disk offload and npu:0 -> npu:1 raised), `.to("meta")`
    gives a meta tensor, CPU and npu tensors are shallow-copy compatible (`p.data = p.to("npu")`, FSDP1 wrapping),
    and `module.cpu()` / a move after a forward keep the Parameter objects an optimizer holds."""
    r = py("""
        import tempfile, torch
        from accelerate import cpu_offload, disk_offload, dispatch_model
        from accelerate.utils import set_module_tensor_to_device
        m = torch.nn.Linear(2, 2); w = m.weight
        m(torch.ones(1, 2)); m.to("npu")
        print("1 type", type(m.weight).__name__, m.weight.device, "kept", m.weight is w)
        set_module_tensor_to_device(m, "weight", "npu:1"); set_module_tensor_to_device(m, "bias", "cpu")
        print("1 set", type(m.weight).__name__, m.weight.device, m.bias.device)
        print("2 meta", torch.ones(2, device="npu").to("meta").device)
        p = torch.nn.Parameter(torch.ones(2)); p.data = p.to("npu")
        print("3 compatible", torch._has_compatible_shallow_copy_type(torch.ones(1), torch.ones(1, device="npu")),
              p.device)
        m = torch.nn.Linear(2, 2).to("npu"); w = m.weight; m.cpu()
        print("3 cpu kept", m.weight is w, m.weight.device)
        def net():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        ref, x = net()(torch.ones(1, 2)), torch.ones(1, 2, device="npu:0")
        with tempfile.TemporaryDirectory() as d:
            print("1 cpu_offload", torch.allclose(cpu_offload(net(), execution_device="npu:0")(x).cpu(), ref))
            print("1 disk_offload", torch.allclose(disk_offload(net(), d, execution_device="npu:0")(x).cpu(), ref))
        with tempfile.TemporaryDirectory() as d:
            out = dispatch_model(net(), {"0": "npu:0", "1": "cpu"}, main_device="npu:0", offload_dir=d)
            print("1 dispatch cpu", torch.allclose(out(x).cpu(), ref))
    """, sim_env(work), work)
    out = r.stdout
    assert "1 type Parameter npu:0 kept True" in out, out
    assert "1 set Parameter npu:1 cpu" in out, out
    assert "2 meta meta" in out and "3 compatible True npu:0" in out and "3 cpu kept True cpu" in out, out
    for name in ("cpu_offload", "disk_offload", "dispatch cpu"):
        assert f"1 {name} True" in out, out


def _format_size(n):  # the real caching allocator's format_size (NPUCachingAllocator.cpp)
    if n <= 1024:
        return f"{n} bytes"
    for unit, div in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
        if n <= div * 1024 or unit == "GiB":
            return f"{n / div:.2f} {unit}"


def test_a_card_runs_out_of_memory_past_the_fraction_with_the_real_message(work):
    """A 910B4 (32 GiB) limited to 64 MiB: a 40 MiB block fits, a second does not. The real allocator pads a request
    by 32 bytes, rounds it to 512 and reserves it as a segment rounded to 2 MiB; torch.OutOfMemoryError carries its
    message with these numbers. mem_get_info and memory_summary agree with what was allocated."""
    hbm, limit, n = 32 * 2**30, 64 * 2**20, 40 * 2**20 - 32
    block = -(-(n + 32) // 512) * 512
    seg = -(-block // (2 * 2**20)) * 2 * 2**20
    r = py(f"""
        import torch
        torch.npu.set_per_process_memory_fraction({limit / hbm!r})
        x = torch.empty({n}, dtype=torch.uint8, device="npu")
        print("allocated", torch.npu.memory_allocated(), "info", torch.npu.mem_get_info())
        try:
            torch.empty({n}, dtype=torch.uint8, device="npu")
        except torch.OutOfMemoryError as e:
            print("OOM", e)
        print("summary", "PyTorch NPU memory summary, device ID 0" in torch.npu.memory_summary(),
              "NPU OOMs: 1" in torch.npu.memory_summary(), torch.npu.memory_stats()["num_ooms"])
        for bad in (1, 1.5):
            try:
                torch.npu.set_per_process_memory_fraction(bad)
            except (TypeError, ValueError) as e:
                print("refused", type(e).__name__)
    """, sim_env(work), work)
    out = r.stdout
    assert f"allocated {block} info ({hbm - seg}, {hbm})" in out, out
    expected = (f"OOM NPU out of memory. Tried to allocate {_format_size(seg)} (NPU 0; {_format_size(hbm)} total "
                f"capacity; {_format_size(block)} already allocated; {_format_size(block)} current active; "
                f"{_format_size(hbm - seg)} free; {_format_size(limit)} allowed; {_format_size(seg)} reserved in total "
                "by PyTorch).If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
                "fragmentation.")
    assert expected in out, out
    assert "summary True True 1" in out and "refused TypeError" in out and "refused ValueError" in out, out


def test_alloc_conf_is_validated_like_the_real_allocator(work):
    """PYTORCH_NPU_ALLOC_CONF is read at the first allocation with the real allocator's messages; valid options
    run (only expandable_segments changes what the simulation does: tests/test_simnpu_versions.py)."""
    code = "import torch; torch.ones(1, device='npu'); print('allocated')"
    for conf, said in [("max_split_size_mb:128,garbage_collection_threshold:0.6", "allocated"),
                       ("bogus:1", "Unrecognized CachingAllocator option: bogus"),
                       ("max_split_size_mb:10", "CachingAllocator option max_split_size_mb too small, must be > 20"),
                       ("expandable_segments:yes", "Expected a single True/False argument for expandable_segments")]:
        r = py(code, sim_env(work, PYTORCH_NPU_ALLOC_CONF=conf), work)
        assert said in r.stdout, (conf, r.stdout)


def test_grad_scaler_keeps_one_overflow_flag_per_iteration_like_torch_npu(work):
    """Item 6: once an optimizer's gradients overflow, later optimizers of the iteration skip too (torch's own
    scaler decides per optimizer), and scale() refuses a CPU tensor."""
    r = py("""
        import torch
        a = torch.nn.Parameter(torch.ones(2, device="npu")); b = torch.nn.Parameter(torch.ones(2, device="npu"))
        oa, ob = torch.optim.SGD([a], lr=1), torch.optim.SGD([b], lr=1)
        s = torch.npu.amp.GradScaler()
        s.scale((a * float("inf")).sum() + b.sum()).backward()
        s.step(oa); s.step(ob); s.update()
        print("b kept", torch.equal(b.detach().cpu(), torch.ones(2)), "scale", s.get_scale())
        try:
            s.scale(torch.ones(1))
        except ValueError as e:
            print("cpu refused:", e)
    """, sim_env(work), work)
    assert "b kept True scale 32768.0" in r.stdout, r.stdout  # 2**16 backed off once by 0.5
    assert "cpu refused: Device type of outputs should be npu." in r.stdout, r.stdout


def test_streams_events_and_generators_behave_like_torch_npu(work):
    """Item 7: new streams come from a pool (not the default stream), a stream context switches to its card,
    events measure elapsed time and can be recorded on a stream, and torch.Generator(device="npu") works."""
    r = py("""
        import torch
        s1, s2 = torch.npu.Stream(), torch.npu.Stream()
        print("streams", s1.stream_id != 0, s2.stream_id not in (0, s1.stream_id), torch.npu.current_stream().stream_id)
        e1, e2 = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        e1.record(); torch.ones(8, device="npu").sum(); e2.record(); e2.synchronize()
        print("elapsed", e1.elapsed_time(e2) >= 0, type(s1.record_event(torch.npu.Event())).__name__)
        with torch.npu.stream(torch.npu.Stream(device=1)):
            print("in context", torch.npu.current_device(), torch.empty(1, device="npu").device)
        print("after", torch.npu.current_device())
        g = torch.Generator(device="npu").manual_seed(1); a = torch.rand(2, device="npu", generator=g)
        g.manual_seed(1); print("generator", g.device, torch.equal(a.cpu(), torch.rand(2, device="npu", generator=g).cpu()))
    """, sim_env(work), work)
    out = r.stdout
    assert "streams True True 0" in out and "elapsed True Event" in out, out
    assert "in context 1 npu:1" in out and "after 0" in out and "generator npu:0 True" in out, out


def test_minor_behaviours_of_torch_npu(work):
    """Item 8: synchronize("cpu") raises ValueError, a malformed TORCH_NPU_DEVICE_CAPABILITY warns and gives None,
    and an npu tensor cannot be made channels_last (ERR01007 on a card)."""
    r = py("""
        import os, warnings, torch
        try:
            torch.npu.synchronize("cpu")
        except ValueError as e:
            print("sync", e)
        os.environ["TORCH_NPU_DEVICE_CAPABILITY"] = "eight"
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            print("capability", torch.npu.get_device_capability(), "can't parse" in str(w[0].message))
        try:
            torch.ones(1, 2, 3, 3, device="npu").contiguous(memory_format=torch.channels_last)
        except RuntimeError as e:
            print("channels_last", e)
    """, sim_env(work), work)
    out = r.stdout
    assert "sync Expected a npu device, but got: cpu" in out and "capability None True" in out, out
    assert "channels_last NPU contiguous operator only supported contiguous memory format." in out, out


def test_torch_compile_compiles_npu_graphs(work):
    """Item 5: torch.compile's default backend (inductor) and aot_eager compile npu graphs, and
    Accelerator(dynamo_backend=...) runs. The wrapper-class stand-in compiled its CPU tensors inside, and a
    dispatched model failed ("Tensor device mismatch"); inductor has an npu backend here since this test."""
    r = py("""
        import torch
        from accelerate import Accelerator
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to("npu"); x = torch.ones(3, 4, device="npu")
        for backend in ("inductor", "aot_eager"):
            out = torch.compile(m, backend=backend, fullgraph=True)(x)
            print("compiled", backend, out.device, torch.allclose(out.cpu(), m(x).cpu()))
        acc = Accelerator(dynamo_backend="aot_eager")
        print("accelerate", type(acc.prepare(torch.nn.Linear(4, 2))).__name__, acc.device)
    """, sim_env(work), work, timeout=180)
    assert "compiled inductor npu:0 True" in r.stdout and "compiled aot_eager npu:0 True" in r.stdout, r.stdout
    assert "accelerate OptimizedModule npu" in r.stdout, r.stdout


# ---- the guard: every kernel of the stand-in gives the CPU's answer, or raises ------------------------------------
GUARD = r'''
import json, re, sys, torch
from torch.utils._pytree import tree_map, tree_flatten
from _simnpu._tensor import FP32, LOWER

# ops whose answer is not a function of their inputs (random, uninitialised memory, the device itself), which build
# no tensor from their inputs (factories: they are made on cpu by design), or which are internal to other subsystems
SKIP = re.compile(r"rand|bernoulli|dropout|normal|uniform|multinomial|poisson|exponential|geometric|cauchy|"
                  r"_standard_gamma|dirichlet|binomial|empty|_local_scalar|record_stream|sparse|mkldnn|quantiz|qparams|"
                  r"_fused|cudnn|miopen|nnpack|fbgemm|_foreach|_amp_|item|data_ptr|set_|resize|_cufft|_test|vulkan|"
                  r"xnnpack|_sobol|segment_reduce|_efficient|_flash|_cslt|mps|_assert|sym_|_pin|pin_memory|is_pinned|"
                  r"_backward|lift|batch_dim|_dual|_vmap|_functorch|get_device|Generator|_shape_as_tensor|aten::cpu$|"
                  r"_make_dep_token|_weight_norm_interface|_compute_linear_combination")   # the last: uninitialised memory for these inputs
KIND = {"Tensor": "T", "Scalar": 2, "int": 1, "SymInt": 1, "bool": False, "float": 0.5, "int[]": [1],
        "SymInt[]": [1], "int[1]": [1], "int[2]": [1, 1]}


def same(a, b, dev):
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or b.device.type != dev:
            return f"want a tensor on {dev}, got {getattr(b, 'device', type(b))}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{b.dtype}{tuple(b.shape)}, want {a.dtype}{tuple(a.shape)}"
        a, b = a.detach().cpu(), b.detach().cpu()
        ok = (torch.allclose(a, b, equal_nan=True) if a.is_floating_point() or a.is_complex() else torch.equal(a, b))
        return None if ok else "other values"
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return f"{b!r}, want {a!r}"
        return next((p for x, y in zip(a, b) if (p := same(x, y, dev))), None)
    return None if a == b or (a != a and b != b) else f"{b!r}, want {a!r}"


def spec_of(schema):
    spec = []
    for a in schema.arguments:
        if a.kwarg_only:
            if a.alias_info is not None and a.alias_info.is_write and str(a.type) == "Tensor":
                spec.append((a.name, "OUT"))
            elif not a.has_default_value():
                return None
            continue
        if a.has_default_value():
            break
        if str(a.type) not in KIND:
            return None
        spec.append((None, KIND[str(a.type)]))
    return spec if any(v in ("T", "OUT") for _, v in spec) else None


def build(spec, dev, shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(len(spec))
    args, kw = [], {}
    for name, v in spec:
        if v == "OUT":
            kw[name] = torch.empty(0, dtype=dtype).to(dev)
        else:
            args.append(torch.randn(*shape, generator=g).to(dtype).to(dev) if v == "T" else v)
    return args, kw


def check(name, call, spec, shape=(3, 4), dtype=torch.float32):
    """Run on cpu twice (an op whose cpu answer varies is not checked) and on npu; compare the result, the
    inputs (in-place ops) and the out= tensors. An npu error is allowed (the op raises); a cpu error skips."""
    try:
        a1, k1 = build(spec, "cpu", shape, dtype); w1 = call(*a1, **k1)
        a2, k2 = build(spec, "cpu", shape, dtype); w2 = call(*a2, **k2)
        if same((w1, a1, k1), (w2, a2, k2), "cpu"):
            return None
    except Exception:
        return None
    try:
        a3, k3 = build(spec, "npu", shape, dtype); g3 = call(*a3, **k3)
    except Exception:
        return "raised"
    try:
        problem = same((w1, a1, list(k1.values())), (g3, a3, list(k3.values())), "npu")
        for _ in range(4 if problem else 0):   # a mismatch: is the cpu answer itself stable (no uninitialised memory)?
            a4, k4 = build(spec, "cpu", shape, dtype)
            if same((w1, a1, k1), (call(*a4, **k4), a4, k4), "cpu"):
                return None
        return problem or "same"
    except Exception as e:
        return f"could not compare: {e}"


report = {"ran": 0, "raised": 0, "wrong": {}}
def note(name, verdict):
    if verdict is None:
        return
    report["ran"] += 1
    if verdict == "raised":
        report["raised"] += 1
    elif verdict != "same":
        report["wrong"][name] = verdict

# 1. every aten op the boxed CPU fallback (and the npu kernels) may serve, with random inputs
for s in torch._C._jit_get_all_schemas():
    name = f"{s.name}.{s.overload_name or 'default'}"
    if not s.name.startswith("aten::") or SKIP.search(s.name) or (spec := spec_of(s)) is None:
        continue
    op = getattr(getattr(torch.ops.aten, s.name[6:]), s.overload_name or "default")
    note(name, check(name, op, spec))

# 2. the kernels the stand-in registers itself for PrivateUse1 (C++ and Python), each with a sample of its own;
# a kernel registered later without a sample here is reported
t = lambda dev: torch.arange(12.0).view(3, 4).to(dev)
SAMPLES = {
    "aten::empty.memory_format": lambda d: torch.empty(3, 4, device=d).shape,
    "aten::empty_strided": lambda d: torch.empty_strided((3, 4), (1, 3), device=d).stride(),
    "aten::_copy_from": lambda d: [t(d).to(torch.float16), t("cpu").to(d), t(d).to("cpu").to(d)],
    "aten::_copy_from_and_resize": lambda d: torch.ops.aten._copy_from_and_resize(t(d), torch.empty(0, device=d))
    if d != "cpu" else t(d),
    "aten::_has_compatible_shallow_copy_type": lambda d: torch._has_compatible_shallow_copy_type(t(d), t("cpu")),
    "aten::_reshape_alias": lambda d: torch.ops.aten._reshape_alias(t(d), [4, 3], [3, 1]),
    "aten::as_strided": lambda d: t(d).as_strided((2, 2), (4, 1), 1),
    "aten::view": lambda d: [t(d).view(4, 3), t(d).view(torch.int32)],
    "aten::resize_": lambda d: t(d).resize_(2, 3),
    "aten::set_": lambda d: t(d).set_(),
    "aten::set_.source_Tensor": lambda d: torch.empty(0, device=d).set_(t(d)),
    "aten::set_.source_Storage": lambda d: torch.empty(0, device=d).set_(t(d).untyped_storage()),
    "aten::set_.source_Storage_storage_offset": lambda d: torch.empty(0, device=d).set_(
        t(d).untyped_storage(), 4, (2, 2), (1, 2)),
    "aten::record_stream": lambda d: [x := t(d), x.record_stream(torch.npu.current_stream()) if d != "cpu" else None][0],
    "simnpu::host_alias": lambda d: torch.ops.simnpu.host_alias(t(d)).to(d) if d != "cpu" else t(d),
}
registered = sorted(n for n in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
                    if n.split("::")[0] in ("aten", "simnpu"))
report["unsampled"] = [n for n in registered if n not in SAMPLES]
for name in registered:
    if name in SAMPLES:
        try:
            got = SAMPLES[name]("npu")
        except Exception:
            note(name, "raised"); continue
        problem = same(SAMPLES[name]("cpu"), got, "npu") if not isinstance(got, (torch.Size, tuple, bool)) else (
            None if got == SAMPLES[name]("cpu") or name == "aten::_has_compatible_shallow_copy_type" else "other")
        note(name, problem or "same")

# 3. the autocast kernels: under autocast("npu", bf16), the cpu op on inputs cast as the stand-in's lists say
def autocast_call(op, cast):
    def call(*args, **kw):
        if args[0].device.type == "npu":
            with torch.autocast("npu", dtype=torch.bfloat16):
                return op(*args, **kw)
        c = lambda x: x.to(cast) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        return op(*tree_map(c, args), **tree_map(c, kw))
    return call
autocast_ops = torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1")
report["autocast_checked"] = []
for s in torch._C._jit_get_all_schemas():
    qual = f"{s.name}.{s.overload_name}" if s.overload_name else s.name
    if qual not in autocast_ops or (spec := spec_of(s)) is None:
        continue
    short = qual[6:]
    cast, dtype = (torch.bfloat16, torch.float32) if short in LOWER else (torch.float32, torch.bfloat16)
    op = getattr(getattr(torch.ops.aten, s.name[6:]), s.overload_name or "default")
    for shape in ((4, 4), (2, 4, 4)):
        v = check(qual, autocast_call(op, cast), spec, shape, dtype)
        if v is not None:
            note("autocast " + qual, v)
            report["autocast_checked"].append(qual)
            break
print("GUARD " + json.dumps(report))
'''


def test_every_kernel_gives_the_cpu_answer_or_raises(work):
    """Property-style guard: every aten op (the boxed CPU fallback), each kernel the stand-in registers for npu
    (a sample each), and its autocast kernels, with random inputs: the npu result equals the cpu one, or the op
    raises. A kernel registered later without a sample here fails the test (``unsampled``)."""
    r = py(GUARD, sim_env(work), work, timeout=240)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("GUARD ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:]
    report = json.loads(lines[0][6:])
    assert report["wrong"] == {}, report["wrong"]
    assert report["unsampled"] == [], f"kernels without a sample in GUARD: {report['unsampled']}"
    assert report["ran"] - report["raised"] > 500, report   # the sweep really compared (about 700 ops here)
    assert len(report["autocast_checked"]) >= 20, report


def test_import_order_pinned_memory_reprs_and_retries_like_torch_npu(work):
    """torch_npu imported before torch (the real one switches torch's backend autoload off around `import torch`);
    pin_memory() is pinned and a non-blocking npu->cpu copy lands in pinned memory (a blocking one does not);
    Stream / Event reprs name torch_npu.npu; memory_stats counts num_alloc_retries (the cache released, retried)."""
    r = py("import torch_npu, torch; print('first', torch.npu.device_count(), torch.ones(1, device='npu').device)",
           sim_env(work, SIMNPU_CARDS="3"), work)
    assert r.returncode == 0 and "first 3 npu:0" in r.stdout, r.stdout[-2000:]
    r = py("""
        import torch
        a = torch.ones(4); n = torch.arange(4.0, device="npu")
        print("pinned", a.is_pinned(), a.pin_memory().is_pinned(), n.to("cpu", non_blocking=True).is_pinned(),
              n.cpu().is_pinned())
        e = torch.npu.Event(); before = repr(e); e.record()
        print("repr", torch.npu.Stream(device=1), "|", before, "|", e)
        torch.npu.set_per_process_memory_fraction(0.002)   # 65 MiB of 32 GiB
        x = torch.empty(8 * 2**20, device="npu"); del x     # 32 MiB reserved, then cached
        y = torch.empty(10 * 2**20, device="npu")           # 40 MiB more only after the cache is released
        print("retries", torch.npu.memory_stats()["num_alloc_retries"])
    """, sim_env(work), work)
    assert "pinned False True True False" in r.stdout, r.stdout[-2000:]
    assert re.search(r"repr <torch_npu\.npu\.Stream device=npu:1 npu_stream=0x[0-9a-f]+> \| "
                     r"<torch_npu\.npu\.Event uninitialized> \| <torch_npu\.npu\.Event 0x[0-9a-f]+>", r.stdout), r.stdout
    assert "retries 1" in r.stdout, r.stdout[-2000:]


def test_names_real_code_calls_are_simulated_or_refused_by_name(work):
    """Issue 49 item 4: each name with the real signature; simulated where a lesson or library can see the
    behaviour (a format cast keeps the values and is remembered), else an error that names it."""
    r = py("""
        import torch, torch_npu
        t = torch.arange(6.0, device="npu").view(2, 3)
        nz = torch_npu.npu_format_cast(t, 29)
        print("format", torch_npu.get_npu_format(t), torch_npu.get_npu_format(nz), torch.equal(nz.cpu(), t.cpu()),
              torch_npu.get_npu_format(torch_npu.empty_with_format((2, 2), device="npu", acl_format=29)))
        print("legacy", torch.npu.FloatTensor(2, 3).device, torch.npu.DoubleTensor([1, 2]).dtype,
              isinstance(t, torch.npu.FloatTensor), isinstance(t.cpu(), torch.npu.FloatTensor))
        torch.npu.set_autocast_enabled(True); torch.npu.set_autocast_dtype(torch.bfloat16)
        print("autocast", torch.is_autocast_enabled("npu"), torch.get_autocast_dtype("npu"))
        torch.npu.set_autocast_enabled(False)
        before = torch.npu.memory_allocated(); p = torch.npu.caching_allocator_alloc(4096)
        held = torch.npu.memory_allocated() - before; torch.npu.caching_allocator_delete(p)
        print("raw", torch.npu.get_allocator_backend(), held, torch.npu.memory_allocated() - before)
        print("misc", torch.UntypedStorage(4).npu().device, len(str(torch.npu.get_device_properties(1).uuid)),
              torch_npu.distributed.is_hccl_available(), torch_npu.utils.get_cann_version())
        class Twice(torch.autograd.Function):
            @staticmethod
            @torch.npu.amp.custom_fwd(cast_inputs=torch.float32)
            def forward(ctx, x):
                return x * 2
            @staticmethod
            @torch.npu.amp.custom_bwd
            def backward(ctx, g):
                return g
        with torch.autocast("npu", dtype=torch.bfloat16):
            print("custom_fwd", Twice.apply(torch.ones(2, device="npu", dtype=torch.bfloat16)).dtype)
        for call in (lambda: torch_npu.npu_prompt_flash_attention(t, t, t), lambda: torch.npu._set_rng_state_offset(1),
                     lambda: torch_npu._C._npu_getDeviceCount()):
            try:
                call()
            except (NotImplementedError, AttributeError) as e:
                print("refused", str(e).split(" is not simulated")[0])
    """, sim_env(work), work)
    out = r.stdout
    assert "format 2 29 True 29" in out and "legacy npu:0 torch.float64 True False" in out, out[-3000:]
    assert "autocast True torch.bfloat16" in out and "raw native 4608 0" in out, out[-3000:]
    assert "misc npu:0 36 True 9.1.0+simulated" in out and "custom_fwd torch.float32" in out, out[-3000:]
    for name in ("torch_npu.npu_prompt_flash_attention (Ascend's fused kernel)", "torch.npu._set_rng_state_offset",
                 "torch_npu._C._npu_getDeviceCount"):
        assert f"refused {name}" in out, out[-3000:]
