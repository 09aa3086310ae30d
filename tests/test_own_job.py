"""A learner's own job (07b trains, 07c evaluates; 07, 08 and 08b take a model_id too): a tiny Qwen2 made offline, the
three data forms 07b's train_sft.py reads (Alpaca, messages, ShareGPT) and the rows it refuses, labels on the assistant
turns only, max_length derived and examples with no answer token dropped, resume from the last checkpoint and on another
process count refused, 07c's eval_sft.py's character F1, and 07b + 07c and 08 end to end on that second architecture.

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
    """07b's train_sft.py and 07c's eval_sft.py written as the lessons write them (the learner's two files)."""
    folder = tmp_path_factory.mktemp("recipe")
    here = os.getcwd()
    os.chdir(folder)
    try:
        lesson_scripts("07b_lora_your_data", "train_sft.py")
        lesson_scripts("07c_lora_evaluate_and_keep", "eval_sft.py")
    finally:
        os.chdir(here)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in ("train_sft", "eval_sft"):
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


def test_only_the_assistant_turns_are_learnt_in_every_form(recipe, qwen):
    from train_sft import IGNORE, encode_chat, load_tokenizer, to_messages

    tokenizer = load_tokenizer(str(qwen))
    (q1, a1), (q2, a2) = every_question()[:2]
    turns = [{"role": "user", "content": q1}, {"role": "assistant", "content": a1}, {"role": "user", "content": q2},
             {"role": "assistant", "content": a2}]
    chat = {"messages": [{"role": "system", "content": INSTRUCTION}, *turns]}
    # Qwen's format, written here: an assistant turn is "<|im_start|>assistant\n" + text + "<|im_end|>\n"; only
    # the text and its end are learnt
    assert _learnt(tokenizer, *encode_chat(tokenizer, to_messages(chat)), IGNORE) == [f"{a1}<|im_end|>\n", f"{a2}<|im_end|>\n"]
    sharegpt = {"system": INSTRUCTION, "conversations": [{"from": "human", "value": q1}, {"from": "gpt", "value": a1},
                                                         {"from": "human", "value": q2}, {"from": "gpt", "value": a2}]}
    alpaca = {"system": INSTRUCTION, "history": [[q1, a1]], "instruction": q2, "input": "", "output": a2}
    assert to_messages(sharegpt) == to_messages(alpaca) == to_messages(chat)  # LLaMA-Factory's readings of the three
    alpaca = {"instruction": INSTRUCTION, "input": q1, "output": a1}
    messages = to_messages(alpaca)
    assert messages == [{"role": "user", "content": f"{INSTRUCTION}\n{q1}"}, {"role": "assistant", "content": a1}]
    assert _learnt(tokenizer, *encode_chat(tokenizer, messages), IGNORE) == [f"{a1}<|im_end|>\n"]


@pytest.mark.parametrize(("text", "said"), [
    ('{"instruction": "q", "input": ""}\n', "f.jsonl:1: field 'output' is missing"),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n\n{"question": "q"}\n',
     "f.jsonl:3: none of the fields 'messages', 'conversations', 'instruction'"),
    ('{"conversations": [{"from": "human", "value": "q"}, {"from": "bot", "value": "a"}]}\n', "f.jsonl:1: a role is none of"),
    ('{"messages": [{"role": "user", "content": "q"}]}\n', "f.jsonl:1: the last turn must be the assistant's"),
    ('{"instruction": "q", "output": "a"}\n{"instruction": "q", "output": 3}\n', "f.jsonl:2: field 'output' is missing or not a str"),
    ('{"instruction": "q", "output": "a"}\n{"instruction": \n', "f.jsonl:2: not JSON"),
    ('[{"instruction": "q", "output": "a"}, {"instruction": "q", "history": ["x"], "output": "a"}]', "f.json item 2: field 'history'"),
])
def test_a_bad_row_is_refused_with_file_line_and_field(recipe, tmp_path, text, said):
    from train_sft import DataError, read_rows, to_messages

    path = tmp_path / ("f.json" if text.startswith("[") else "f.jsonl")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as e:
        [to_messages(row, where) for where, row in read_rows(str(path))]
    assert str(e.value).startswith(f"{tmp_path}{os.sep}{said}"), e.value


