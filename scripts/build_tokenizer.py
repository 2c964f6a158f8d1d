"""Build the tokenizer folder shipped with rack (`rack/serve/data/tokenizer/`): a
Hugging Face `tokenizer.json` that cuts text into exactly the tokens rack's default
counter counts (`rack.serve.tokens.text_chunks`), so that a benchmark client given
this folder and `rack serve` agree on every prompt's length with no download.

    python scripts/build_tokenizer.py [--corpus FILE ...] [--out DIR]

How it is built (the `tokenizers` library):
- pre-tokenizer: two `Split` steps that keep only their matches (as `re.findall`
  does): GPT-2's piece pattern, then each piece cut into tokens of at most 6 letters,
  3 digits or 3 symbols (a whitespace piece or a contraction whole). The character
  classes are written out as code-point ranges computed from Python's own `re`
  classes (letters `[^\\W\\d_]`, digits `\\d`, whitespace `\\s`), so the Rust regex
  engine (Oniguruma) and Python's `re` agree character for character (for the
  Unicode version of the Python that built it; `python -c "import unicodedata;
  print(unicodedata.unidata_version)"`, recorded in tokenizer_config.json);
- model: `WordLevel` over a vocabulary of token strings: special tokens, every
  ASCII character and letter pair (with and without a leading space), every 1-3
  digit number, ASCII symbol pairs, whitespace runs, and every token of the corpus
  files (word pieces); a token outside it is the unknown token U+FFFD (one token:
  the count never depends on the vocabulary, only the ids do);
- decoder: `Fuse` (the tokens' strings joined), so decode(encode(text)) == text for
  text whose tokens are all in the vocabulary (a slice of ids decodes to text that
  re-encodes to the same ids: clients that cut a corpus at N tokens ask for N).

The shipped folder was built from the corpora the benchmark clients build their
synthetic prompts from (AIPerf's Shakespeare, GuideLLM's Faker words: public-domain
or generated text), Python's help topics and rack's own docs (the command is in
docs/serve.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import string
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rack.serve import tokens as tk  # noqa: E402

UNK = "\ufffd"
SPECIALS = ["<|endoftext|>", "<|start|>", "<|message|>", "<|system|>", "<|developer|>", "<|user|>",
            "<|assistant|>", "<|tool|>", "<|function|>"]
#: Corpus tokens kept (most frequent first), beyond the systematic ones.
MAX_CORPUS_TOKENS = 64_000


def _ranges(pred) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if pred(chr(cp)):
            if out and out[-1][1] == cp - 1:
                out[-1][1] = cp
            else:
                out.append([cp, cp])
    return [(a, b) for a, b in out]


def _cls(ranges, extra: str = "") -> str:
    body = "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges)
    return body + extra


def patterns() -> tuple[str, str]:
    """(piece pattern, token pattern) in Oniguruma syntax, equal to tokens.py's."""
    letter, digit, space = re.compile(r"[^\W\d_]"), re.compile(r"\d"), re.compile(r"\s")
    L = _cls(_ranges(letter.match))
    D = _cls(_ranges(digit.match))
    S = _cls(_ranges(space.match))
    sym = f"[^{S}{L}{D}_]"
    lc = f"'(?:[sdmt]|ll|ve|re)"
    n = tk.CHARS_PER_TOKEN
    piece = f"{lc}| ?[{L}]+| ?[{D}]+| ?{sym}+|[{S}]+(?![^{S}])|[{S}]+"
    token = (f"{lc}| ?[{L}]{{1,{n['l']}}}|[{L}]{{1,{n['l']}}}| ?[{D}]{{1,{n['d']}}}|[{D}]{{1,{n['d']}}}"
             f"| ?{sym}{{1,{n['s']}}}|{sym}{{1,{n['s']}}}|[{S}]+")
    return piece, token


