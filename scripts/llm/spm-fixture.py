#!/usr/bin/env python3
"""Generates the SentencePiece (`tokenizer.ggml.model = "llama"`) tokenizer fixtures.

No real Llama 2 / Mistral / Gemma vocabulary can be fetched offline, so this script makes one:
it trains a small BPE SentencePiece model (byte fallback, digits split, identity
normalization, no whitespace collapsing: Llama 2's settings) on a multilingual text it writes
itself, with control symbols (`<start_of_turn>`, `<end_of_turn>`) and user-defined symbols,
and writes it as two vocabulary-only GGUF files, as llama.cpp's `_set_vocab_sentencepiece`
converts a `tokenizer.model`:

- `spm-prefix.gguf`: no `tokenizer.ggml.add_space_prefix` key (llama.cpp's default for
  "llama", true: Llama 2 / Mistral);
- `spm-noprefix.gguf`: `add_space_prefix = false` (as Gemma's GGUFs write it).

Then it tokenizes 300+ strings with llama.cpp's `llama-tokenize` (the reference), with special
parsing off (`ids`) and on (`ids_special`), no BOS, and writes `spm-prefix.json` /
`spm-noprefix.json`:

    {"model": ..., "reference": "llama.cpp <tag> llama-tokenize",
     "cases": [{"text": ..., "ids": [...], "ids_special": [...], "decoded": ...}, ...]}

`decoded` is sentencepiece's own `decode(ids)` (for the no-prefix file, of the same model with
`add_dummy_prefix` off): what decoding `ids` must give. It is the text itself except where the
text holds `▁` (a space once decoded) or a user-defined symbol (after which llama.cpp's
tokenizer inserts a prefix space).

It also cross-checks llama.cpp's `ids` against sentencepiece's own `encode` and prints how
many agree. They differ, as documented in llama.cpp (src/llama-vocab.cpp, "prefix with space
if previous is special"), where the text holds a user-defined symbol: llama.cpp splits the
text at special tokens first and tokenizes each piece on its own, with a space prefix, while
sentencepiece matches the symbol inside one pass.

The files in crates/llm/tests/fixtures/ were made with:

    .venv/bin/pip install sentencepiece   # not needed by the tests themselves
    .venv/bin/python scripts/llm/spm-fixture.py \\
        --bin /root/.cache/modelmux/llama.cpp/b11434/bin \\
        --out crates/llm/tests/fixtures

Training is single-threaded and the strings come from a fixed seed, so a rerun against the
same llama.cpp and sentencepiece (0.2.x) gives the same files.
"""

import argparse
import io
import json
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import gguf
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

SEED = 20250301
VOCAB_SIZE = 1200
CONTROL = ["<start_of_turn>", "<end_of_turn>"]
USER_DEFINED = ["<tool>", "::", "of_turn"]

# llama.cpp's token types (tokenizer.ggml.token_type).
NORMAL, UNKNOWN, CONTROL_TYPE, USER_DEFINED_TYPE, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def corpus():
    """The training text: a few languages, code and whitespace, repeated with variations."""
    base = [
        "The quick brown fox jumps over the lazy dog.",
        "Machine learning models are trained on large amounts of data.",
        "Hello world! How are you today? I am fine, thank you.",
        "Once upon a time, in a land far away, there lived a small dragon named Pip.",
        "What is the capital of France? The capital of France is Paris.",
        "Le café est très chaud, mais la crème brûlée est délicieuse.",
        "Où est la bibliothèque ? Elle est à côté de l'église, près du marché.",
        "Les élèves étudient le français, l'histoire et les mathématiques.",
        "Der schnelle braune Fuchs springt über den faulen Hund.",
        "Die Straße ist groß, und die Bäume sind grün. Schöne Grüße aus München!",
        "Ich möchte ein Glas Wasser, bitte. Danke schön.",
        "今天天气很好，我们去公园散步吧。",
        "机器学习模型需要大量的数据进行训练。",
        "東京は日本の首都です。こんにちは、元気ですか？",
        "안녕하세요, 만나서 반갑습니다.",
        "Привет, как дела? Всё хорошо, спасибо.",
        "Emoji: 😀 👍 🎉 🚀 are fun 😀😀",
        "def hello(name):\n    print(f\"Hello, {name}!\")\n    return None\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += values[i];\n}\n",
        "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n",
        "std::vector<int> xs; std::string name = \"modelmux\";",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "{\"name\": \"modelmux\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"serving\"]}",
        "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1,000,000",
        "    indented with four spaces\n        and eight\n",
        "a  b   c    d     e\t\tf\n\ng",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
        "<tool> call the weather tool </tool>",
    ]
    rng = random.Random(SEED)
    lines = []
    for i in range(400):
        a, b = rng.choice(base), rng.choice(base)
        lines.append(a if i % 3 else f"{a} {b}")
    return lines


