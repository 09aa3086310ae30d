"""nbtools.bigmodel: the parameter formula, the config parser and the quick-start's split on this machine."""

from __future__ import annotations

import pytest

from nbtools import NbtoolsError, bigmodel, commands

# The quick-start's dispatch program, as a notebook cell writes it (checkpoint: the work folder's copy).
DISPATCH = '''python -c "
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from accelerate import init_empty_weights, load_checkpoint_and_dispatch
config = LlamaConfig(
    vocab_size=32000, hidden_size=512, intermediate_size=1024,
    num_hidden_layers=20, num_attention_heads=8, max_position_embeddings=64,
)
device_map = {'model.embed_tokens': 'npu:0'}
device_map.update({f'model.layers.{i}': 'npu:0' for i in range(10)})
device_map.update({f'model.layers.{i}': 'npu:1' for i in range(10, 20)})
device_map.update({'model.norm': 'npu:1', 'lm_head': 'npu:1'})
with init_empty_weights():
    skeleton = LlamaForCausalLM(config)
loaded = load_checkpoint_and_dispatch(
    skeleton,
    checkpoint='fake-llama-dispatch',
    device_map=device_map,
    no_split_module_classes=['LlamaDecoderLayer'],
)
"'''


def _exec_map(program: str) -> dict:
    """Run the device_map lines of a program (nothing else) and return the map they build."""
    src = bigmodel._program(program)
    lines = [ln for ln in src.splitlines() if ln.startswith("device_map")]
    ns: dict = {}
    exec("\n".join(lines), ns)
    return ns["device_map"]


def test_program_config_reads_the_literal_keywords():
    cfg = bigmodel.program_config(DISPATCH)
    assert cfg == dict(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_hidden_layers=20,
                       num_attention_heads=8, max_position_embeddings=64)
    with pytest.raises(NbtoolsError):
        bigmodel.program_config("python -c \"print('no config')\"")


def test_the_quick_starts_big_model_has_85_million_float32_parameters():
    cfg = bigmodel.program_config(DISPATCH)
    assert bigmodel.llama_param_count(cfg) == 85_217_792  # 341 MB in float32, not "80M bf16, 160 MB"


@pytest.mark.parametrize(
    "cfg",
    [
        dict(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1),
        dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2),
        dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             head_dim=16, tie_word_embeddings=True),
        dict(vocab_size=40, hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=2,
             attention_bias=True, mlp_bias=True),
    ],
)
def test_llama_param_count_matches_transformers(cfg):
    pytest.importorskip("torch")
    import transformers
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    model.tie_weights()  # what from_pretrained does; parameters() counts a tied tensor once
    assert bigmodel.llama_param_count(cfg) == sum(p.numel() for p in model.parameters())
    # per module, as a device_map names them (what 03b's bigmodel-memory expects on each device)
    per_module = bigmodel.llama_module_params(cfg)
    for name, n in per_module.items():
        own = {id(p): p for p in model.get_submodule(name).parameters()}
        if name == "lm_head" and cfg.get("tie_word_embeddings"):
            assert n == 0  # its weight is the embeddings'
        else:
            assert n == sum(p.numel() for p in own.values()), name


def test_quickstart_device_map_halves_the_layers():
    m = bigmodel.quickstart_device_map("a", "b", num_layers=20)
    assert list(m)[0] == "model.embed_tokens" and list(m)[-2:] == ["model.norm", "lm_head"]
    assert [m[f"model.layers.{i}"] for i in range(20)] == ["a"] * 10 + ["b"] * 10
    assert len(m) == 23


@pytest.mark.parametrize(
    "kind,count,first,second",
    [("npu", 2, "npu:0", "npu:1"), ("npu", 8, "npu:0", "npu:1"), ("cuda", 2, "cuda:0", "cuda:1"),
     ("npu", 1, "npu:0", "cpu"), ("cuda", 1, "cuda:0", "cpu"), ("cpu", 0, "cpu", "disk")],
)
def test_adapt_dispatch_builds_the_same_split_on_this_machine(kind, count, first, second):
    real, why = commands.adapt_dispatch(DISPATCH, kind, count)
    assert _exec_map(real) == bigmodel.quickstart_device_map(first, second)
    assert (why == "") == (kind == "npu" and count >= 2)
    assert (real == DISPATCH) == (kind == "npu" and count >= 2)
    assert ("offload_folder='offload'" in real) == (second == "disk")
    assert bigmodel._program(real).count("\n") == bigmodel._program(DISPATCH).count("\n")


def test_adapt_dispatch_refuses_a_program_without_the_two_devices():
    with pytest.raises(NbtoolsError):
        commands.adapt_dispatch(DISPATCH.replace("'npu:1'", "'npu:0'"), "cpu", 0)


def test_weights_shown_on_offloaded_targets_is_meta():
    cpu_disk = bigmodel.quickstart_device_map("cpu", "disk")
    one_card = bigmodel.quickstart_device_map("npu:0", "cpu")
    assert [bigmodel.weights_shown_on(t, cpu_disk) for t in ("cpu", "disk")] == ["cpu", "meta"]
    assert [bigmodel.weights_shown_on(t, one_card) for t in ("npu:0", "cpu")] == ["npu:0", "meta"]
    assert bigmodel.weights_shown_on("npu:1", bigmodel.quickstart_device_map("npu:0", "npu:1")) == "npu:1"


def test_dispatch_rule_applies_to_the_dispatch_program_only():
    import shlex

    argv = shlex.split(DISPATCH)
    assert commands.dispatch_rule(argv, "npu", 2) is None  # the quick-start's own machine: unchanged
    real, why = commands.dispatch_rule(argv, "cpu", 0)
    assert real[:2] == argv[:2] and "'disk'" in real[2] and why.startswith("这里没有 NPU")
    assert commands.dispatch_rule(["python", "-c", "print('npu:0', 'npu:1')"], "cpu", 0) is None
    assert commands.dispatch_rule(["python", "--version"], "cpu", 0) is None


def test_program_device_map_runs_only_the_map_lines():
    assert bigmodel.program_device_map(DISPATCH) == bigmodel.quickstart_device_map("npu:0", "npu:1")
    real, _ = commands.adapt_dispatch(DISPATCH, "cpu", 0)
    assert bigmodel.program_device_map(real) == bigmodel.quickstart_device_map("cpu", "disk")
    with pytest.raises(NbtoolsError):
        bigmodel.program_device_map("python -c \"print(1)\"")


def test_pictures_draw_from_the_numbers_given():
    import matplotlib
    matplotlib.use("Agg")
    fig = bigmodel.draw_device_map(bigmodel.quickstart_device_map("cpu", "disk"))
    assert len(fig.axes[0].patches) == 23
    used = {"0": 65_000_000, "1": 126_000_000, "cpu": 63_000_000, "disk": 87_000_000}
    budgets = {"0": 136_000_000, "1": 136_000_000, "cpu": 136_000_000}
    fig = bigmodel.draw_budgets(used, budgets, reserve={"0": 65_000_000, "cpu": 65_000_000})
    heights = [round(b.get_height()) for b in fig.axes[0].patches]
    assert heights == [65, 126, 63, 87]
    assert len(fig.axes[0].collections) == 5  # three budget lines, two reserve lines
