"""Benchmark: the series' LoRA fine-tune recipe beside LLaMA-Factory, on the same tiny model, data and settings.

    python bench/finetune_vs_llamafactory.py [--output DIR] [--pairs N] [--lf-venv .venv-lf] [--smoke]

Run from the repository root, outside CI (a few minutes on 2 CPU cores). What it does:

1. writes the recipe's scripts from the notebooks' own ``%%writefile`` cells (07's, then 07b's: 07b's
   ``train_sft.py`` is the recipe, whatever of 07's it imports is there too), so it always measures what the lesson
   teaches; 07's ``make_data.py`` makes the data, and the lesson's two-turn conversations are built from it
   (``messages``, or Alpaca rows with ``--form alpaca``);
2. builds a tiny Qwen2 folder offline (``nbtools.tinybase.save_base(arch="qwen2")``: byte-level BPE, Qwen's
   chat template), as tests/test_own_job.py does;
3. runs, in alternating order (recipe first, then LLaMA-Factory first, ...), ``--pairs`` pairs after one untimed
   warm-up run of each: the recipe with ``accelerate launch`` as its ``%launch`` cell prints it here (1 process),
   and ``llamafactory-cli train`` with a YAML of the same settings (stage sft, LoRA rank/alpha/targets, the same
   chat template, cutoff_len = max_length, batch, epochs, learning rate, fp32, no gradient checkpointing) from
   its own virtual environment (its pins differ from the recipe's stack);
4. measures both sides the same way: a ``sitecustomize.py`` (on PYTHONPATH for the two runs only) wraps
   ``torch.nn.functional.cross_entropy`` (transformers' causal-LM loss calls it with each side's own labels) to
   count the trained tokens (label != -100) and the positions (padding included), and a global optimizer
   step hook stamps the time (wall and CPU) of each step. Trained tokens per second = the trained tokens of steps
   3..N over the time from the end of step 2 to the end of step N (2 warm-up steps, as the recipe's own tokens/s),
   in wall seconds and in the process's CPU seconds (the load of a shared machine moves the first, not the second).
   End to end = the launch command's wall time and the CPU seconds of all its processes, measured here.

Medians over the pairs and the ratios recipe / LLaMA-Factory land in DIR/finetune-vs-llamafactory.json
and .md; the table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from nbtools.tinybase import save_base  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
LESSONS = ("07_lora_finetune", "07b_lora_your_data")  # their %%writefile cells, in this order (07b's win)
RECIPE, RECIPE_LESSON = "train_sft.py", "07b_lora_your_data"
INSTRUCTION = "换算单位，只写结果。"  # 07b's Alpaca instruction
QWEN_SYSTEM = "You are a helpful assistant."  # the tiny Qwen2's default system turn (nbtools.tinybase.QWEN_TEMPLATE)
WARMUP_STEPS = 2

# Loaded by every Python process of a timed run (PYTHONPATH); active where BENCH_TRACE names an output prefix.
SITECUSTOMIZE = '''
import os
if os.environ.get("BENCH_TRACE"):
    import atexit, json, time
    _t0 = time.time()  # this interpreter's start (site is done; nothing imported yet)
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    _steps, _n, _first = [], {"trained": 0, "positions": 0}, {}
    _ce = torch.nn.functional.cross_entropy

    def cross_entropy(input, target, *args, **kwargs):  # transformers' causal-LM loss, each side's own labels
        if torch.is_grad_enabled():  # training forwards only (not a validation under no_grad)
            _n["trained"] += int((target != kwargs.get("ignore_index", -100)).sum())
            _n["positions"] += target.numel()
        return _ce(input, target, *args, **kwargs)

    torch.nn.functional.cross_entropy = cross_entropy

    def _first_forward(module, args):
        if torch.is_grad_enabled() and module.training and "t" not in _first:
            _first.update(t=time.time(), threads=torch.get_num_threads())
            _handle.remove()

    _handle = torch.nn.modules.module.register_module_forward_pre_hook(_first_forward)
    register_optimizer_step_post_hook(
        lambda opt, args, kwargs: _steps.append((time.time(), _n["trained"], _n["positions"], time.process_time(),
                                          time.thread_time())))

    @atexit.register
    def _dump():
        if _steps:
            with open(f"{os.environ['BENCH_TRACE']}.{os.getpid()}.json", "w") as f:
                json.dump({"start": _t0, "first_forward": _first.get("t"), "threads": _first.get("threads"),
                           "steps": _steps, "exit": time.time()}, f)
'''


def writefile_cells(folder: Path, lesson: str) -> dict[str, str]:
    cells = nbformat.read(folder / f"{lesson}.ipynb", as_version=4).cells
    return {c.source.split("\n", 1)[0].split()[-1]: c.source.split("\n", 1)[1] + "\n" for c in cells
            if c.cell_type == "code" and c.source.startswith("%%writefile ")}


def write_recipe(work: Path, folder: Path) -> list[str]:
    """Every %%writefile of 07 and 07b into ``work`` (the recipe and what it imports); the names written."""
    files = {}
    for lesson in LESSONS:
        files.update(writefile_cells(folder, lesson))
    if RECIPE not in writefile_cells(folder, RECIPE_LESSON):
        raise SystemExit(f"{folder / RECIPE_LESSON}.ipynb has no `%%writefile {RECIPE}` cell: that cell is the "
                         f"recipe this bench measures (rename RECIPE / RECIPE_LESSON here if the lesson moved it)")
    for name, text in files.items():
        (work / name).write_text(text, encoding="utf-8")
    return sorted(files)


def make_data(work: Path, args) -> tuple[Path, list[dict]]:
    """07's make_data.py, then the lesson's two-turn conversations (or Alpaca rows) in data/train.jsonl."""
    subprocess.run([sys.executable, "make_data.py", "data", "16", str(args.seed), str(2 * args.examples)], cwd=work,
                   check=True, capture_output=True, text=True)
    with open(work / "data" / "train.jsonl", encoding="utf-8") as f:
        qa = [(r["question"], r["answer"]) for r in map(json.loads, f)]
    if args.form == "messages":  # 07b's chat.jsonl: two (question, answer) turns per conversation
        rows = [{"messages": [m for q, a in qa[2 * k:2 * k + 2] for m in ({"role": "user", "content": q},
                                                                          {"role": "assistant", "content": a})]}
                for k in range(args.examples)]
    else:  # 07b's alpaca.jsonl
        rows = [{"instruction": INSTRUCTION, "input": q, "output": a} for q, a in qa[:args.examples]]
    path = work / "data" / f"{args.form}.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    with open(work / "data" / "heldout.jsonl", encoding="utf-8") as f:
        texts = [r["question"] + r["answer"] for r in map(json.loads, f)]
    return path, [{"text": q + a} for q, a in qa] + [{"text": t} for t in texts]


def lf_config(work: Path, data: Path, args) -> Path:
    """dataset_info.json for the same file, and the YAML: the recipe's settings in LLaMA-Factory's words."""
    if args.form == "messages":
        info = {"formatting": "sharegpt", "columns": {"messages": "messages"},
                "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                         "assistant_tag": "assistant", "system_tag": "system"}}
    else:
        info = {"columns": {"prompt": "instruction", "query": "input", "response": "output"}}
    (work / "lf").mkdir(exist_ok=True)
    (work / "lf" / "dataset_info.json").write_text(json.dumps({"bench": {"file_name": str(data), **info}}, indent=1))
    targets = args.targets or "all"  # the recipe's empty --targets: PEFT's all-linear; LLaMA-Factory's `all`
    config = {
        "model_name_or_path": str(work / "base"), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": args.r, "lora_alpha": args.alpha, "lora_dropout": 0.0, "lora_target": targets,
        "dataset": "bench", "dataset_dir": str(work / "lf"), "template": "qwen", "default_system": QWEN_SYSTEM,
        "cutoff_len": args.max_length, "overwrite_cache": True, "output_dir": str(work / "lf" / "run"),
        "overwrite_output_dir": True, "per_device_train_batch_size": args.micro_batch,
        "gradient_accumulation_steps": 1, "num_train_epochs": float(args.epochs), "learning_rate": args.lr,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.05, "weight_decay": 0.01,  # torch AdamW's default, as the recipe
        "max_grad_norm": 0.0,  # the recipe clips nothing
        "optim": "adamw_torch", "seed": args.seed, "bf16": False, "fp16": False,
        "disable_gradient_checkpointing": True,  # LLaMA-Factory's default recomputes activations; the recipe does not
        "logging_steps": 10, "save_strategy": "no", "report_to": "none", "plot_loss": False,
        "dataloader_num_workers": 0,
    }
    path = work / "lf" / "train.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))  # JSON scalars are YAML
    return path


def bin_of(venv: str, name: str) -> str:
    return str(Path(venv) / "bin" / name)


def commands(work: Path, data: Path, yaml: Path, args) -> dict[str, list[str]]:
    """Each side's command: the recipe's as the lesson's `%launch` cell prints it on this machine (07b's line with
    one process, through the series' normaliser: bench.py's terminal_line), run in bash as a terminal runs it."""
    sys.path.insert(0, str(ROOT / "bench"))
    import nbtools
    from bench import terminal_line

    written = (f"accelerate launch --num_processes 1 --num_cpu_threads_per_process {args.threads} --mixed_precision no "
               f"{RECIPE} --base base --data {data} --out run --epochs {args.epochs} --micro_batch {args.micro_batch} "
               f"--max_length {args.max_length} --lr {args.lr} --seed {args.seed} --r {args.r} --alpha {args.alpha}"
               + (f" --targets {args.targets}" if args.targets else ""))
    line = terminal_line("launch", written, nbtools.detect(), "auto", work)
    return {"recipe": ["bash", "-c", line], "llamafactory": [bin_of(args.lf_venv, "llamafactory-cli"), "train", str(yaml)]}


def run_once(side: str, cmd: list[str], work: Path, tag: str, args) -> dict:
    trace = work / "traces" / tag
    trace.parent.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(work / "tracer"), "BENCH_TRACE": str(trace),
           "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(args.recipe_venv) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}  # an activated venv
    env.pop("VIRTUAL_ENV", None)
    shutil.rmtree(work / "run", ignore_errors=True)
    shutil.rmtree(work / "lf" / "run", ignore_errors=True)
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall, after = time.time() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # every process of the command
    (work / "traces" / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"{side} failed (exit {proc.returncode}): {shlex.join(cmd)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    found = sorted(trace.parent.glob(f"{tag}.*.json"))
    if len(found) != 1:
        raise SystemExit(f"{side}: expected one process that stepped an optimizer, found {len(found)} traces")
    t = json.loads(found[0].read_text())
    steps = t["steps"]
    (t1, n1, _, c1, h1), (tn, nn, pn, cn, hn) = steps[WARMUP_STEPS - 1], steps[-1]
    out = {"side": side, "wall_s": wall, "cpu_s": cpu, "steps": len(steps), "trained_tokens": nn, "positions": pn,
           "threads": t["threads"], "startup_s": t["first_forward"] - start, "loop_s": tn - t["first_forward"],
           "after_loop_s": start + wall - tn, "launcher_s": t["start"] - start, "process_startup_s": t["first_forward"] - t["start"],
           "script_tail_s": t["exit"] - tn, "exit_s": start + wall - t["exit"], "steady_s": tn - t1, "steady_trained_tokens": nn - n1,
           "trained_tokens_per_s": (nn - n1) / (tn - t1), "trained_tokens_per_cpu_s": (nn - n1) / (cn - c1),
           "trained_tokens_per_thread_cpu_s": (nn - n1) / (hn - h1), "cpu_per_wall": (cn - c1) / (tn - t1), "step_ms": 1000 * (tn - t1) / (len(steps) - WARMUP_STEPS)}
    kv = dict(w.split("=", 1) for line in proc.stdout.splitlines() for w in line.split() if "=" in w)
    if side == "recipe":  # the recipe's own report: examples cut at max_length, its tokens/s (attention-mask tokens)
        out.update(truncated=kv.get("truncated"), own_tokens_per_s=kv.get("tokens_per_s"))
    return out


def versions(venv: str) -> dict:
    code = ("import importlib.metadata as m, json, platform\nv = {'python': platform.python_version()}\n"
            "for p in ('torch', 'transformers', 'peft', 'accelerate', 'datasets', 'trl', 'tokenizers', 'llamafactory'):\n"
            "    try: v[p] = m.version(p)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(v))")
    return json.loads(subprocess.run([bin_of(venv, "python"), "-c", code], capture_output=True, text=True, check=True).stdout)


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform()}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="bench-out")
    p.add_argument("--pairs", type=int, default=3, help="timed (recipe, LLaMA-Factory) pairs, order alternating")
    p.add_argument("--lf-venv", default=os.environ.get("LF_VENV", ".venv-lf"), help="a venv with llamafactory")
    p.add_argument("--recipe-venv", default=str(Path(sys.executable).parent.parent), help="the recipe's venv")
    p.add_argument("--form", choices=["messages", "alpaca"], default="messages", help="the data file's form")
    p.add_argument("--examples", type=int, default=240, help="conversations (or Alpaca rows) in the data file")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--micro_batch", type=int, default=4, help="examples per optimizer step (1 process, no accumulation)")
    p.add_argument("--max_length", type=int, default=128, help="the recipe's --max_length, LLaMA-Factory's cutoff_len")
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--targets", default="", help="empty: every Linear but the output layer (both sides)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads of each side (OMP_NUM_THREADS)")
    p.add_argument("--hidden", type=int, default=0, help="the tiny Qwen2's hidden size (0: save_base's default)")
    p.add_argument("--layers", type=int, default=0, help="its layers (0: save_base's default)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed first run of each side")
    p.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    p.add_argument("--smoke", action="store_true", help="1 pair of 8 steps, no warm-up: checks the wiring")
    p.add_argument("--notebooks", default=str(NOTEBOOKS), help="where 07 and 07b are read (another checkout's)")
    args = p.parse_args(argv)
    if args.smoke:
        args.pairs, args.examples, args.epochs, args.no_warmup = 1, 32, 1, True
    if not Path(bin_of(args.lf_venv, "llamafactory-cli")).exists():
        raise SystemExit(f"no llamafactory-cli in {args.lf_venv}: python3.11 -m venv {args.lf_venv} && "
                         f"{args.lf_venv}/bin/pip install llamafactory (see bench/README.md)")
    out_dir = Path(args.output).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-lf-"))
    load_start = os.getloadavg()
    try:
        written = write_recipe(work, Path(args.notebooks))
        data, texts = make_data(work, args)
        shape = {k: v for k, v in (("hidden", args.hidden), ("layers", args.layers)) if v}
        base = save_base(str(work / "base"), [t["text"] for t in texts] + [INSTRUCTION], arch="qwen2", seed=args.seed,
                         **shape)
        # Saved again as the recipe's transformers loads it (Qwen2Tokenizer: Qwen's digit-splitting pre-tokenizer in
        # tokenizer.json, tokenizer_class Qwen2Tokenizer), as a downloaded Qwen2.5 folder is: LLaMA-Factory's
        # transformers 5.6 reads save_base's folder as a plain TokenizersBackend without that split, 5.25 rebuilds
        # Qwen's; the two sides would otherwise train on different token sequences.
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained(work / "base").save_pretrained(work / "base")
        yaml = lf_config(work, data, args)
        (work / "tracer").mkdir()
        (work / "tracer" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        cmds = commands(work, data, yaml, args)
        print(f"work folder {work}; {', '.join(written)} from the notebooks; base {base}")
        for side, cmd in cmds.items():
            print(f"{side}: {shlex.join(cmd)}")
        if not args.no_warmup:
            for side in cmds:
                run_once(side, cmds[side], work, f"warmup-{side}", args)
        rounds = []
        for i in range(args.pairs):
            order = list(cmds) if i % 2 == 0 else list(cmds)[::-1]
            for side in order:
                r = run_once(side, cmds[side], work, f"pair{i}-{side}", args)
                rounds.append({"pair": i, **r})
                print(f"pair {i} {side:12s} wall {r['wall_s']:6.1f} s  steps {r['steps']}  trained tokens "
                      f"{r['trained_tokens']}  positions {r['positions']}  {r['trained_tokens_per_s']:7.0f} trained tok/s ({r['trained_tokens_per_cpu_s']:.0f} per CPU s)  "
                      f"{r['step_ms']:.1f} ms/step  CPU {r['cpu_s']:.1f} s  start-up {r['startup_s']:.1f} s  after {r['after_loop_s']:.1f} s",
                      flush=True)
        result = summarise(rounds, args, load_start, cmds, written)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    (out_dir / "finetune-vs-llamafactory.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    table = markdown(result)
    (out_dir / "finetune-vs-llamafactory.md").write_text(table)
    print(table)
    return 0


KEYS = [("trained_tokens_per_s", "trained tokens per second (steps 3..N)", "{:.0f}"),
        ("trained_tokens_per_cpu_s", "trained tokens per CPU second of the process (steps 3..N)", "{:.0f}"),
        ("cpu_per_wall", "  its CPU share over those steps (the machine's load decides it)", "{:.2f}"),
        ("wall_s", "end to end, s (the launch command)", "{:.1f}"),
        ("cpu_s", "end to end, CPU s (all its processes)", "{:.1f}"),
        ("startup_s", "  start-up to the first training forward, s", "{:.1f}"),
        ("launcher_s", "    of which before the training process starts (the launcher), s", "{:.1f}"),
        ("process_startup_s", "    of which in it: imports, data, model, to the first forward, s", "{:.1f}"),
        ("loop_s", "  training loop, s (first forward to last step)", "{:.2f}"),
        ("after_loop_s", "  after the last step, s", "{:.1f}"),
        ("script_tail_s", "    of which the script's own (saving; the recipe's probe), s", "{:.1f}"),
        ("exit_s", "    of which exits (interpreter, launcher), s", "{:.1f}"),
        ("step_ms", "ms per optimizer step (steps 3..N)", "{:.1f}"),
        ("trained_tokens", "trained tokens (label != -100), whole run", "{:.0f}"),
        ("positions", "positions computed (padding included), whole run", "{:.0f}")]


def summarise(rounds: list[dict], args, load_start, cmds, written) -> dict:
    by = {s: [r for r in rounds if r["side"] == s] for s in ("recipe", "llamafactory")}
    med = {s: {k: median(rs, k) for k, _, _ in KEYS} for s, rs in by.items()}
    ratio = {k: med["recipe"][k] / med["llamafactory"][k] for k, _, _ in KEYS if med["llamafactory"][k]}
    return {"settings": {k: v for k, v in vars(args).items()}, "commands": {s: shlex.join(c) for s, c in cmds.items()},
            "recipe_files": written, "medians": med, "ratio_recipe_over_llamafactory": ratio,
            "pair_ratios_tokens_per_s": [a["trained_tokens_per_s"] / b["trained_tokens_per_s"]
                                         for a, b in zip(by["recipe"], by["llamafactory"])],
            "pair_ratios_wall": [a["wall_s"] / b["wall_s"] for a, b in zip(by["recipe"], by["llamafactory"])],
            "pair_ratios_tokens_per_cpu_s": [a["trained_tokens_per_cpu_s"] / b["trained_tokens_per_cpu_s"]
                                             for a, b in zip(by["recipe"], by["llamafactory"])],
            "pair_ratios_cpu_s": [a["cpu_s"] / b["cpu_s"] for a, b in zip(by["recipe"], by["llamafactory"])],
            "rounds": rounds, "versions": {"recipe": versions(args.recipe_venv), "llamafactory": versions(args.lf_venv)},
            "machine": machine(), "load_start": load_start, "load_end": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def markdown(res: dict) -> str:
    med, ratio, s = res["medians"], res["ratio_recipe_over_llamafactory"], res["settings"]
    lines = [f"LoRA fine-tune: the recipe (07b's {RECIPE}) vs LLaMA-Factory, medians of {s['pairs']} alternating pairs "
             f"({s['examples']} {s['form']} examples, {s['epochs']} epochs, batch {s['micro_batch']}, max_length "
             f"{s['max_length']}, r={s['r']}, alpha={s['alpha']}, {s['threads']} thread(s) each)", "",
             "| measure | recipe | LLaMA-Factory | recipe / LLaMA-Factory |", "|---|---|---|---|"]
    for k, label, fmt in KEYS:
        lines.append(f"| {label} | {fmt.format(med['recipe'][k])} | {fmt.format(med['llamafactory'][k])} | "
                     f"{ratio.get(k, float('nan')):.2f}x |")
    v = res["versions"]
    lines += ["", "tokens/s ratio per pair: " + ", ".join(f"{x:.2f}" for x in res["pair_ratios_tokens_per_s"])
              + "; per CPU second: " + ", ".join(f"{x:.2f}" for x in res["pair_ratios_tokens_per_cpu_s"]),
              "end-to-end ratio per pair: " + ", ".join(f"{x:.2f}" for x in res["pair_ratios_wall"])
              + "; CPU seconds: " + ", ".join(f"{x:.2f}" for x in res["pair_ratios_cpu_s"]),
              "recipe: " + ", ".join(f"{k} {x}" for k, x in v["recipe"].items()),
              "LLaMA-Factory: " + ", ".join(f"{k} {x}" for k, x in v["llamafactory"].items()),
              f"machine: {res['machine']['cpu']}, {res['machine']['cores']} cores; load "
              f"{' '.join(f'{x:.2f}' for x in res['load_start'])} at start, "
              f"{' '.join(f'{x:.2f}' for x in res['load_end'])} at end; {res['date']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