def train():
    """The SentencePiece model's serialized proto."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        character_coverage=0.995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        control_symbols=CONTROL,
        user_defined_symbols=USER_DEFINED,
        max_sentence_length=100000,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def processor(proto_bytes, add_dummy_prefix):
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(proto_bytes)
    proto.normalizer_spec.add_dummy_prefix = add_dummy_prefix
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(proto.SerializeToString())
    return sp


def write_gguf(path, sp, add_space_prefix):
    """A vocabulary-only GGUF of a tiny `llama` model (llama-tokenize loads the vocabulary
    only), its tokenizer written as llama.cpp's converter writes a SentencePiece one."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL_TYPE)
        elif sp.is_byte(i):
            types.append(BYTE)
        elif sp.is_unused(i):
            types.append(UNUSED)
        elif tokens[-1] in USER_DEFINED:
            # The converter takes these from added_tokens / tokenizer_config.json.
            types.append(USER_DEFINED_TYPE)
        else:
            types.append(NORMAL)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("spm-fixture")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if not add_space_prefix:
        w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cases():
    """The strings, in a stable order, without duplicates."""
    out = []
    add = out.extend

    add(["", " ", "  ", "   ", "a", "A", "\n", "\t", "\r\n", ".", "0", "▁", "▁▁", "_", "__"])
    add([
        "Hello", "Hello world", "Hello, world!", "hello world", "HELLO WORLD",
        "The quick brown fox jumps over the lazy dog.",
        "What is the capital of France?", "I think, therefore I am.",
        "Machine learning models are trained on large amounts of data.",
        "antidisestablishmentarianism", "Supercalifragilisticexpialidocious",
        "CamelCaseIdentifierName", "snake_case_identifier_name", "SCREAMING_SNAKE_CASE",
        "iPhone eBay McDonald O'Neill", "Mr. Smith went to Washington D.C. on Jan. 5th.",
        "it's", "don't", "you're", "I'm", "they'll", "can't won't shouldn't",
        "\"double quoted\"", "'single'", "it’s curly", "« guillemets »",
    ])
    # spaces: leading, trailing, multiple
    add([
        " Hello", "  Hello", "   Hello", "Hello ", "Hello  ", "Hello   ", " Hello ",
        "  Hello  world  ", "Hello  world", "Hello   world", "Hello    world",
        "a  b   c    d     e", " . , ; ", "word\u00a0with\u00a0nbsp", "ideographic\u3000space",
        "thin\u2009space", "x \u2581 y", "\u2581Hello", "Hello\u2581world", "\u2581 \u2581",
    ])
    for n in (2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 32, 33, 64):
        add([" " * n])
    for n in (1, 2, 3, 4, 7, 8):
        add(["x" + " " * n + "y"])
    add(["end with spaces" + " " * 9, " " * 9 + "start with spaces"])
    # tabs and newlines
    add([
        "Hello\tworld", "\tindented", "\t\tdouble indented", "trailing tab\t",
        "col1\tcol2\tcol3\n1\t2\t3\n", "line one\nline two", "line one\n\nline two",
        "line one\r\nline two", "line one\rline two", "\nleading newline",
        "trailing newline\n", "\n\n", "\n\n\n", " \n", "\n ", " \n \n ", "a \nb", "a\n b",
        "a\t\nb", "\t\n\t\n", "mixed \t \n \r\n whitespace", "\v\f vertical tab and form feed",
        "Paragraph one.\n\nParagraph two.\n\nParagraph three.",
    ])
    for n in (2, 3, 4, 8):
        add(["\t" * n, "x" + "\n" * n + "y"])
    # numbers (digits split)
    digits = "12345678901234567890123456789012345678901234567890"
    for n in (1, 2, 3, 4, 5, 8, 12, 20, 50):
        add([digits[:n]])
    add([
        "3.14159", "-42", "+42", "1e10", "0x1F", "0xDEADBEEF", "1/2", "50%", "$19.99",
        "€20,00", "£5", "¥1000", "v1.2.3", "2024-01-15", "2024-01-15T13:45:30Z", "13:45",
        "192.168.0.1", "127.0.0.1:8080", "(555) 123-4567", "It costs 1234 dollars.",
        "abc123def456", "x86_64", "１２３ full-width", "½ ¾ ⅓", "①②③", "² ³",
    ])
    # French, German, other scripts
    add([
        "Le café est très chaud.", "crème brûlée", "Où est la bibliothèque ?",
        "À bientôt, Hélène ! Ça va ?", "l'été, l'hiver, l'automne", "Noël à Château-Thierry",
        "œuvre, cœur, Œdipe", "ÉCOLE ÉLÉMENTAIRE", "naïve façade déjà vu",
        "e\u0301 combining acute", "Der schnelle braune Fuchs springt über den faulen Hund.",
        "Die Straße ist groß.", "Schöne Grüße aus München!", "Ärger Öl Übermut ß ẞ",
        "Donaudampfschifffahrtsgesellschaftskapitän", "Fußgängerübergänge",
        "今天天气很好", "机器学习模型需要大量的数据进行训练。", "中文，标点！",
        "東京は日本の首都です。", "こんにちは、元気ですか？", "カタカナ ひらがな 漢字",
        "안녕하세요", "만나서 반갑습니다.", "Привет, как дела?", "Всё хорошо, спасибо.",
        "Γειά σου Κόσμε", "שלום עולם", "مرحبا بالعالم", "नमस्ते दुनिया", "สวัสดีชาวโลก",
        "Tiếng Việt có dấu", "Iñtërnâtiônàlizætiøn", "中" * 20, "😀" * 10,
    ])
    # emoji: in the vocabulary or not (byte fallback)
    add([
        "😀", "👍", "🎉", "🚀", "🤖", "🦀", "🧠", "🫠", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "☕",
        "Emoji: 😀 👍 🎉 🚀", "I love 🦀 Rust", "🤖🤖🤖", "a😀b", " 😀 ", "😀\n😀",
        "flags 🇫🇷🇩🇪🇯🇵", "skin 👍🏽", "math 𝔸𝔹ℂ 𝕏", "old 𐍈 gothic", "\U0010FFFD private",
        "\u200b zero width", "\ufeffBOM", "\u0000 nul", "\x01\x02\x7f controls",
    ])
    # code
    add([
        "def hello(name):\n    print(f\"Hello, {name}!\")\n    return None\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += values[i];\n}\n",
        "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n}\n",
        "std::vector<int> xs;", "std::string name = \"modelmux\";", "a::b::c", "::", "::::",
        ": :", "Foo::new()", "SELECT id, name FROM users WHERE age >= 18;",
        "{\"name\": \"modelmux\", \"tags\": [\"llm\"]}", "<div><span>nested</span></div>",
        "#!/usr/bin/env bash\nset -euo pipefail\n", "x=1;y=2;z=x+y", "a==b&&c!=d||e<=f",
        "    four spaces indent", "\t\ttwo tabs indent", "if x:\n\tpass\nelse:\n    pass",
        "https://example.com/path?q=1&r=two#frag", "user@example.com", "C:\\Users\\file.txt",
        "!@#$%^&*()_+-=[]{}|;':\",./<>?`~", "...", "…", "---", "—", "==========",
    ])
    # the special symbols inside text
    add([
        "<start_of_turn>", "<end_of_turn>", "<start_of_turn>user\nHi<end_of_turn>\n",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
        "<start_of_turn><end_of_turn>", "<start_of_turn> <end_of_turn>",
        " <start_of_turn>", "<start_of_turn> ", "a<end_of_turn>b", "a <end_of_turn> b",
        "<end_of_turn><end_of_turn>", "<start_of_turn", "start_of_turn>", "<end_of_turn",
        "<s>", "</s>", "<unk>", "<s>Hello</s>", "a<s>b", "<0x41>", "<0xFF>", "<0x0A>",
        "<tool>", "</tool>", "<tool>weather</tool>", "call <tool> now", "<tool><tool>",
        " <tool>", "<tool> ", "x<tool>y", "of_turn", "end of_turn", "<start_of_turn>of_turn",
        "of_turnof_turn", "std::of_turn", "::<tool>::", "<<tool>>", "<tool",
        "Hi<end_of_turn>\n<start_of_turn>system\nYou obey.<end_of_turn>\n",
    ])
    # longer text
    add([
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua. " * 3,
        "word " * 40, "na" * 30 + " Batman!", "a" * 100, "ab" * 50, " a" * 50,
    ])

    rng = random.Random(SEED)
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
        " " * 6 + "\t\n", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "éèêëàâäôöûüçñßøåæœ",
        "абвгдежзийклмнопрстуфхцчшщыэюя", "的一是不了在人有我他这中大来上国个到说们",
        "あいうえおかきくけこアイウエオ", "가나다라마바사", "😀😂🥲😍🤖👍🔥🎉🚀💡", "\u2581",
    ]
    words = ["the", "model", "token", "I'm", "don't", "42", "3.14", "  ", "\n", "café",
             "中文", "<start_of_turn>", "<end_of_turn>", "<tool>", "::", "of_turn", "😀", "\t",
             "Straße", "...", "Hello", "WORLD", "<s>", "▁"]
    for _ in range(40):
        n = rng.randint(1, 40)
        weights = [rng.random() for _ in pools]
        add(["".join(rng.choice(rng.choices(pools, weights)[0]) for _ in range(n))])
    for _ in range(40):
        n = rng.randint(2, 15)
        sep = rng.choice(["", " ", " ", "  ", "\n", "\t"])
        add([sep.join(rng.choice(words) for _ in range(n))])

    seen, unique = set(), []
    for t in out:
        if t not in seen:
            seen.add(t)
            unique.append(t)
    return unique


