"""The shipped tokenizer folder cuts text exactly as rack's default counter does
(`rack/serve/tokens.py`), id for id, on thousands of texts (random Unicode, English
prose, code, numbers); a slice of a text's ids decodes to text that re-encodes to the
same ids (a client that cuts a corpus at N tokens sends an N-token prompt); and
`--tokenizer` counts with another tokenizer.json. Needs `tokenizers` (in the dev extra)."""

from __future__ import annotations

import json
import random

import pytest

from rack.serve import openai_api as oa
from rack.serve import tokens as tk
from rack.serve.tokenizer import SHIPPED, DefaultTokenizer, HFTokenizer, TokenizerError, chat_ids, load_tokenizer

tokenizers = pytest.importorskip("tokenizers")

PROSE = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
         "in want of a wife. However little known the feelings or views of such a man may be on his first "
         "entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that "
         "he is considered the rightful property of some one or other of their daughters.\n\n\"My dear Mr. "
         "Bennet,\" said his lady to him one day, \"have you heard that Netherfield Park is let at last?\"\n")
CODE = "def f(x_1, y):\n    return {'a': x_1 ** 2 + 3.14159, \"b\": [y, -12345678]}  # done!\n\t\r\n"


def _samples(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = ([chr(c) for c in range(0x20, 0x3000)] + list(" \n\t\r'_") * 40
                + ["\u00b2", "\u00bd", "\u216b", "\u3000", "\x1c", "\x85", "\u200b", "\u4e2d", "\U0001f600",
                   "\u0301", "'s", "'ll", "'ve"])
    out = [PROSE, CODE, "", " ", "  a", "a  ", "\n\n", "don't we'll they're", "1234567 89 0", "....!!??"]
    for i in range(n):
        if i % 3 == 0:                           # slices of prose and code, shuffled words
            words = (PROSE + CODE).split(" ")
            rng.shuffle(words)
            out.append(" ".join(words[: rng.randint(1, 60)]))
        else:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 100))))
    return out


@pytest.fixture(scope="module")
def shipped():
    return tokenizers.Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))


def test_the_shipped_tokenizer_cuts_text_as_the_default_counter_id_for_id(shipped):
    default = DefaultTokenizer()
    mismatches = []
    samples = _samples(4000)
    for s in samples:
        enc = shipped.encode(s, add_special_tokens=False)
        pieces = [s[a:b] for a, b in enc.offsets]
        if pieces != tk.text_chunks(s) or len(enc.ids) != tk.count_text_tokens(s) or enc.ids != default.encode(s):
            mismatches.append(s)
    assert not mismatches, (len(mismatches), mismatches[:3])
    assert len(samples) > 4000


def test_a_slice_of_ids_decodes_to_text_of_that_many_tokens(shipped):
    default = DefaultTokenizer()
    ids = shipped.encode(PROSE * 20, add_special_tokens=False).ids
    for start, n in ((0, 256), (7, 100), (31, 513)):
        text = shipped.decode(ids[start:start + n])
        assert text == default.decode(ids[start:start + n])
        assert shipped.encode(text, add_special_tokens=False).ids == ids[start:start + n]
        assert tk.count_text_tokens(text) == n


def test_the_folder_loads_as_a_transformers_tokenizer_config():
    cfg = json.loads((SHIPPED / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["eos_token"] == "<|endoftext|>"
    assert cfg["rack"]["vocab_size"] == DefaultTokenizer().vocab_size()


def test_chat_ids_count_what_the_chat_endpoint_charges():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROSE}]
    plan = oa.parse_request("chat", {"model": "m", "messages": msgs, "max_tokens": 4}, served=("m",),
                            max_model_len=None, eos_mean_tokens=8, request_id=0)
    assert len(chat_ids(DefaultTokenizer(), msgs)) == plan.prompt_tokens


def _other_tokenizer(path):
    """A tokenizer.json unlike rack's: whitespace words, a BOS added to every text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = sorted(set(PROSE.split()) | {"the", "and", "of", "to", "a", "in"})
    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    t.save(str(path))
    return t


def test_tokenizer_option_counts_with_another_tokenizer(tmp_path):
    other = _other_tokenizer(tmp_path / "tokenizer.json")
    tok = load_tokenizer(str(tmp_path))                       # a folder holding tokenizer.json
    assert isinstance(tok, HFTokenizer)
    text = "It is a truth universally acknowledged, extraordinary"
    n = len(other.encode(text).ids)                           # BOS included, as vLLM counts a completion
    assert n != tk.count_text_tokens(text)
    plan = oa.parse_request("completion", {"model": "m", "prompt": text, "max_tokens": 3}, served=("m",),
                            max_model_len=None, eos_mean_tokens=8, request_id=0, tokenizer=tok)
    assert plan.prompt_tokens == n == tok.count(text) == len(tok.encode(text))
    assert len(other.encode(tok.filler(0, 40), add_special_tokens=False).ids) == 40
    assert tok.decode(other.encode("the truth").ids).endswith("the truth")


def test_bad_tokenizer_paths_are_clear_errors(tmp_path):
    with pytest.raises(TokenizerError, match="expected a tokenizer.json"):
        load_tokenizer(str(tmp_path / "missing"))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a Hugging Face tokenizer.json"):
        load_tokenizer(str(tmp_path))


def test_rack_serve_refuses_a_bad_tokenizer_in_one_line_before_starting(tmp_path):
    from typer.testing import CliRunner

    import rack.cli
    from rack.cli.app import app

    rack.cli._register_commands()
    r = CliRunner().invoke(app, ["serve", "--tokenizer", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code != 0 and len(lines) == 1 and "expected a tokenizer.json" in lines[0], r.output
