"""Checks `tinygpt chat` against Hugging Face transformers: chat templates rendered byte for byte as
apply_chat_template(..., add_generation_prompt=True) renders them, and a greedy reply equal to transformers'.

Templates: SmolLM2's, Qwen2.5's, Llama 3's and Llama 3.2's (tests/reference/chat_templates/, as the models' own
tokenizer_config.json files hold them) and ChatML (tinygpt's built-in `chatml`). Each travels into a tinygpt run the
way a user's does: a small LlamaForCausalLM with random weights is saved with a byte-level BPE (trained here, with the
families' special tokens added) and the template in its tokenizer_config.json, then `tinygpt import --format hf`.
For each template, 20 conversations (system prompts or none, several turns, unicode, empty content, spaces to trim)
are rendered by `tinygpt chat --messages FILE --render-only` and by transformers; then for two conversations per
template the greedy reply of `tinygpt chat --message` equals the text transformers' generate(do_sample=False) gives
for the same rendered conversation (its tokens cut at the template's end of turn). Then the 20 conversations, each
given a reply, as an SFT file: `tinygpt eval --chat-data` gives transformers' loss with labels -100 outside the
assistants' tokens (found on the rendered text, mapped to tokens by the tokenizer's offsets) within 1e-4, over as many
tokens.

Run by developers, not by CI (it needs PyTorch and transformers, installed outside the source tree):

  python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers
  /tmp/venv-hf/bin/python tests/reference/check_chat.py [--build build]

Exit status: 0 all checks pass, 1 a check fails or a tinygpt command errs, 77 PyTorch or transformers is missing.
"""
import json
import pathlib
import subprocess
import sys
import tempfile

try:
    import tokenizers
    import torch
    import transformers
    from transformers import AutoTokenizer
except ImportError as e:
    print(f"skipped: {e.name} is not installed (python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch "
          "transformers)")
    sys.exit(77)

sys.dont_write_bytecode = True  # nothing written into the source tree
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from check_hf_export import parse_args, run  # noqa: E402
from check_hf_import import token_bytes  # noqa: E402

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# name: (template source, bos, eos, the text ending an assistant's turn)
TEMPLATES = {
    "smollm2": ((HERE / "chat_templates" / "smollm2.jinja").read_text(), "<|im_start|>", "<|im_end|>", "<|im_end|>"),
    "qwen2.5": ((HERE / "chat_templates" / "qwen2.5.jinja").read_text(), None, "<|im_end|>", "<|im_end|>"),
    "llama3": ((HERE / "chat_templates" / "llama3.jinja").read_text(), "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>"),
    "llama3.2": ((HERE / "chat_templates" / "llama3.2.jinja").read_text(), "<|begin_of_text|>", "<|eot_id|>",
                 "<|eot_id|>"),
    "chatml": (CHATML, None, "<|im_end|>", "<|im_end|>"),
}


def conversations():
    s = lambda c: {"role": "system", "content": c}  # noqa: E731
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    return [
        [u("Hello!")],
        [s("You are terse."), u("What is 2+2?")],
        [u("Hi"), a("Hello, how can I help?"), u("Tell me a joke.")],
        [s("Be kind."), u("One"), a("Two"), u("Three"), a("Four"), u("Five")],
        [u("Ünïcödé: 日本語, emoji 🙂, Ελληνικά")],
        [s("Système: réponds en français."), u("Bonjour, ça va ?")],
        [u("")],
        [s(""), u("An empty system prompt")],
        [u("   spaces around   ")],
        [s("  padded system  "), u("\n\nnewlines first\n\n")],
        [u("tabs\tinside\tand a trailing tab\t")],
        [u("Quote ' and \" and backslash \\ and braces {{ }} {% %}")],
        [u("Hi"), a(""), u("You said nothing?")],
        [u("Line one\nLine two\nLine three")],
        [s("You are a pirate."), u("Where is the treasure?"), a("Arr, under the palm."), u("Which palm?")],
        [u("<|im_start|> is a token here")],
        [u("A long message " * 40)],
        [s("Only a system prompt and a user"), u("x")],
        [u("first"), a("second "), u(" third"), a(" fourth "), u("fifth")],
        [u("\u00a0non-breaking spaces\u00a0")],
    ]


def assistant_labels(hf_tok, conv, end):
    """The ids of the conversation rendered whole and its labels as an SFT trainer sets them: each reply's tokens (what
    rendering up to it adds after the assistant's opening, through its end of turn) kept, -100 elsewhere; the spans
    found on the text and mapped to tokens through the tokenizer's offsets."""
    whole = hf_tok.apply_chat_template(conv, tokenize=False)
    spans = []
    for k, m in enumerate(conv):
        if m["role"] != "assistant":
            continue
        opening = hf_tok.apply_chat_template(conv[:k], tokenize=False, add_generation_prompt=True) if k else ""
        closed = hf_tok.apply_chat_template(conv[:k + 1], tokenize=False)
        at = closed.find(end, len(opening))
        spans.append((len(opening), at + len(end) if at >= 0 else len(closed)))
    enc = hf_tok(whole, add_special_tokens=False, return_offsets_mapping=True)
    labels = [i if any(a <= s0 and e0 <= b for a, b in spans) else -100
              for i, (s0, e0) in zip(enc["input_ids"], enc["offset_mapping"])]
    return enc["input_ids"], labels


