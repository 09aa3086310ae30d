"""A learner's own job (07, 07b, 08, 08b): a tiny Qwen2 made offline, the two data formats 07b's recipe reads,
labels on the assistant turns only, and the lessons end to end on that second architecture.

``tiny_model`` is the fixture other tests use for a local ``model_id`` (no network, seconds).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOKS

from nbtools.tinybase import lesson_scripts, save_base

INSTRUCTION = "换算单位，只写结果。"  # 07b's Alpaca instruction


def _make_data_module() -> dict:
    """07's make_data.py (its UNITS, TEMPLATES, example) as a namespace, read from the lesson's cell."""
    nb = nbformat.read(os.path.join(NOTEBOOKS, "07_lora_finetune.ipynb"), as_version=4)
    body = next(c.source for c in nb.cells if c.source.startswith("%%writefile make_data.py")).split("\n", 1)[1]
    namespace: dict = {"__name__": "make_data"}
    exec(compile(body, "make_data.py", "exec"), namespace)
    return namespace


def every_question() -> list[tuple[str, str]]:
    """All (question, answer) pairs 07's data can hold: 9 numbers x 6 units x 3 phrasings."""
    m = _make_data_module()
    rows = [m["example"](x, big, small, t) for x in range(1, 10) for big, small in m["UNITS"] for t in m["TEMPLATES"]]
    return [(r["question"], r["answer"]) for r in rows]


def tiny_model(folder: Path, arch: str = "qwen2", **kw) -> Path:
    """A local model folder that every question of 07 / 07b tokenizes in (``arch``: qwen2 or llama)."""
    save_base(str(folder), [q + a for q, a in every_question()] + [INSTRUCTION], arch=arch, **kw)
    return folder


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-qwen2") / "model")


