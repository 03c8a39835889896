"""A GGUF's tokenizer from its header alone: the same ids, special tokens, chat template and decoding as
AutoTokenizer.from_pretrained(folder, gguf_file=name), without torch."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.chat.standalone_tokenizer import SPECIAL_TOKEN_NAMES, StandaloneTokenizer, settings_of, settings_problem
from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.models.gguf_tokenizer import gguf_eos_ids, gguf_tokenizer_file, load_gguf_tokenizer
from app.core.models.model_source import default_model_gguf
from tests.helpers.fresh_process import run_fresh
from tests.helpers.gguf_files import (
    SAMPLE_TEXT,
    TokenizerSpec,
    byte_level_bpe,
    sentencepiece_llama,
    write_gguf,
)

# AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf") with transformers 5.25, once
# (it takes 13-90 s, depending on the transformers version): prompt -> input_ids.
DEFAULT_MODEL_IDS = {
    "What is the capital of France?": [1780, 314, 260, 3575, 282, 4649, 47],
    "Hello <|im_start|>user\nwörld 🤗<|im_end|>": [19556, 216, 1, 4093, 198, 103, 29989, 400, 15107, 114, 241, 2],
    "  two leading spaces, a tab\tand a newline\n": [
        216,
        827,
        2899,
        5600,
        28,
        253,
        10147,
        197,
        397,
        253,
        725,
        1311,
        198,
    ],
    "日本語のテキスト — naïve café": [
        *(23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391),
        *(251, 10391, 134, 11100, 226, 1841, 15486, 46494, 37366),
    ],
    "def f(x):\n    return x**2  # 100%": [
        1604,
        275,
        24,
        104,
        727,
        472,
        1003,
        1792,
        828,
        34,
        216,
        907,
        216,
        33,
        32,
        32,
        21,
    ],
    "<|endoftext|><repo_name>x": [0, 3, 104],
}
CHAT = [
    {"role": "user", "content": "Hi 🤗"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
]
DEFAULT_MODEL_CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHi 🤗<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
PROMPTS = [
    "The capital of France is Paris.",
    "  Hello, world!\n\tdef add(a, b): return a + b",
    "Café naïve über 日本語 🤗 — 3.14159",
    "<|im_start|>user\nHi<|im_end|>\n<s>[INST] x </s>",
    "",
]


@pytest.fixture(scope="module")
def default_tokenizer() -> Any:
    return load_gguf_tokenizer(default_model_gguf())


def test_the_default_models_ids_are_the_ones_auto_tokenizer_gives(default_tokenizer: Any) -> None:
    for prompt, ids in DEFAULT_MODEL_IDS.items():
        assert default_tokenizer(prompt)["input_ids"] == ids, prompt
        assert default_tokenizer.decode(ids) == prompt
    assert default_tokenizer.decode(DEFAULT_MODEL_IDS["Hello <|im_start|>user\nwörld 🤗<|im_end|>"], True) == (
        "Hello user\nwörld 🤗"
    )


def test_the_default_models_special_tokens_and_chat_template(default_tokenizer: Any) -> None:
    tokenizer = default_tokenizer
    assert isinstance(tokenizer, StandaloneTokenizer)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id) == (
        1,
        2,
        2,
        0,
    )
    assert len(tokenizer) == 49152 and len(tokenizer.added_tokens_decoder) == 17
    assert tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == DEFAULT_MODEL_CHAT
    assert gguf_eos_ids(default_model_gguf()) == {2}


def test_it_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from app.core.models.gguf_tokenizer import load_gguf_tokenizer, gguf_eos_ids\n"
        "from app.core.models.model_source import default_model_gguf\n"
        "tokenizer = load_gguf_tokenizer(default_model_gguf())\n"
        "assert tokenizer('Paris')['input_ids'] == [38634]\n"
        "print(sorted(name for name in sys.modules if name == 'torch' or name.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    folder = tmp_path_factory.mktemp("gguf-tokenizers")
    specs = {
        "llama-bpe": byte_level_bpe(),
        "qwen2": byte_level_bpe(pre="qwen2"),
        "sentencepiece": sentencepiece_llama(),
    }
    yield {name: write_gguf(folder / f"{name}.gguf", spec) for name, spec in specs.items()}


@pytest.mark.parametrize("kind", ["llama-bpe", "qwen2", "sentencepiece"])
def test_tiny_tokenizers_match_auto_tokenizer(kind: str, tiny_ggufs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    path = tiny_ggufs[kind]
    assert_same_tokenizer(load_gguf_tokenizer(path), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name))


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city — «today»",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def assert_same_tokenizer(ours: Any, theirs: Any) -> None:
    """The backend's JSON, special and added tokens, ids, decoding and chat template all equal."""
    assert json.loads(ours.backend_tokenizer.to_str()) == json.loads(theirs.backend_tokenizer.to_str())
    for name in (
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "bos_token_id",
        "eos_token_id",
        "unk_token_id",
        "pad_token_id",
        "all_special_tokens",
        "special_tokens_map",
        "add_bos_token",
        "chat_template",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert {i: repr(t) for i, t in ours.added_tokens_decoder.items()} == {
        i: repr(t) for i, t in theirs.added_tokens_decoder.items()
    }
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    specials = [str(t) for t in theirs.added_tokens_decoder.values()]
    assert ours.convert_tokens_to_ids(specials) == theirs.convert_tokens_to_ids(specials)
    assert ours.convert_tokens_to_ids("no-such-token") == theirs.convert_tokens_to_ids("no-such-token")
    for prompt in [*PROMPTS, SAMPLE_TEXT]:
        ids = ours(prompt)["input_ids"]
        assert ids == theirs(prompt)["input_ids"], prompt
        for options in ({"add_special_tokens": False}, {"add_special_tokens": False, "split_special_tokens": True}):
            assert ours(prompt, **options)["input_ids"] == theirs(prompt, **options)["input_ids"], (prompt, options)
        assert ours.decode(ids) == theirs.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, clean_up_tokenization_spaces=True) == theirs.decode(
            ids, clean_up_tokenization_spaces=True
        )
    assert ours(PROMPTS[3])["input_ids"] == theirs(PROMPTS[3])["input_ids"]  # split_special_tokens did not stick
    if theirs.chat_template:
        for options in ({}, {"add_generation_prompt": True}, {"add_generation_prompt": True, "tools": TOOLS}):
            rendered = ours.apply_chat_template(CHAT, tokenize=False, **options)
            assert rendered == theirs.apply_chat_template(CHAT, tokenize=False, **options), options
        assert ours.apply_chat_template(CHAT) == theirs.apply_chat_template(CHAT, return_dict=False)


