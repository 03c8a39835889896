"""The one GGUF header reader: the library shows the type and context the planner reads from a file, and damaged
files are named as such."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from app.core.errors import CorruptModelError
from app.core.models.gguf_meta import (
    BLOCK_SIZES,
    check_gguf_complete,
    config_dict_from_gguf,
    gguf_summary,
    read_gguf_header,
    tensor_bytes,
)
from app.core.models.model_source import default_model_gguf
from tests.helpers.fresh_process import run_fresh


def _header(*entries: bytes, kv_count: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, kv_count) + b"".join(entries)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_the_library_shows_the_type_and_context_the_planner_reads() -> None:
    gguf = default_model_gguf()
    config, parameters = gguf_summary(gguf)
    planned = config_dict_from_gguf(gguf)
    assert config == {key: planned[key] for key in ("model_type", "max_position_embeddings")}
    assert config == {"model_type": "llama", "max_position_embeddings": 8192}
    assert planned["num_key_value_heads"] == 3
    # Keys the library's old hand-written table of 8 left out, so its plans differed from the planner's.
    assert planned["rms_norm_eps"] == pytest.approx(1e-5) and planned["rope_theta"] == 100000.0
    assert parameters == 134_515_008 == read_gguf_header(gguf).parameters
    done = run_fresh(
        "from app.core.models.gguf_meta import gguf_summary\n"
        "from app.core.models.model_source import default_model_gguf\n"
        "print(gguf_summary(default_model_gguf()))\n"
    )
    assert done.out.endswith("134515008)") and done.imported == set()


def test_a_whole_file_is_complete_and_a_cut_one_is_named_incomplete(tmp_path: Path) -> None:
    gguf = default_model_gguf()
    check_gguf_complete(gguf)
    cut = tmp_path / "cut.gguf"
    with gguf.open("rb") as source, cut.open("wb") as target:
        shutil.copyfileobj(source, target)
        target.truncate(gguf.stat().st_size - 4096)
    with pytest.raises(CorruptModelError, match=r"cut\.gguf is an incomplete GGUF file: it has [\d,]+ bytes"):
        check_gguf_complete(cut)


def test_damaged_headers_give_clear_errors(tmp_path: Path) -> None:
    cases = {
        "short.gguf": (_header(_key("general.name"), kv_count=1), "ends inside its GGUF header; the file is truncated"),
        "type.gguf": (_header(_key("a"), struct.pack("<I", 99), kv_count=1), "unknown GGUF value type 99"),
        "long.gguf": (_header(struct.pack("<Q", 1 << 40), kv_count=1), "a GGUF header string claims"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(CorruptModelError, match=message) as info:
            read_gguf_header(path)
        assert name in str(info.value)


def test_long_arrays_are_read_in_full_only_when_asked_for(tmp_path: Path) -> None:
    from app.core.models.gguf_meta import SkippedArray, read_gguf_arrays
    from tests.helpers.gguf_files import sentencepiece_llama, synthetic_bpe, write_gguf

    bpe = synthetic_bpe(6000)
    path = write_gguf(tmp_path / "bpe.gguf", bpe)
    header = read_gguf_header(path)
    assert isinstance(header.metadata["tokenizer.ggml.tokens"], SkippedArray)
    assert header.metadata["tokenizer.ggml.tokens"].length == 6000
    keys = ["tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "no.such.key"]
    arrays = read_gguf_arrays(path, keys)
    assert arrays == {
        "tokenizer.ggml.tokens": bpe.tokens,
        "tokenizer.ggml.merges": bpe.merges,
        "tokenizer.ggml.token_type": bpe.token_types,
    }
    spm = sentencepiece_llama()
    scores = read_gguf_arrays(write_gguf(tmp_path / "spm.gguf", spm), ["tokenizer.ggml.scores"])
    assert scores["tokenizer.ggml.scores"] == spm.scores


def test_the_tensor_table_names_each_tensor_with_its_shape() -> None:
    header = read_gguf_header(default_model_gguf())
    embedding = next(tensor for tensor in header.tensors if tensor.name == "token_embd.weight")
    assert embedding.dims == (576, 49152) and embedding.shape == (49152, 576)
    assert {tensor.name for tensor in header.tensors} == header.tensor_names


def test_the_config_carries_the_tokenizers_special_ids() -> None:
    config = config_dict_from_gguf(default_model_gguf())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"], config["unk_token_id"]) == (
        1,
        2,
        2,
        0,
    )


def test_the_block_sizes_are_gguf_s_own() -> None:
    """The sizes that spare every load importing the gguf package, against that package's table."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    assert {kind: GGML_QUANT_SIZES[GGMLQuantizationType(kind)] for kind in BLOCK_SIZES} == BLOCK_SIZES
    iq4_nl = int(GGMLQuantizationType.IQ4_NL)  # a type outside the table: its size still comes from gguf's
    assert (
        iq4_nl not in BLOCK_SIZES and tensor_bytes(iq4_nl, 64) == 2 * GGML_QUANT_SIZES[GGMLQuantizationType.IQ4_NL][1]
    )
    assert tensor_bytes(9999, 64) == 0  # a type gguf does not know either: never a false "incomplete"