def test_the_tiny_qwen2_loads_as_qwen_with_its_chat_template(qwen):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen)
    assert AutoConfig.from_pretrained(qwen).model_type == "qwen2"
    assert type(tokenizer).__name__ == "Qwen2Tokenizer", type(tokenizer).__name__  # transformers 5 picks it by type
    text = tokenizer.apply_chat_template([{"role": "user", "content": "3千米等于多少米？"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n3千米等于多少米？<|im_end|>\n"
                    "<|im_start|>assistant\n"), text
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text and tokenizer.unk_token_id not in ids  # byte-level: every character round-trips


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, qwen):
    """07b's train_sft.py (and 07's train_lora.py it imports) written as the lessons write them."""
    folder = tmp_path_factory.mktemp("recipe")
    here = os.getcwd()
    os.chdir(folder)
    try:
        lesson_scripts("07_lora_finetune", "train_lora.py")
        lesson_scripts("07b_lora_your_data", "train_sft.py")
    finally:
        os.chdir(here)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in ("train_sft", "train_lora"):
        sys.modules.pop(name, None)


def _learnt(tokenizer, ids, labels, ignore) -> list[str]:
    """The labelled stretches of a sequence, decoded, in order."""
    runs, cur = [], []
    for i, label in zip(ids, labels):
        if label == ignore:
            cur and runs.append(cur)
            cur = []
        else:
            assert label == i
            cur.append(i)
    cur and runs.append(cur)
    return [tokenizer.decode(r) for r in runs]


def test_only_the_assistant_turns_are_learnt_in_messages_and_alpaca(recipe, qwen):
    from train_lora import IGNORE, load_tokenizer
    from train_sft import encode_chat, to_messages

    tokenizer = load_tokenizer(str(qwen))
    (q1, a1), (q2, a2) = every_question()[:2]
    chat = {"messages": [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": q1},
                         {"role": "assistant", "content": a1}, {"role": "user", "content": q2},
                         {"role": "assistant", "content": a2}]}
    # Qwen's format, written here: an assistant turn is "<|im_start|>assistant\n" + text + "<|im_end|>\n"; only
    # the text and its end are learnt
    assert _learnt(tokenizer, *encode_chat(tokenizer, to_messages(chat)), IGNORE) == [f"{a1}<|im_end|>\n", f"{a2}<|im_end|>\n"]
    alpaca = {"instruction": INSTRUCTION, "input": q1, "output": a1}
    messages = to_messages(alpaca)
    assert messages == [{"role": "user", "content": f"{INSTRUCTION}\n{q1}"}, {"role": "assistant", "content": a1}]
    assert _learnt(tokenizer, *encode_chat(tokenizer, messages), IGNORE) == [f"{a1}<|im_end|>\n"]
    assert to_messages({"instruction": q1, "input": "", "output": a1})[0]["content"] == q1


@pytest.mark.parametrize("form", ["messages", "alpaca"])
def test_train_sft_fine_tunes_a_file_of_each_form(recipe, qwen, form, tmp_path):
    rows = every_question()[:24]
    data = tmp_path / f"{form}.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for q, a in rows:
            row = ({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} if form == "messages"
                   else {"instruction": INSTRUCTION, "input": q, "output": a})
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen)
    prompt = (lambda q: q) if form == "messages" else (lambda q: f"{INSTRUCTION}\n{q}")
    lengths = [len(tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": prompt(q)}, {"role": "assistant",
               "content": a}], tokenize=False), add_special_tokens=False)["input_ids"]) for q, a in rows]
    max_length = sorted(lengths)[len(lengths) // 2]  # about half of them are cut
    proc = subprocess.run([sys.executable, "train_sft.py", "--base", str(qwen), "--data", str(data), "--val", str(data),
                           "--out", str(tmp_path / "out"), "--epochs", "2", "--micro_batch", "4", "--max_length", str(max_length)],
                          cwd=recipe, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kv = dict(w.split("=", 1) for line in proc.stdout.splitlines() for w in line.split() if "=" in w)
    assert (kv["examples"], kv["truncated"]) == (str(len(rows)), str(sum(n > max_length for n in lengths))), kv
    assert int(kv["steps"]) == 2 * (len(rows) // 4) and kv["global_batch"] == "4", kv
    assert float(kv["loss_end"]) < float(kv["loss_start"]) and float(kv["val_loss"]) > 0, kv
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()


def modelscope_cache(folder: Path, model: Path, model_id: str = "nbtools/tiny-qwen2") -> str:
    """A ModelScope cache (MODELSCOPE_CACHE) that holds ``model`` as ``model_id``, laid out as modelscope stores a
    model (``models/<owner>/<name>``): its snapshot_download(local_files_only=True) answers from it, offline."""
    shutil.copytree(model, folder / "models" / model_id)
    return model_id


@pytest.mark.notebook
@pytest.mark.parametrize("lesson", ["07_lora_finetune", "08_sharding"])
def test_07_and_08_pass_on_a_tiny_qwen2_on_the_simulated_npu(lesson, qwen, tmp_path):
    """Not bound to one architecture: the lesson end to end with -p model_id= at a Qwen2 model made offline. 07 takes
    it through ModelScope (a prebuilt cache, HF_HUB_OFFLINE=1) where the optional modelscope package is installed,
    else as a local folder."""
    if lesson == "08_sharding":  # a model whose states outweigh its activations: 08's budget splits DDP from FSDP2
        qwen = tiny_model(tmp_path / "qwen-256", hidden=256, intermediate=512, layers=4)
    out, env, params = tmp_path / "out", dict(os.environ), ["-p", f"model_id={qwen}"]
    if lesson == "07_lora_finetune" and importlib.util.find_spec("modelscope"):
        env.update(MODELSCOPE_CACHE=str(tmp_path / "ms"), HF_HUB_OFFLINE="1")
        params = ["-p", f"model_id={modelscope_cache(tmp_path / 'ms', qwen)}", "-p", "model_source=modelscope"]
    proc = subprocess.run([sys.executable, "-m", "nbtools", "run", "--simulate-npu", str(Path(NOTEBOOKS) / f"{lesson}.ipynb"),
                           "--output", str(out), *params], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    checks = {c["id"]: c["status"] for c in report["checks"] if not c["seed"]}
    assert checks and "failed" not in checks.values(), checks
    if lesson == "07_lora_finetune":
        assert checks["lora-real-model"] == "passed" and checks["lora-answers"] == "passed", checks
    else:
        assert checks["shard-fsdp2-memory"] == "passed", checks  # wrapped by Qwen2's _no_split_modules