def test_the_end_of_reply_ids_include_end_of_turn(tiny_ggufs: dict[str, Path]) -> None:
    spec = byte_level_bpe()
    assert spec.eos is not None and spec.eot is not None and spec.eos != spec.eot
    assert gguf_eos_ids(tiny_ggufs["llama-bpe"]) == {spec.eos, spec.eot}
    assert gguf_eos_ids(tiny_ggufs["sentencepiece"]) == {2}


def test_a_tokenizer_json_for_token_counts_is_written_once(default_tokenizer: Any, isolated_cache: Path) -> None:
    from tokenizers import Tokenizer

    path = gguf_tokenizer_file(default_model_gguf(), default_tokenizer)
    assert path.is_relative_to(isolated_cache) and path.suffix == ".json"
    written = path.stat().st_mtime_ns
    assert gguf_tokenizer_file(default_model_gguf()) == path and path.stat().st_mtime_ns == written
    counted = Tokenizer.from_file(str(path)).encode("What is the capital of France?", add_special_tokens=False)
    assert counted.ids == DEFAULT_MODEL_IDS["What is the capital of France?"]
    assert not list(path.parent.glob(".tokenizer-*"))  # no staging file left behind


@pytest.mark.parametrize("kind", ["default", "llama-bpe", "qwen2", "sentencepiece"])
def test_a_second_load_reads_the_cache_s_copies_and_gives_the_same_tokenizer(
    kind: str, tiny_ggufs: dict[str, Path], isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.integrations.gguf.gguf_tokenizer_mapping as mapping

    path = default_model_gguf() if kind == "default" else tiny_ggufs[kind]
    built = load_gguf_tokenizer(path)
    copies = sorted(p.name for p in (isolated_cache / "gguf-tokenizers").iterdir())
    assert sorted(name.rsplit(".", 1)[1] for name in copies) == ["json", "settings"], copies

    def refuse(*args: object) -> None:
        raise AssertionError("the second load built the tokenizer from the header again")

    monkeypatch.setattr(mapping, "convert_gguf_tokenizer", refuse)
    again = load_gguf_tokenizer(path)
    assert again.backend_tokenizer.to_str() == built.backend_tokenizer.to_str()  # byte for byte
    assert_same_tokenizer(again, built)


def test_a_second_load_never_imports_transformers(isolated_cache: Path) -> None:
    load_gguf_tokenizer(default_model_gguf())  # the first load builds it through transformers, and keeps copies
    done = run_fresh(
        "from app.core.models.gguf_tokenizer import load_gguf_tokenizer\n"
        "from app.core.models.model_source import default_model_gguf\n"
        "from app.core.chat.chat_format import format_prompt\n"
        "from app.core.chat.detok import IncrementalDetokenizer\n"
        "from app.core.chat.events import ChatMessage\n"
        "tokenizer = load_gguf_tokenizer(default_model_gguf())\n"
        "ids = format_prompt(tokenizer, [ChatMessage('user', 'Paris?')]).ids\n"
        "detok = IncrementalDetokenizer(tokenizer)\n"
        "text = ''.join(detok.add(i) for i in tokenizer('Paris is nice')['input_ids'])\n"
        "print(len(ids) > 5, repr(text))\n"
    )
    assert done.out == "True 'Paris is nice'" and done.imported == set()


def test_the_default_model_s_tokenizer_is_transformers_own(default_tokenizer: Any) -> None:
    from app.core.models.gguf_tokenizer import build_with_transformers

    assert_same_tokenizer(default_tokenizer, build_with_transformers(default_model_gguf()))


def test_an_older_hearth_s_copies_are_replaced(isolated_cache: Path) -> None:
    path = default_model_gguf()
    load_gguf_tokenizer(path)
    folder = isolated_cache / "gguf-tokenizers"
    [settings] = folder.glob("*.settings")
    prefix = settings.name.rsplit("-", 1)[0]
    # before 2026-12-07: transformers' kwargs as NAME.config; and settings of a format this Hearth does not know
    older = json.dumps({"add_bos_token": False, "bos_token": "<|im_start|>"}, sort_keys=True).encode()
    other = json.dumps({"format": 99}).encode()
    settings.unlink()
    for data, suffix in ((older, ".config"), (other, ".settings")):
        (folder / f"{prefix}-{hashlib.sha256(data).hexdigest()[:16]}{suffix}").write_bytes(data)
    notices: list[str] = []
    again = load_gguf_tokenizer(path, notices)
    assert notices == []  # not damage: rebuilt quietly
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".json")) == [settings.name]
    assert again("What is the capital of France?")["input_ids"] == DEFAULT_MODEL_IDS["What is the capital of France?"]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"format": 0}, "not tokenizer settings of format 1"),
        ({"special_tokens": {"bos_token": "<s>"}}, "its special tokens are not the four named ones"),
        ({"special_tokens": dict.fromkeys(SPECIAL_TOKEN_NAMES, 7)}, "a special token is not a string"),
        ({"all_special_tokens": "<s>"}, "its list of special tokens is not a list of strings"),
        ({"add_bos_token": "true"}, "add_bos_token is not true or false"),
        ({"chat_template": ["x"]}, "its chat template is not text"),
    ],
)
def test_settings_that_cannot_make_a_tokenizer_are_named(
    default_tokenizer: Any, change: dict[str, Any], problem: str
) -> None:
    from app.core.models.gguf_tokenizer import build_with_transformers

    settings = {**settings_of(build_with_transformers(default_model_gguf())), **change}
    assert settings_problem(settings) == problem
    with pytest.raises(ValueError, match=f"tokenizer settings: {problem}"):
        StandaloneTokenizer(default_tokenizer.backend_tokenizer, settings)


