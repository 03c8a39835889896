"""The one GGUF header reader: the library and the planner read the same config from a file, and damaged files
are named as such."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from app.core.errors import CorruptModelError
from app.core.models.gguf_meta import check_gguf_complete, config_dict_from_gguf, gguf_summary, read_gguf_header
from app.core.models.model_source import default_model_gguf


def _header(*entries: bytes, kv_count: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, kv_count) + b"".join(entries)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_the_library_lists_the_config_the_planner_reads() -> None:
    gguf = default_model_gguf()
    config, parameters = gguf_summary(gguf)
    assert config == config_dict_from_gguf(gguf)
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 3
    # Keys the library's old hand-written table of 8 left out, so its plans differed from the planner's.
    assert config["rms_norm_eps"] == pytest.approx(1e-5) and config["rope_theta"] == 100000.0
    assert parameters == 134_515_008 == read_gguf_header(gguf).parameters


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