def tokenize(tool, path, text, parse_special):
    cmd = [tool, "-m", path, "--stdin", "--no-escape", "--ids", "--no-bos", "--log-disable"]
    if not parse_special:
        cmd.append("--no-parse-special")
    res = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}) for {text!r}:\n"
                           f"{res.stderr.decode(errors='replace')}")
    lines = [line for line in res.stdout.decode().splitlines() if re.fullmatch(r"\[[0-9, ]*\]", line)]
    if len(lines) != 1:
        raise RuntimeError(f"unexpected llama-tokenize output for {text!r}: {res.stdout!r}")
    return json.loads(lines[0])


def llama_version(tool):
    res = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    out = res.stdout + res.stderr
    m = (re.search(r"\(build (\d+), commit ([^)]*)\)", out)
         or re.search(r"version: (\d+) \(([^)]*)\)", out))
    if not m:
        raise RuntimeError(f"cannot read the llama.cpp version from {tool} --version: {out!r}")
    number, commit = m.groups()
    tag = f"b{number}"
    return tag if commit in (tag, "unknown") else f"{tag} ({commit})"


def dumps(obj):
    # ASCII escapes keep invisible characters visible; one case per line keeps diffs readable.
    return json.dumps(obj, ensure_ascii=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="llama.cpp bin dir (holding llama-tokenize)")
    ap.add_argument("--out", required=True, help="directory for the GGUF and JSON files")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()

    tool = os.path.join(args.bin, "llama-tokenize")
    reference = f"llama.cpp {llama_version(tool)} llama-tokenize"
    proto = train()
    texts = cases()
    os.makedirs(args.out, exist_ok=True)
    for name, prefix in (("spm-prefix", True), ("spm-noprefix", False)):
        sp = processor(proto, prefix)
        path = os.path.join(args.out, f"{name}.gguf")
        write_gguf(path, sp, prefix)

        def one(text, path=path):
            return {"text": text,
                    "ids": tokenize(tool, path, text, parse_special=False),
                    "ids_special": tokenize(tool, path, text, parse_special=True)}

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, texts))
        agree, differ = 0, []
        for case in results:
            case["decoded"] = sp.decode(case["ids"])
            if sp.encode(case["text"]) == case["ids"]:
                agree += 1
            else:
                differ.append(case["text"])
        header = {"model": f"{name}.gguf (scripts/llm/spm-fixture.py, sentencepiece "
                           f"{spm.__version__}, add_space_prefix {str(prefix).lower()})",
                  "reference": reference}
        lines = ["{"] + [f"  {dumps(k)}: {dumps(v)}," for k, v in header.items()]
        lines.append('  "cases": [')
        lines += ["    " + dumps(c) + ("," if i + 1 < len(results) else "")
                  for i, c in enumerate(results)]
        lines += ["  ]", "}"]
        with open(os.path.join(args.out, f"{name}.json"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        n_special = sum(c["ids"] != c["ids_special"] for c in results)
        n_round = sum(c["decoded"] == c["text"] for c in results)
        print(f"{name}: {len(results)} cases ({n_special} differ with special parsing, "
              f"{n_round} decode to their text); sentencepiece's encode agrees with "
              f"llama.cpp on {agree}, differs on {len(differ)}:", file=sys.stderr)
        other = [t for t in differ if not any(s in t for s in USER_DEFINED)]
        print(f"    {len(differ) - len(other)} hold a user-defined symbol, "
              f"{len(other)} do not{':' if other else ''}", file=sys.stderr)
        for text in other:
            print(f"    {text!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
