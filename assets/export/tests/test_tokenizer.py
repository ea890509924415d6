"""Our `Tokenizer` (unstep_export/tokenizer.py) against the reference pipeline's prompt wrapper.

The reference: Wan2.1's `HuggingfaceTokenizer(name, seq_len, clean='whitespace')` (as DiffSynth
ships it, diffsynth/models/wan_video_text_encoder.py; Self-Forcing's WanTextEncoder and DiffSynth's
Wan pipeline build it with seq_len=512), which cleans with ftfy + html.unescape + `regex`'s `\\s+`
and tokenizes through transformers' AutoTokenizer over a tokenizer folder (here
assets/tokenizer/tokenizer.json, a small UMT5-type tokenizer of vocabulary 1000, plus the minimal
tokenizer_config.json / special_tokens_map.json), padded to `max_length` and truncated.  Ours reads
the same tokenizer.json through `tokenizers` directly.  Ids and masks must be equal token for
token.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import regex

from diffsynth.models.wan_video_text_encoder import HuggingfaceTokenizer, basic_clean, whitespace_clean

from unstep_export.config import preset
from unstep_export.tokenizer import Tokenizer, clean

REPO_ROOT = Path(__file__).resolve().parents[3]
TOKENIZER_JSON = REPO_ROOT / "assets" / "tokenizer" / "tokenizer.json"
PAD, EOS = 0, 1
WAN_SEQ_LEN = 512  # Wan2.1 / Self-Forcing: HuggingfaceTokenizer(..., seq_len=512, clean='whitespace')

LONG = ("A majestic golden retriever runs across a sunlit meadow full of wild flowers, its fur "
        "glowing in the warm evening light while butterflies dance around it; the camera follows "
        "in a slow tracking shot, shallow depth of field, cinematic colour grading. ") * 12

PROMPTS = {
    "plain": "A cat walks on the grass, realistic style.",
    "empty": "",
    "only-whitespace": " \t\n\u3000\u00a0 ",
    "long": LONG,
    "long-no-spaces": "supercalifragilistic" * 60,
    "accents": "Café naïve résumé façade Ångström Øresund Łódź São Paulo Ærø",
    "cjk": "东京的夜景，雨中霓虹灯闪烁。日本の桜が満開です。서울의 밤거리",
    "emoji": "A dog 🐶 and a cat 🐱 watch fireworks 🎆 👩‍👩‍👧‍👦 🏳️‍🌈 👍🏽",
    "combining": "e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u0362a\u0337l\u0335g\u0334o",
    "fullwidth": "ＡＢＣ　ｆｕｌｌｗｉｄｔｈ　１２３！？（テスト）",
    "html-entities": "Tom &amp;amp; Jerry &#39;run&#39; &nbsp;fast &lt;b&gt;bold&lt;/b&gt; &quot;q&quot; &amp;#39;",
    "mojibake": "cafÃ© â€œquotedâ€\x9d Itâ€™s SÃ£o Paulo naÃ¯ve",
    "curly-quotes": "“Hello,” she said — ‘it’s fine’… «guillemets» „low“",
    "ligatures": "ﬁne ﬂower ﬀ ﬃ ﬄ ﬅ ﬆ Ⅻ ㎏ ½ ² ℃ ™",
    "whitespace-heavy": "\t\tA   red\n\ncar\r\n drives\u3000along\u00a0the\u2003coast\u2009at\u200bdusk \ufeff  \u2028end\u2029",
    "controls": "a\x00b\x07c\x1cd\x1de\x1ef\x1fg\x7fh\x85i\x0bj\x0ck",
    "special-token-text": "</s> <pad> <unk> literal special tokens </s>",
    "mixed-scripts": "Привет мир مرحبا بالعالم שלום עולם नमस्ते दुनिया สวัสดีชาวโลก",
    "punctuation": "!!! ??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "digits": "1234567890 3.14159 1e-5 0x1F 2024-06-01 12:34:56",
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """assets/tokenizer/tokenizer.json with the minimal files T5Tokenizer(Fast) needs; no sentinel
    ids (the small tokenizer has none; google/umt5-xxl's folder lists them, inside its vocabulary)."""
    d = tmp_path_factory.mktemp("umt5-tokenizer")
    shutil.copy(TOKENIZER_JSON, d / "tokenizer.json")
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (d / "special_tokens_map.json").write_text(json.dumps(special))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "additional_special_tokens": [],
         "model_max_length": WAN_SEQ_LEN, **special}))
    return d


_refs: dict = {}


def reference(tokenizer_dir: Path, seq_len: int) -> HuggingfaceTokenizer:
    key = (str(tokenizer_dir), seq_len)
    if key not in _refs:
        _refs[key] = HuggingfaceTokenizer(str(tokenizer_dir), seq_len=seq_len, clean="whitespace")
    return _refs[key]