def test_max_length_is_derived_and_a_file_with_no_answer_left_is_refused(recipe, qwen, tmp_path):
    from train_sft import load, load_tokenizer, positions

    tokenizer = load_tokenizer(str(qwen))
    rows = [{"system": INSTRUCTION * 4, "instruction": q, "output": a} for q, a in every_question()[:6]]
    rows[0]["system"] = ""  # one short prompt: its answer survives a cut that drops the others'
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    lengths = [len(tokenizer(tokenizer.apply_chat_template(m, tokenize=False), add_special_tokens=False)["input_ids"])
               for m in ([{"role": "system", "content": r["system"]}] * bool(r["system"]) +
                         [{"role": "user", "content": r["instruction"]}, {"role": "assistant", "content": r["output"]}]
                         for r in rows)]
    kept, stats = load(str(path), tokenizer, 0, positions(str(qwen)))
    assert (len(kept), stats) == (6, {"max_length": max(lengths), "truncated": 0, "dropped": 0, "longest": max(lengths)})
    assert load(str(path), tokenizer, 0, cap=min(lengths))[1]["truncated"] == sum(n > min(lengths) for n in lengths)
    kept, stats = load(str(path), tokenizer, lengths[0])  # the long prompts end past max_length: dropped, counted
    assert (len(kept), stats["dropped"]) == (1, 5) and all(any(v != -100 for v in labels) for _, labels in kept), stats
    with pytest.raises(SystemExit, match="none of its 6 examples keeps an answer token within max_length=8"):
        load(str(path), tokenizer, 8)