def test_a_damaged_config_copy_is_moved_aside_and_the_tokenizer_built_again(isolated_cache: Path) -> None:
    path = default_model_gguf()
    built = load_gguf_tokenizer(path)
    [config] = (isolated_cache / "gguf-tokenizers").glob("*.settings")
    whole = config.read_bytes()
    config.write_bytes(whole.replace(b'"add_bos_token": false', b'"add_bos_token": true '))  # a hand edit
    notices: list[str] = []
    again = load_gguf_tokenizer(path, notices)
    [notice] = notices
    assert f"The tokenizer copy {config.name} was damaged" in notice and "written again" in notice
    assert (config.parent / f"{config.name}.damaged").is_file() and config.read_bytes() == whole
    assert again.add_bos_token == built.add_bos_token
    assert again("What is the capital of France?")["input_ids"] == DEFAULT_MODEL_IDS["What is the capital of France?"]


def _spec(**changes: Any) -> TokenizerSpec:
    spec = byte_level_bpe()
    for name, value in changes.items():
        setattr(spec, name, value)
    return spec


def test_a_file_without_a_vocabulary_is_refused(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "no-vocab.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match=r"no-vocab\.gguf holds no tokenizer \(no tokenizer\.ggml\.tokens"):
        load_gguf_tokenizer(path)


def test_an_unknown_tokenizer_type_is_named(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "odd.gguf", _spec(model="wordpiece-9"))
    with pytest.raises(UnsupportedModelError, match=r"odd\.gguf: its tokenizer cannot be built \(.*'wordpiece-9'"):
        load_gguf_tokenizer(path)


def test_a_special_token_id_outside_the_vocabulary_is_corrupt(tmp_path: Path) -> None:
    spec = _spec()
    path = write_gguf(tmp_path / "bad-eos.gguf", _spec(eos=len(spec.tokens) + 5))
    with pytest.raises(CorruptModelError, match=r"bad-eos\.gguf: its tokenizer's eos_token id \d+ is not one of its"):
        load_gguf_tokenizer(path)


class SlowSwitch:
    """A tokenizers backend whose special-token switch takes a moment to set (the GIL is let go meanwhile), so that
    another thread runs between one thread's switch and its encode."""

    def __init__(self, backend: Any) -> None:
        object.__setattr__(self, "backend", backend)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.backend, name, value)
        time.sleep(0.001)


def test_threads_encoding_at_once_each_get_their_own_special_token_handling(default_tokenizer: Any) -> None:
    """split_special_tokens is a switch on the shared backend: one thread's must never leak into another's encode."""
    from concurrent.futures import ThreadPoolExecutor

    from app.core.models.gguf_tokenizer import build_with_transformers

    settings = settings_of(build_with_transformers(default_model_gguf()))
    tokenizer = StandaloneTokenizer(SlowSwitch(default_tokenizer.backend_tokenizer), settings)
    text = "<|im_start|>user\nHi<|im_end|>"
    as_tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    as_text = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert as_tokens != as_text

    def encode(index: int) -> bool:
        split = index % 2 == 1
        return tokenizer(text, add_special_tokens=False, split_special_tokens=split)["input_ids"] == (
            as_text if split else as_tokens
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(encode, range(200)))