def ref_encode(ref: HuggingfaceTokenizer, prompt: str):
    ids, mask = ref(prompt, return_mask=True, add_special_tokens=True)
    return ids.numpy().astype(np.int64), mask.numpy().astype(np.int64)


def ref_untruncated_len(ref: HuggingfaceTokenizer, prompt: str) -> int:
    return len(ref.tokenizer(ref._clean(prompt), add_special_tokens=True)["input_ids"])


def check_equal(tokenizer_dir: Path, prompt: str, seq_len: int, ours: Tokenizer | None = None):
    ref = reference(tokenizer_dir, seq_len)
    ours = ours or Tokenizer(str(TOKENIZER_JSON), seq_len)
    ids, mask, truncated = ours.encode(prompt)
    rids, rmask = ref_encode(ref, prompt)
    assert ids.shape == rids.shape == (1, seq_len), (ids.shape, rids.shape)
    assert ids.dtype == np.int64 and mask.dtype == np.int64
    assert ids.tolist() == rids.tolist(), f"{prompt!r} at {seq_len}:\n ours {ids.tolist()}\n  ref {rids.tolist()}"
    assert mask.tolist() == rmask.tolist(), f"{prompt!r} at {seq_len}: masks differ"
    assert truncated == (ref_untruncated_len(ref, prompt) > seq_len), f"{prompt!r} at {seq_len}: truncated flag"
    return ids[0], mask[0], truncated


def test_reference_tokenizer_is_the_umt5_kind(tokenizer_dir):
    ref = reference(tokenizer_dir, WAN_SEQ_LEN)
    tok = ref.tokenizer
    assert type(tok).__name__ in ("T5Tokenizer", "T5TokenizerFast")
    assert tok.pad_token_id == PAD and tok.eos_token_id == EOS and tok.unk_token_id == 2
    assert ref.vocab_size == 1000
    ours = Tokenizer(str(TOKENIZER_JSON), WAN_SEQ_LEN)
    assert ours.pad_id == PAD and ours.tok.token_to_id("</s>") == EOS and ours.tok.get_vocab_size() == 1000


@pytest.mark.parametrize("seq_len", [16, WAN_SEQ_LEN])
@pytest.mark.parametrize("name", list(PROMPTS))
def test_ids_and_masks_equal_reference(tokenizer_dir, name, seq_len):
    check_equal(tokenizer_dir, PROMPTS[name], seq_len)


@pytest.mark.parametrize("seq_len", [16, WAN_SEQ_LEN])
def test_truncation_keeps_eos_last(tokenizer_dir, seq_len):
    for name in ("long", "long-no-spaces"):
        ids, mask, truncated = check_equal(tokenizer_dir, PROMPTS[name], seq_len)
        assert truncated, name
        assert ids[-1] == EOS and (ids[:-1] != EOS).all() and (ids != PAD).all(), name
        assert (mask == 1).all(), name
    # The long prompts do exceed Wan's 512.
    assert ref_untruncated_len(reference(tokenizer_dir, WAN_SEQ_LEN), LONG) > WAN_SEQ_LEN


@pytest.mark.parametrize("seq_len", [16, WAN_SEQ_LEN])
def test_padding_is_pad_zero(tokenizer_dir, seq_len):
    for name in ("plain", "empty", "only-whitespace", "accents"):
        ids, mask, truncated = check_equal(tokenizer_dir, PROMPTS[name], seq_len)
        n = int(mask.sum())
        if n == seq_len:  # no padding at this length
            continue
        assert not truncated
        assert (mask[:n] == 1).all() and (mask[n:] == 0).all(), name
        assert ids[n - 1] == EOS and (ids[n:] == PAD).all(), name
    # An empty prompt is the end-of-sequence token alone.
    ids, mask, _ = check_equal(tokenizer_dir, "", seq_len)
    assert ids[0] == EOS and mask.sum() == 1


def test_wan_sequence_length_is_512(tokenizer_dir):
    """Wan2.1 and Self-Forcing tokenize to 512 (HuggingfaceTokenizer(seq_len=512)); DiffSynth's Wan
    pipeline builds it so; our wan-1.3b preset's text_len is the same."""
    import inspect

    from diffsynth.pipelines import wan_video

    src = inspect.getsource(wan_video.WanVideoPipeline.from_pretrained)
    assert re.search(r"HuggingfaceTokenizer\([^)]*seq_len=512[^)]*clean='whitespace'", src)
    assert preset("wan-1.3b").text_len == WAN_SEQ_LEN
    ours = Tokenizer(str(TOKENIZER_JSON), WAN_SEQ_LEN)
    for prompt in PROMPTS.values():
        ids, mask, _ = check_equal(tokenizer_dir, prompt, WAN_SEQ_LEN, ours)
        assert ids.shape == mask.shape == (WAN_SEQ_LEN,)


