"""The UMT5 tokenizer as Wan2.1 / Self-Forcing use it: `tokenizer.json` through `tokenizers`.

The reference pipeline (Wan2.1's `HuggingfaceTokenizer` with `clean='whitespace'`, which
Self-Forcing's `WanTextEncoder` uses with `seq_len=512`) cleans each prompt with
`whitespace_clean(basic_clean(text))`, then tokenizes with the special tokens added (`</s>` at the
end), truncated to `seq_len` tokens (the end-of-sequence token kept) and padded with `<pad>` to
`seq_len`. The encoder's output at padded positions is zeroed afterwards.

That wrapper loads the tokenizer folder through transformers' AutoTokenizer (T5Tokenizer), which
registers the tokenizer's special tokens -- its eos, unk and pad tokens and the folder's
`additional_special_tokens` -- as added special tokens, whether or not tokenizer.json lists them
in `added_tokens`: a prompt containing the literal text `<unk>` gets the unk id there, not the
pieces of "<unk>".  `Tokenizer` registers the same tokens (`special_tokens`), so the ids agree.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np


def basic_clean(text: str) -> str:
    import ftfy

    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text))
    return text.strip()


def whitespace_clean(text: str) -> str:
    text = re.sub(r"\s+", " ", text)
    return text.strip()


def clean(text: str) -> str:
    """The reference pipeline's prompt cleaning (`clean='whitespace'`)."""
    return whitespace_clean(basic_clean(text))


def special_tokens(path: str) -> list[str]:
    """The special tokens transformers' T5Tokenizer registers for the tokenizer folder of `path`
    (a tokenizer.json): the default eos/unk/pad tokens, or those a `special_tokens_map.json` /
    `tokenizer_config.json` beside it names, and its `additional_special_tokens` (google/umt5-xxl's
    folder lists its sentinel `<extra_id_*>` tokens there)."""
    folder = Path(path).parent
    names = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    extra: list[str] = []
    for fname in ("tokenizer_config.json", "special_tokens_map.json"):  # the latter wins, as in transformers
        f = folder / fname
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in ("eos_token", "unk_token", "pad_token", "bos_token"):
            value = _token_text(data.get(key))
            if value:
                names[key] = value
        for tok in data.get("additional_special_tokens") or []:
            value = _token_text(tok)
            if value and value not in extra:
                extra.append(value)
    out = [names[k] for k in ("eos_token", "unk_token", "pad_token", "bos_token") if k in names]
    return out + [t for t in extra if t not in out]


def _token_text(tok):
    """A special token of a transformers config: a string or an AddedToken dict ({"content": ...})."""
    if isinstance(tok, dict):
        tok = tok.get("content")
    return tok if isinstance(tok, str) and tok else None


def _register_special_tokens(tok, names) -> None:
    """Make each of `names` that is in the vocabulary an added special token of `tok` (not
    normalized, no stripping), as transformers does, unless tokenizer.json already has it."""
    from tokenizers import AddedToken

    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    new = [AddedToken(n, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
           for n in names if n not in added and tok.token_to_id(n) is not None]
    if new:
        tok.add_special_tokens(new)


class Tokenizer:
    """A `tokenizer.json` with the reference pipeline's cleaning, truncation and padding."""

    def __init__(self, path: str, text_len: int):
        from tokenizers import Tokenizer as HfTokenizer

        self.path = str(path)
        self.text_len = text_len
        self.tok = HfTokenizer.from_file(self.path)
        self.special = special_tokens(self.path)
        _register_special_tokens(self.tok, self.special)
        self.pad_id = self.tok.token_to_id("<pad>")
        if self.pad_id is None:
            raise SystemExit(f"{self.path}: no <pad> token; a UMT5 tokenizer.json has <pad> as id 0")
        self.tok.enable_truncation(max_length=text_len)
        self.tok.enable_padding(length=text_len, pad_id=self.pad_id, pad_token="<pad>")

    def encode(self, prompt: str):
        """(ids, mask, truncated): int64 arrays [1, text_len], and whether the prompt was cut."""
        enc = self.tok.encode(clean(prompt), add_special_tokens=True)
        ids = np.asarray([enc.ids], dtype=np.int64)
        mask = np.asarray([enc.attention_mask], dtype=np.int64)
        return ids, mask, bool(enc.overflowing)

    def __call__(self, prompt: str):
        ids, mask, _ = self.encode(prompt)
        return ids, mask


def write_bundle_tokenizer(src: str, dst: str) -> None:
    """Writes `src` as a bundle's self-contained tokenizer.json: the special tokens the reference
    pipeline registers from the tokenizer's folder (`special_tokens`) become added special tokens
    of the file itself, so that the runner, which reads the bundle's tokenizer.json alone,
    tokenizes a literal `<unk>` or `<extra_id_0>` as the reference does."""
    from tokenizers import Tokenizer as HfTokenizer

    tok = HfTokenizer.from_file(str(src))
    _register_special_tokens(tok, special_tokens(str(src)))
    tok.save(str(dst))


def make_test_tokenizer(corpus: str, out: str, vocab_size: int = 1000):
    """Writes a `tokenizer.json` of the UMT5 model type (a SentencePiece unigram model with
    nmt_nfkc normalisation, `<pad>` 0, `</s>` 1, `<unk>` 2, converted the way transformers
    converts T5's SentencePiece models) trained on `corpus`: a small stand-in for
    `google/umt5-xxl/tokenizer.json`, which cannot be downloaded here."""
    import tempfile
    from pathlib import Path

    import sentencepiece as spm
    from transformers.convert_slow_tokenizer import T5Converter

    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(Path(tmp) / "spm")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="unigram",
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1,
            normalization_rule_name="nmt_nfkc", character_coverage=1.0, minloglevel=2,
        )
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")

        class _Slow:  # what T5Converter reads of a slow T5 tokenizer
            vocab_file = prefix + ".model"
            _extra_ids = 0
            legacy = True
            add_prefix_space = True

            def convert_tokens_to_ids(self, token):
                return sp.piece_to_id(token)

        T5Converter(_Slow()).converted().save(out)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m unstep_export.tokenizer")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="train the small UMT5-type test tokenizer.json")
    m.add_argument("--corpus", default="assets/tokenizer/corpus.txt")
    m.add_argument("--out", default="assets/tokenizer/tokenizer.json")
    m.add_argument("--vocab", type=int, default=1000)
    e = sub.add_parser("encode", help="one JSON line per prompt of a prompt file: ids, mask, truncated")
    e.add_argument("--tokenizer", required=True, help="tokenizer.json")
    e.add_argument("--text-len", type=int, required=True)
    e.add_argument("--prompts", required=True, help="one prompt per line, UTF-8")
    a = p.parse_args()
    if a.cmd == "make":
        make_test_tokenizer(a.corpus, a.out, a.vocab)
        print(f"wrote {a.out}")
    else:
        import json

        tok = Tokenizer(a.tokenizer, a.text_len)
        with open(a.prompts, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for index, line in enumerate(lines):
            ids, mask, truncated = tok.encode(line)
            print(json.dumps({"index": index, "ids": ids[0].tolist(), "mask": mask[0].tolist(),
                              "truncated": truncated}))