def check_sft_loss(tinygpt, model, hf_tok, name, convs, tmp):
    """tinygpt's eval --chat-data loss and assistant-token count against transformers' loss with labels -100 outside
    the assistants' tokens, token-weighted over the conversations."""
    path = tmp / f"{name}-sft.jsonl"
    path.write_text("".join(json.dumps({"messages": c}, ensure_ascii=False) + "\n" for c in convs))
    out = run(tinygpt, "eval", "--ckpt", tmp / name, "--chat-data", path, "--batch-size", 4)
    ours, ours_n = float(out.split()[2]), int(out.split()[4])
    total, count = 0.0, 0
    with torch.no_grad():
        for c in convs:
            ids, labels = assistant_labels(hf_tok, c, TEMPLATES[name][3])
            n = sum(1 for x in labels[1:] if x != -100)  # the first token is never a target
            if n == 0:
                continue
            loss = model(torch.tensor([ids]), labels=torch.tensor([labels])).loss.item()
            total, count = total + loss * n, count + n
    theirs = total / count
    ok = abs(ours - theirs) <= 1e-4 and ours_n == count
    print(f"{name:<9} sft loss on the replies: tinygpt {ours:.6f} over {ours_n} tokens, transformers {theirs:.6f} over "
          f"{count}: {'same' if ok else 'DIFFER'}")
    return ok


def make_tokenizer(tinygpt, data, tmp):
    """A byte-level BPE trained by tinygpt, with the families' special tokens added (ids after its own)."""
    path = tmp / "bpe.json"
    run(tinygpt, "tokenizer", "train", "--data", data, "--vocab-size", 512, "--out", path)
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.add_special_tokens(SPECIALS)
    return tok


def make_run(tinygpt, tok, name, tmp):
    """A random LlamaForCausalLM saved with the tokenizer and template `name`, imported as a tinygpt run."""
    source, bos, eos, _ = TEMPLATES[name]
    hf_dir = tmp / f"{name}-hf"
    hf_dir.mkdir()
    tok.save(str(hf_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "chat_template": source, "eos_token": eos}
    if bos:
        config["bos_token"] = bos
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(len(name))
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(hf_dir)
    run(tinygpt, "import", "--format", "hf", "--from", hf_dir, "--out", tmp / name)
    return model, AutoTokenizer.from_pretrained(hf_dir)


def main():
    args, build = parse_args(__doc__)
    tinygpt = build / "tinygpt"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"tinygpt {run(tinygpt, '--version').strip()}")
    convs = conversations()
    ok = True
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        tok = make_tokenizer(tinygpt, args.data, tmp)
        for name in TEMPLATES:
            model, hf_tok = make_run(tinygpt, tok, name, tmp)
            same = 0
            for k, conv in enumerate(convs):
                path = tmp / f"{name}-{k}.json"
                path.write_text(json.dumps(conv, ensure_ascii=False))
                ours = run(tinygpt, "chat", "--ckpt", tmp / name, "--messages", path, "--render-only")
                theirs = hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
                if ours == theirs:
                    same += 1
                else:
                    print(f"  {name} conversation {k}: tinygpt {ours!r}\n  {' ' * len(name)} transformers {theirs!r}")
            replies = 0
            for k in (1, 2):  # history from --messages, the last user turn answered greedily
                conv = convs[k]
                path = tmp / f"{name}-history-{k}.json"
                path.write_text(json.dumps(conv[:-1], ensure_ascii=False))
                ours = subprocess.run([str(x) for x in (tinygpt, "chat", "--ckpt", tmp / name, "--messages", path,
                                      "--message", conv[-1]["content"], "--temperature", 0, "--max-new-tokens", 24)],
                                      check=True, capture_output=True).stdout  # bytes: a token may hold part of one
                ids = hf_tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, return_dict=False)
                if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                    ids = ids["input_ids"]
                with torch.no_grad():
                    out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                         pad_token_id=0)
                text = token_bytes(tok, out[0, len(ids):].tolist())
                text = text.split(TEMPLATES[name][3].encode())[0]
                if ours == text + b"\n":
                    replies += 1
                else:
                    print(f"  {name} reply {k}: tinygpt {ours!r}\n  {' ' * len(name)} transformers {text!r}")
            replied = [c + [{"role": "assistant", "content": f"Reply {k}: ok, noted."}] for k, c in enumerate(convs)]
            sft_ok = check_sft_loss(tinygpt, model, hf_tok, name, replied, tmp)
            passed = same == len(convs) and replies == 2 and sft_ok
            ok = ok and passed
            print(f"{name:<9} rendered {same}/{len(convs)} conversations as transformers; greedy replies {replies}/2 "
                  f"the same")
    print("chat templates checked: tinygpt renders and replies as transformers" if ok else "FAIL: a check differs")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