def _whitespace_differences():
    """Code points where Python's `re` and the `regex` module (Wan's) disagree on `\\s`, and every
    code point either calls whitespace."""
    differ, spaces = [], []
    for c in range(0x110000):
        ch = chr(c)
        a, b = re.fullmatch(r"\s", ch) is not None, regex.fullmatch(r"\s", ch) is not None
        if a != b:
            differ.append(ch)
        if a or b:
            spaces.append(ch)
    return differ, spaces


def test_cleaning_equals_wan(tokenizer_dir):
    """tokenizer.clean (stdlib `re`) = Wan's whitespace_clean(basic_clean(.)) (`regex`): on the
    prompts, and on every whitespace code point of either module between letters and at the ends
    (they differ on U+001C..U+001F, which ftfy removes first)."""
    for prompt in PROMPTS.values():
        assert clean(prompt) == whitespace_clean(basic_clean(prompt)), repr(prompt)
    differ, spaces = _whitespace_differences()
    assert differ, "expected re and regex to differ on some \\s code points"
    for ch in spaces:
        for s in (f"a{ch}b", f"{ch}a{ch}{ch}b{ch}", f"{ch}"):
            assert clean(s) == whitespace_clean(basic_clean(s)), repr(s)


POOL = list("abcxyz ABC éüñçøß日本語中文한국") + [
    " ", "  ", "\t", "\n", "\r\n", "\u3000", "\u00a0", "\u2003", "\u200b", "\ufeff", "\u2028",
    "&amp;", "&amp;amp;", "&#39;", "&nbsp;", "&lt;", "&quot;", "Ã©", "â€™", "â€œ", "“", "”", "‘", "’",
    "ﬁ", "ﬂ", "Ａ", "１", "！", "\u0301", "\u0308", "\u00a8", "\u00b4", "\u02dc", "🐱", "👍🏽", "🏳️‍🌈",
    "</s>", "<pad>", "<unk>", "...", "—", "½", "²", "\x1c", "\x00", "\x85",
]


@pytest.mark.parametrize("seq_len", [16, 64])
def test_random_prompts_equal_reference(tokenizer_dir, seq_len):
    rng = random.Random(20240 + seq_len)
    ours = Tokenizer(str(TOKENIZER_JSON), seq_len)
    for _ in range(300):
        prompt = "".join(rng.choice(POOL) for _ in range(rng.randint(0, 30)))
        check_equal(tokenizer_dir, prompt, seq_len, ours)


def test_encode_cli_equals_reference(tokenizer_dir, tmp_path):
    """`python -m unstep_export.tokenizer encode` (the runner's tests read it): one JSON line per
    prompt line, equal to the reference."""
    seq_len = 32
    prompts = [p for p in PROMPTS.values() if "\n" not in p and "\r" not in p]  # one line each
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "unstep_export.tokenizer", "encode", "--tokenizer", str(TOKENIZER_JSON),
         "--text-len", str(seq_len), "--prompts", str(path)],
        check=True, capture_output=True, text=True, cwd=REPO_ROOT / "assets" / "export",
    ).stdout.splitlines()
    assert len(out) == len(prompts)
    ref = reference(tokenizer_dir, seq_len)
    for i, (line, prompt) in enumerate(zip(out, prompts)):
        rec = json.loads(line)
        rids, rmask = ref_encode(ref, prompt)
        assert rec["index"] == i
        assert rec["ids"] == rids[0].tolist() and rec["mask"] == rmask[0].tolist(), repr(prompt)
        assert rec["truncated"] == (ref_untruncated_len(ref, prompt) > seq_len)


def test_folder_special_tokens_equal_reference(tmp_path):
    """A tokenizer folder whose config names additional special tokens (google/umt5-xxl's lists its
    sentinels): ours, given that folder's tokenizer.json, registers them as transformers does."""
    import tokenizers

    vocab = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON)).get_vocab()
    extra = [t for t in ("▁cat", "ing") if t in vocab]
    assert extra
    d = tmp_path / "with-extra"
    d.mkdir()
    shutil.copy(TOKENIZER_JSON, d / "tokenizer.json")
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (d / "special_tokens_map.json").write_text(json.dumps({**special, "additional_special_tokens": extra}))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "additional_special_tokens": extra, **special}))
    ref = HuggingfaceTokenizer(str(d), seq_len=32, clean="whitespace")
    ours = Tokenizer(str(d / "tokenizer.json"), 32)
    assert set(extra) <= set(ours.special)
    for prompt in ("A cat is walking, singing▁cat", "concatenating strings", PROMPTS["plain"]):
        ids, mask, _ = ours.encode(prompt)
        rids, rmask = ref_encode(ref, prompt)
        assert ids.tolist() == rids.tolist() and mask.tolist() == rmask.tolist(), repr(prompt)
    # ... and differs from the plain tokenizer.json there, so the check is not vacuous.
    plain = Tokenizer(str(TOKENIZER_JSON), 32)
    assert any(plain.encode(p)[0].tolist() != ours.encode(p)[0].tolist() for p in ("concatenating strings", "singing"))