def systematic_tokens() -> list[str]:
    letters = string.ascii_letters
    punct = string.punctuation
    toks: list[str] = []
    for pre in ("", " "):
        toks += [pre + c for c in letters + string.digits + punct]
        toks += [pre + a + b for a in letters for b in letters]
        toks += [pre + str(i) for i in range(10)] + [pre + f"{i:02d}" for i in range(100)] \
            + [pre + f"{i:03d}" for i in range(1000)] + [pre + str(i) for i in range(10, 1000)]
        toks += [pre + a + b for a in punct for b in punct]
        toks += [pre + c for c in "àáâäãåæçèéêëìíîïñòóôöõøœùúûüýÿßÀÁÂÄÃÅÆÇÈÉÊËÌÍÎÏÑÒÓÔÖÕØŒÙÚÛÜÝ"]
    for nl in range(0, 5):
        for sp in range(0, 17):
            if nl or sp:
                toks += ["\n" * nl + " " * sp, " " * sp + "\n" * nl]
    toks += ["\t" * k for k in range(1, 5)] + ["\r\n", "\r\n\r\n", "\n\t", "\n\n\t"]
    return toks


def faker_words() -> str:
    """Faker's English lorem words (GuideLLM builds synthetic prompts with `Faker.text`:
    sentences of them, the first capitalised, ending in a full stop), each lower-case
    and capitalised, after a space and at a line's start."""
    from faker.providers.lorem.en_US import Provider

    lines = []
    for w in Provider.word_list:
        for form in (w, w.capitalize()):
            lines.append(f"{form} {form}. {form}")
    return "\n".join(lines) + "\n"


def pydoc_topics() -> str:
    """The text of Python's own help topics (`pydoc_data`, in every CPython): modern
    technical English and code."""
    from pydoc_data.topics import topics

    return "\n".join(topics.values())


def corpus_tokens(paths: list[Path], extra: str = "") -> list[str]:
    counts: collections.Counter = collections.Counter(tk.text_chunks(extra))
    for p in paths:
        counts.update(tk.text_chunks(p.read_text(encoding="utf-8", errors="replace")))
    return [t for t, _ in counts.most_common(MAX_CORPUS_TOKENS)]


def build(corpora: list[Path], out: Path, faker: bool = False, pydoc: bool = False) -> dict:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import AddedToken

    piece, token = patterns()
    vocab: dict[str, int] = {t: i for i, t in enumerate([UNK] + SPECIALS)}
    for t in systematic_tokens() + corpus_tokens(corpora, (faker_words() if faker else "") + (pydoc_topics() if pydoc else "")):
        if t not in vocab and tk.text_chunks(t) == [t]:       # one token by itself
            vocab[t] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(piece), behavior="removed", invert=True),
        pre_tokenizers.Split(Regex(token), behavior="removed", invert=True)])
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    chat = ("{% for m in messages %}<|start|><|{{ m['role'] }}|><|message|>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|start|><|assistant|><|message|>{% endif %}")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1_048_576,
              # no unk_token: transformers would count it special and drop it from text
              # decoded with skip_special_tokens (a client's prompt would lose tokens)
              "eos_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
              "add_bos_token": False, "add_eos_token": False, "chat_template": chat,
              "rack": {"what": "rack's default token counter (rack/serve/tokens.py) as a Hugging Face tokenizer",
                       "built_by": "scripts/build_tokenizer.py", "unicode_version": unicodedata.unidata_version,
                       "corpora": [p.name for p in corpora] + (["faker en_US lorem words"] if faker else [])
                       + (["pydoc_data topics"] if pydoc else []), "vocab_size": tok.get_vocab_size()}}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}) + "\n")
    return config["rack"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, action="append", default=[], help="text file whose tokens join the vocabulary")
    ap.add_argument("--faker-words", action="store_true", help="add Faker's English lorem words (needs faker)")
    ap.add_argument("--pydoc-topics", action="store_true", help="add the text of Python's help topics")
    ap.add_argument("--out", type=Path, default=ROOT / "rack" / "serve" / "data" / "tokenizer")
    a = ap.parse_args()
    info = build(a.corpus, a.out, a.faker_words, a.pydoc_topics)
    print(f"{a.out}: {info['vocab_size']} tokens (Unicode {info['unicode_version']}; corpora {info['corpora']})")


if __name__ == "__main__":
    main()
