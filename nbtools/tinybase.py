"""What a lesson rebuilds offline in seconds: a stand-in for a downloaded chat model (``save_base``: a tiny Llama
with a character tokenizer, or Qwen2 with a byte-level BPE tokenizer and Qwen's chat template, saved as a Hugging
Face folder that ``from_pretrained`` loads like a real one), and another lesson's scripts (``lesson_scripts``:
07b, 08b and 09b write 07's, 08's and 09's ``%%writefile`` cells as those lessons do, without running them)."""

from __future__ import annotations

from pathlib import Path

from .errors import ParameterError
from .lang import DEFAULT, current, msg

# A conversation as text; add_generation_prompt ends a prompt where the assistant's answer starts.
LLAMA_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}\n"
    "{% else %}<|assistant|>{{ m['content'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
QWEN_TEMPLATE = (  # Qwen2.5's, without tools: a default system turn, then <|im_start|>role ... <|im_end|>
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer(texts: list[str], arch: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if arch == "llama":  # one token per character
        special = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>"]
        core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(special + sorted(set("".join(texts) + "\n")))},
                                          unk_token="<unk>"))
        core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        core.decoder = decoders.Fuse()
        names = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    else:  # Qwen's kind: byte-level BPE (transformers 5's Qwen2Tokenizer rebuilds it from vocab and merges)
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        core = Tokenizer(models.BPE())
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        core.decoder = decoders.ByteLevel()
        core.train_from_iterator(texts + ["system user assistant You are a helpful assistant."], trainers.BpeTrainer(
            vocab_size=600, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        names = {"pad_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, additional_special_tokens=special[-2:], **names)
    tokenizer.chat_template = LLAMA_TEMPLATE if arch == "llama" else QWEN_TEMPLATE
    return tokenizer


SHAPE = {"layers": 2, "kv_heads": 4, "hidden": 64, "intermediate": 128}  # save_base's defaults, each overridable


def save_base(out: str, texts: list[str], *, arch: str = "llama", seed: int = 0, **shape: int) -> str:
    """Make and save the folder (``shape``: any of SHAPE's keys); returns a one-line summary (vocabulary,
    parameters)."""
    import transformers

    if unknown := sorted(set(shape) - set(SHAPE)):
        raise ParameterError(f"save_base: unknown shape {unknown}; known: {sorted(SHAPE)}")
    size = {**SHAPE, **shape}
    tokenizer = _tokenizer(texts, arch)
    transformers.set_seed(seed)
    config = getattr(transformers, "LlamaConfig" if arch == "llama" else "Qwen2Config")(
        vocab_size=len(tokenizer), hidden_size=size["hidden"], intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"], num_attention_heads=4, num_key_value_heads=size["kv_heads"],
        max_position_embeddings=256, tie_word_embeddings=False,
        initializer_range=0.2,  # transformers' 0.02 leaves a random frozen model too flat for LoRA to steer
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # tokenizer.json, tokenizer_config.json and the chat template
    return f"{arch}: vocab={len(tokenizer)} parameters={sum(p.numel() for p in model.parameters())}"


def lesson_scripts(lesson: str, *names: str) -> None:
    """Write the ``%%writefile`` cells of ``notebooks/<lesson>.ipynb`` that save ``names`` into the current folder
    (``notebooks/en/<lesson>.ipynb``'s in an English notebook)."""
    import nbformat

    # the series' own notebooks, beside the package (installed with `pip install -e .`), in the learner's language
    folder = Path(__file__).resolve().parent.parent / "notebooks"
    folder = folder / current() if current() != DEFAULT and (folder / current() / f"{lesson}.ipynb").is_file() else folder
    cells = nbformat.read(folder / f"{lesson}.ipynb", as_version=4).cells
    found = {c.source.split("\n", 1)[0].split()[-1]: c.source.split("\n", 1)[1] for c in cells
             if c.cell_type == "code" and c.source.startswith("%%writefile ")}
    if missing := [n for n in names if n not in found]:
        raise ParameterError(msg("tinybase.missing", lesson=lesson, names=", ".join(missing)))
    for name in names:
        Path(name).write_text(found[name] + "\n", encoding="utf-8")
        print(msg("tinybase.wrote", name=name, lines=len(found[name].splitlines()), lesson=lesson))
