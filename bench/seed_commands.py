"""The seed's commands, adapted to this machine the way the notebooks adapt them.

The seed (``shared/seed/000_*.txt``, the Ascend quick-start) has 12 checked commands and
3 ``#test-setup`` blocks whose output later commands ``load``. ``commands(info)`` returns
them in the seed's order as shell text, ready for ``bash -c`` in a scratch working
directory. What changes from the seed, and why (the same choices notebooks 00-03 make):

- 2-process launches: env + flags from ``info.plan(2)`` (CPU-only host:
  ``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 ...``; NPU:
  ``ASCEND_RT_VISIBLE_DEVICES=0,1 accelerate launch --multi_gpu --num_processes 2 ...``),
  plus ``--main_process_port`` on a free port (launches of other jobs on the same machine
  would otherwise collide on 29500);
- the worker scripts end with ``accelerator.end_training()`` (without it gloo aborts a
  rank at exit about 1 time in 4 on CPU; notebooks 01/02 do the same);
- ``check-torch`` asks ``torch.cuda`` without ``torch_npu`` where there is no NPU;
- ``acc-install-binary`` is ``pip install accelerate`` without the seed's mirror (already
  satisfied: nothing is downloaded); ``acc-install-source`` needs the network and is
  skipped, as notebook 00 skips it without ``accelerate_ref``;
- the checkpoint goes to the scratch dir, not ``/tmp/fake-llama-dispatch``;
- the dispatch ``device_map`` is notebook 03's: two accelerators -> the seed's split,
  one -> device 0 + ``cpu``, none -> ``cpu`` + ``disk`` (with an ``offload_folder``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

# Which notebook covers which seed command (README's table).
NOTEBOOKS = {
    "00_environment": ("check-py", "check-torch", "acc-install-binary", "acc-install-source", "acc-env"),
    "01_training": ("setup:script_path", "acc-launch", "acc-train-single", "acc-prepare", "acc-launch-bf16"),
    "02_distributed_eval": ("setup:gather_script_path", "acc-gather-multi"),
    "03_big_model_inference": ("acc-empty-weights", "setup:dispatch_ckpt", "acc-dispatch"),
}

LLAMA_CONFIG = """config = LlamaConfig(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=20,
    num_attention_heads=8,
    max_position_embeddings=64,
)"""


@dataclass
class Command:
    id: str  # the seed's check id, or setup:<store name>
    notebook: str  # the notebook stem that covers it
    text: str = ""  # shell text for `bash -c`; may hold {name} placeholders filled from setups
    store: str = ""  # setup blocks: the name their last output line is stored under
    expected: str = ""  # the seed's expected block, adapted to this platform ('' = none)
    skip: str = ""  # why it is not run here ('' = it runs)
    adapted: list[str] = field(default_factory=list)  # what differs from the seed's text


def notebook_of(cid: str) -> str:
    for nb, ids in NOTEBOOKS.items():
        if cid in ids:
            return nb
    raise KeyError(cid)


def _launch(plan, mixed_precision: str | None, port: int, path_var: str) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env.items())
    flags = list(plan.flags)
    if mixed_precision is not None:
        flags += ["--mixed_precision", mixed_precision]
    flags += ["--main_process_port", str(port)]
    return (env + " " if env else "") + "accelerate launch " + " ".join(flags) + " {" + path_var + "}"


def _dispatch_map(info) -> tuple[str, str, str]:
    """(first, second, case) exactly as notebook 03 decides them."""
    n_accel = info.count if info.kind != "cpu" else 0
    if n_accel >= 2:
        return f"{info.kind}:0", f"{info.kind}:1", "the seed's split across two devices"
    if n_accel == 1:
        return f"{info.kind}:0", "cpu", "device 0 + second half offloaded to CPU RAM"
    return "cpu", "disk", "no accelerator: first half in CPU RAM, second half offloaded to disk"


def _shown_device(target: str, main_is_accelerator: bool) -> str:
    if target == "disk" or (target == "cpu" and main_is_accelerator):
        return "meta"  # offloaded: a placeholder until forward
    return target


def commands(info, port=None) -> list[Command]:
    """The seed's commands for this machine. ``port()`` gives a free rendezvous port per launch."""
    if port is None:
        from nbtools import free_port as port
    plan = info.plan(2)
    kind = info.kind
    out: list[Command] = []

    def add(cid: str, **kw) -> None:
        out.append(Command(cid, notebook_of(cid), **kw))

    add("check-py", text="python --version", expected="Python 3.xxx")

    if kind == "npu":
        torch_cmd = (
            'python -c "import torch, torch_npu; print(\'torch=\', torch.__version__); '
            "print('torch_npu=', torch_npu.__version__); print('is_available:', torch.npu.is_available()); "
            "print('count:', torch.npu.device_count())\""
        )
        torch_exp = f"torch= xxx\ntorch_npu= xxx\nis_available: True\ncount: {info.count}"
        torch_adapted = []
    else:
        torch_cmd = (
            'python -c "import torch; print(\'torch=\', torch.__version__); '
            "print('is_available:', torch.cuda.is_available()); print('count:', torch.cuda.device_count())\""
        )
        torch_exp = f"torch= xxx\nis_available: {kind == 'cuda'}\ncount: {info.count if kind == 'cuda' else 0}"
        torch_adapted = ["no NPU: asks torch.cuda, does not import torch_npu"]
    add("check-torch", text=torch_cmd, expected=torch_exp, adapted=torch_adapted)

    add(
        "acc-install-binary",
        text="pip install --disable-pip-version-check accelerate\n"
        "python -c \"import accelerate; print('accelerate', accelerate.__version__)\"",
        expected="...\naccelerate xxx",
        adapted=["pip instead of uv pip, no mirror index (already satisfied: no download)"],
    )
    add(
        "acc-install-source",
        skip="needs the network (git clone from GitHub); notebook 00 skips it too unless accelerate_ref is set",
    )
    visible = {k: v for k, v in plan.env.items() if k == info.visible_var}
    env_prefix = " ".join(f"{k}={v}" for k, v in visible.items())
    accel_name = {"npu": "NPU", "cuda": "CUDA", "cpu": "N/A"}[kind]
    add(
        "acc-env",
        text=(env_prefix + " " if env_prefix else "") + "accelerate env",
        expected=f"...\n- PyTorch accelerator: {accel_name}\n...",
        adapted=[] if kind == "npu" else [f"no ASCEND_RT_VISIBLE_DEVICES ({kind})"],
    )

    train_script = """import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator


def build():
    # Toy regression: y = 2 * x + 1, learned by a single linear layer.
    x = torch.linspace(-1.0, 1.0, 64).unsqueeze(1)
    y = 2 * x + 1 + 0.05 * torch.randn_like(x)
    ds = TensorDataset(x, y)
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    model = nn.Linear(1, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    return loader, model, optim


def main():
    accelerator = Accelerator()
    loader, model, optim = build()
    model, optim, loader = accelerator.prepare(model, optim, loader)
    loss_fn = nn.MSELoss()
    for step, (xb, yb) in enumerate(loader):
        preds = model(xb)
        loss = loss_fn(preds, yb)
        accelerator.backward(loss)
        optim.step()
        optim.zero_grad()
        # 3 steps are enough to drive loss below 0.5 on this toy task.
        if step == 2:
            break
    # accelerator.print only emits on the main process, so the #test-result
    # below sees exactly one line regardless of --num_processes.
    accelerator.print(
        f"device={accelerator.device.type} "
        f"final_loss={loss.item():.4f}"
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
"""
    add(
        "setup:script_path",
        store="script_path",
        text=f"cat > train_npu.py <<'PY'\n{train_script}PY\necho \"${{PWD}}/train_npu.py\"",
        adapted=["ends with accelerator.end_training() (as notebook 01's worker)"],
    )
    dev = plan.device
    launch_adapted = [f"env + flags from info.plan(2): {plan.note}", "--main_process_port on a free port"]
    add(
        "acc-launch",
        text=_launch(plan, "no", port(), "script_path"),
        expected=f"...\ndevice={dev} final_loss=xxx\n...",
        adapted=launch_adapted,
    )
    single = kind  # the seed's Accelerator() picks the accelerator, or the CPU
    add(
        "acc-train-single",
        text='''python -c "
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
x = torch.linspace(-1.0, 1.0, 64).unsqueeze(1)
y = 2 * x + 1 + 0.05 * torch.randn_like(x)
ds = TensorDataset(x, y)
loader = DataLoader(ds, batch_size=8, shuffle=True)
model = nn.Linear(1, 1)
optim = torch.optim.SGD(model.parameters(), lr=0.1)
accelerator = Accelerator()
model, optim, loader = accelerator.prepare(model, optim, loader)
loss_fn = nn.MSELoss()
for step, (xb, yb) in enumerate(loader):
    preds = model(xb)
    loss = loss_fn(preds, yb)
    accelerator.backward(loss)
    optim.step()
    optim.zero_grad()
    if step == 2:
        break
print(f'device={accelerator.device.type} final_loss={loss.item():.4f}')
"''',
        expected=f"...\ndevice={single} final_loss=xxx",
    )
    add(
        "acc-prepare",
        text='''python -c "
import torch
from torch import nn
from accelerate import Accelerator
accelerator = Accelerator()
model = nn.Linear(1, 1)
prepared = accelerator.prepare(model)
# prepare moves the model to the device, NOT your inputs --
# data tensors must be placed explicitly.
x = torch.tensor([[0.5]], device=accelerator.device)
y = prepared(x)
print(f'device={y.device.type}')
print(f'shape={list(y.shape)}')"''',
        expected=f"...\ndevice={single}\nshape=[1, 1]",
    )
    add(
        "acc-launch-bf16",
        text=_launch(plan, "bf16", port(), "script_path"),
        expected=f"...\ndevice={dev} final_loss=xxx\n...",
        adapted=launch_adapted,
    )

    gather_script = """import torch
from accelerate import Accelerator

accelerator = Accelerator()
x = torch.tensor([1, 2, 3], device=accelerator.device)
(gathered,) = accelerator.gather_for_metrics((x,))
# accelerator.print only emits on the main process -- without this guard
# the #test-result below would see two copies of each line.
accelerator.print(f'world={accelerator.num_processes}')
accelerator.print(f'device={gathered.device.type}')
accelerator.print(f'gathered={gathered.tolist()}')
accelerator.end_training()
"""
    add(
        "setup:gather_script_path",
        store="gather_script_path",
        text=f"cat > gather_npu.py <<'PY'\n{gather_script}PY\necho \"${{PWD}}/gather_npu.py\"",
        adapted=["ends with accelerator.end_training() (as notebook 02's worker)"],
    )
    add(
        "acc-gather-multi",
        text=_launch(plan, None, port(), "gather_script_path"),
        expected=f"...\nworld=2\ndevice={dev}\ngathered=[1, 2, 3, 1, 2, 3]\n...",
        adapted=launch_adapted,
    )

    add(
        "acc-empty-weights",
        text='''python -c "
from transformers import LlamaConfig, LlamaForCausalLM
from accelerate import init_empty_weights
# Inline config: 1 layer / 1 head / hidden=64 -- no hub download.
config = LlamaConfig(
    vocab_size=32,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=1,
    max_position_embeddings=64,
)
with init_empty_weights():
    model = LlamaForCausalLM(config)
n_params = sum(p.numel() for p in model.state_dict().values())
first_dev = next(model.parameters()).device
print(f'empty_model_params={n_params}')
print(f'device={first_dev}')
"''',
        expected="...\nempty_model_params=xxx\ndevice=meta",
    )
    add(
        "setup:dispatch_ckpt",
        store="dispatch_ckpt",
        text=f'''python -c "
import os, torch, gc
from transformers import LlamaConfig, LlamaForCausalLM
from accelerate import init_empty_weights
# 20 layers / hidden=512: about 85M parameters
{LLAMA_CONFIG}
with init_empty_weights():
    model = LlamaForCausalLM(config)
# save_pretrained needs real tensors: to_empty on the CPU, then random weights
model.to_empty(device='cpu')
with torch.no_grad():
    for p in model.parameters():
        p.data = torch.randn(p.shape, device='cpu', dtype=p.dtype) * 0.02
ckpt = os.path.join(os.getcwd(), 'fake-llama-dispatch')
os.makedirs(ckpt, exist_ok=True)
model.save_pretrained(ckpt, safe_serialization=True)
del model
gc.collect()
print(ckpt)
"''',
        adapted=["checkpoint in the scratch dir instead of /tmp/fake-llama-dispatch"],
    )
    first, second, case = _dispatch_map(info)
    main_acc = first not in ("cpu", "disk")
    offload = "offload_folder='offload'," if "disk" in (first, second) else ""
    out_dev = first.split(":")[0]
    add(
        "acc-dispatch",
        text=f'''python -c "
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from accelerate import init_empty_weights, load_checkpoint_and_dispatch
{LLAMA_CONFIG}
device_map = {{'model.embed_tokens': '{first}'}}
device_map.update({{f'model.layers.{{i}}': '{first}' for i in range(10)}})
device_map.update({{f'model.layers.{{i}}': '{second}' for i in range(10, 20)}})
device_map.update({{'model.norm': '{second}', 'lm_head': '{second}'}})
with init_empty_weights():
    skeleton = LlamaForCausalLM(config)
loaded = load_checkpoint_and_dispatch(
    skeleton,
    checkpoint='{{dispatch_ckpt}}',
    device_map=device_map,
    no_split_module_classes=['LlamaDecoderLayer'],
    {offload}
)
dev_first = loaded.model.layers[0].self_attn.q_proj.weight.device
dev_last = loaded.model.layers[-1].self_attn.q_proj.weight.device
x = torch.tensor([[1, 2, 3]], device=loaded.device)
out = loaded(input_ids=x).logits
print(f'first_layer_device={{dev_first}}')
print(f'last_layer_device={{dev_last}}')
print(f'out_device={{out.device.type}}')
print(f'out_shape={{list(out.shape)}}')
"''',
        expected=(
            f"...\nfirst_layer_device={_shown_device(first, main_acc)}\n"
            f"last_layer_device={_shown_device(second, main_acc)}\nout_device={out_dev}\nout_shape=[1, 3, 32000]"
        ),
        adapted=[f"device_map as notebook 03: {first} + {second} ({case})"],
    )
    return out


def fill(text: str, stored: dict[str, str]) -> str:
    """Put the setups' stored values in place of {name} (only known names; other braces stay)."""
    for name, value in stored.items():
        text = text.replace("{" + name + "}", value)
    return text