@pytest.mark.parametrize("form", ["messages.jsonl", "alpaca.json"])
def test_train_sft_fine_tunes_a_file_of_each_form_and_resumes_from_its_last_checkpoint(recipe, qwen, form, tmp_path):
    rows = every_question()[:24]
    data = tmp_path / form
    rows_out = [({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} if form == "messages.jsonl"
                 else {"instruction": INSTRUCTION, "input": q, "output": a}) for q, a in rows]
    data.write_text(json.dumps(rows_out, ensure_ascii=False) if form.endswith(".json") else
                    "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows_out), encoding="utf-8")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen)
    prompt = (lambda q: q) if form == "messages.jsonl" else (lambda q: f"{INSTRUCTION}\n{q}")
    lengths = [len(tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": prompt(q)}, {"role": "assistant",
               "content": a}], tokenize=False), add_special_tokens=False)["input_ids"]) for q, a in rows]
    max_length = sorted(lengths)[len(lengths) // 2]  # about half of them are cut
    train = [sys.executable, "train_sft.py", "--base", str(qwen), "--data", str(data), "--epochs", "2", "--micro_batch", "4",
             "--max_length", str(max_length), "--lr", "1e-2"]
    proc = subprocess.run([*train, "--out", str(tmp_path / "out"), "--save_every", "3", "--merge"] +
                          (["--val", str(data)] if form == "alpaca.json" else []),
                          cwd=recipe, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kv = dict(w.split("=", 1) for line in proc.stdout.splitlines() for w in line.split() if "=" in w)
    assert (kv["examples"], kv["truncated"], kv["dropped"]) == (str(len(rows)), str(sum(n > max_length for n in lengths)), "0"), kv
    assert int(kv["steps"]) == 2 * (len(rows) // 4) and kv["global_batch"] == "4", kv
    assert float(kv["loss_end"]) < float(kv["loss_start"]), kv
    assert kv["val_loss"] == "none" if form == "messages.jsonl" else float(kv["val_loss"]) > 0, kv  # no --val: no 0.0000
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file() and kv["merged_dtype"] == "torch.float32"
    if form == "alpaca.json":  # the last checkpoint (step 12 of 12): nothing left to train, the run ends cleanly
        last = max(int(p.name.split("_")[1]) for p in (tmp_path / "out").glob("checkpoint_*"))
        proc = subprocess.run([*train, "--out", str(tmp_path / "again"), "--resume", str(tmp_path / "out" / f"checkpoint_{last}")],
                              cwd=recipe, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and f"start_step={last} loss_start=none" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_a_resume_on_another_process_count_is_refused(recipe, tmp_path):
    from train_sft import resume_step

    (tmp_path / "step.json").write_text(json.dumps({"step": 6, "world": 2}))
    assert resume_step(str(tmp_path), 2) == 6
    with pytest.raises(SystemExit, match="saved by 2 processes, this run has 1: resume with --num_processes 2"):
        resume_step(str(tmp_path), 1)


def test_char_f1_counts_shared_characters(recipe):
    from eval_sft import char_f1

    assert (char_f1("3000米", "3000米"), char_f1("", ""), char_f1("米", "3000米"), char_f1("", "3000米")) == (1.0, 1.0, 2 * 1 * (1 / 5) / (1 + 1 / 5), 0.0)
    assert char_f1("300米", "3000米") == 2 * (4 / 4) * (4 / 5) / (4 / 4 + 4 / 5)  # 3, 0, 0, 米 shared


def modelscope_cache(folder: Path, model: Path, model_id: str = "nbtools/tiny-qwen2") -> str:
    """A ModelScope cache (MODELSCOPE_CACHE) that holds ``model`` as ``model_id``, laid out as modelscope stores a
    model (``models/<owner>/<name>``): its snapshot_download(local_files_only=True) answers from it, offline."""
    shutil.copytree(model, folder / "models" / model_id)
    return model_id


def own_job_files(folder: Path) -> dict[str, Path]:
    """A learner's three files, one in each form: 40 Alpaca rows (a .json array; some with a system prompt, some with a
    history turn, one longer than 07b's old max_length of 36), 20 two-turn ShareGPT conversations to validate on, and
    a held-out set of 11 messages rows (not a multiple of 2 ranks)."""
    qa = every_question()
    alpaca = [{"instruction": INSTRUCTION, "input": q, "output": a, **({"system": INSTRUCTION * 3} if i % 5 == 0 else {}),
               **({"history": [list(qa[i + 1])]} if i % 7 == 0 else {})} for i, (q, a) in enumerate(qa[:40])]
    share = [{"conversations": [{"from": f, "value": v} for q, a in qa[40 + 2 * k:42 + 2 * k] for f, v in (("human", q), ("gpt", a))]}
             for k in range(20)]
    heldout = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in qa[80:91]]
    files = {"train.json": json.dumps(alpaca, ensure_ascii=False, indent=1),
             "val.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in share),
             "heldout.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in heldout)}
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return {name: folder / name for name in files}


@pytest.mark.notebook
@pytest.mark.parametrize("lesson", ["07b_lora_your_data", "08_sharding"])
def test_the_own_job_and_08_pass_on_a_tiny_qwen2_on_the_simulated_npu(lesson, qwen, tmp_path):
    """Not bound to one architecture: the lesson end to end with -p model_id= at a Qwen2 model made offline. 07b and
    then 07c are the learner's own job on ONE simulated card (ASCEND_RT_VISIBLE_DEVICES=0, as a 1-card host is
    rehearsed), one `nbtools run` with the same -p for both, as README's command: the model through ModelScope (a
    prebuilt cache, HF_HUB_OFFLINE=1) where the optional modelscope package is installed, else as a local folder; data,
    validation and held-out files in the three forms; 07b's results kept in output_dir, where 07c finds the merged
    model (no training of its own) and keeps its predictions and metrics beside it."""
    if lesson == "08_sharding":  # a model whose states outweigh its activations: 08's budget splits DDP from FSDP2
        qwen = tiny_model(tmp_path / "qwen-256", hidden=256, intermediate=512, layers=4)
    out, env, params = tmp_path / "out", dict(os.environ), ["-p", f"model_id={qwen}"]
    notebooks = [str(Path(NOTEBOOKS) / f"{lesson}.ipynb")]
    if lesson == "07b_lora_your_data":
        notebooks.append(str(Path(NOTEBOOKS) / "07c_lora_evaluate_and_keep.ipynb"))
        files, kept = own_job_files(tmp_path), tmp_path / "kept"
        env["ASCEND_RT_VISIBLE_DEVICES"] = "0"
        params += ["-p", f"data_file={files['train.json']}", "-p", f"val_file={files['val.jsonl']}",
                   "-p", f"eval_file={files['heldout.jsonl']}", "-p", f"output_dir={kept}"]
        if importlib.util.find_spec("modelscope"):
            env.update(MODELSCOPE_CACHE=str(tmp_path / "ms"), HF_HUB_OFFLINE="1")
            params[1] = f"model_id={modelscope_cache(tmp_path / 'ms', qwen)}"
            params += ["-p", "model_source=modelscope"]
    proc = subprocess.run([sys.executable, "-m", "nbtools", "run", "--simulate-npu", *notebooks,
                           "--output", str(out), *params], capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    checks = {c["id"]: c["status"] for c in report["checks"] if not c["seed"]}
    assert checks and "failed" not in checks.values(), checks
    if lesson == "08_sharding":
        assert checks["shard-fsdp2-memory"] == "passed", checks  # wrapped by Qwen2's _no_split_modules
        return
    assert all(checks[c] == "passed" for c in ("lora-own-data", "lora-eval-model", "lora-eval-ranks", "lora-kept")), checks
    predictions = [json.loads(line) for line in (kept / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [p["index"] for p in predictions] == list(range(11)), predictions  # each held-out example once
    assert {"base", "tuned"} <= set(predictions[0]) and (kept / "merged" / "model.safetensors").is_file()
    settings = json.loads((kept / "settings.json").read_text())
    assert settings["world"] == 1 and settings["examples"] == 40 and settings["longest"] > 36, settings  # npu:0 alone
    executed = nbformat.read(out / "07b_lora_your_data.ipynb", as_version=4)
    launch = next(c for c in executed.cells if c.cell_type == "code" and c.source.startswith("sft_args"))
    text = "".join(o.get("text", "") for o in launch.outputs)  # the command as run, and the card's peak memory counted
    assert "# runs here as: ASCEND_RT_VISIBLE_DEVICES=0 " in text and "ACCELERATE_USE_CPU" not in text and "peak_memory=n/a" not in text, text
    evaluated = nbformat.read(out / "07c_lora_evaluate_and_keep.ipynb", as_version=4)
    model = next(c for c in evaluated.cells if c.cell_type == "code" and c.source.startswith("world = S.fitted"))
    text = "".join(o.get("text", "") for o in model.outputs)  # 07c evaluated 07b's merged model, trained nothing itself
    assert "已在 output_dir 里" in text and "train_sft.py" not in text, text
    assert json.loads((kept / "metrics.json").read_text())["tuned"]["examples"] == 11
