"""A private cache folder given this run's kernel library, for tests about something else.

In a fresh clone no prebuilt kernel ships, so a `hearth` process with a cache folder of its own compiles the library
at -O3 first (~20 s on a 2-core machine). The compile, its cache and its checks have their own tests
(tests/core/test_native_integrity.py); the others copy the library this run already compiled, with its checksum file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from app.core.fastpath import integrity, kernel


def seed_kernel(cache: Path) -> None:
    """Copy the library this process uses (compiled into the run's shared cache) into `cache`'s own native folder,
    where a process with HEARTH_CACHE_DIR=`cache` looks for it; nothing when it came prebuilt (found the same way from
    any cache) or there is none. `cache` is made if missing."""
    cache.mkdir(parents=True, exist_ok=True)
    library = kernel.load_library()
    if isinstance(library, str) or not library.compiler:
        return
    native = cache / "native"
    native.mkdir(parents=True, exist_ok=True)
    for source in (library.path, integrity.sidecar(library.path)):
        shutil.copy2(source, native / source.name)


def compile_by_copy(monkeypatch: pytest.MonkeyPatch, library: Path) -> list[list[str]]:
    """kernel._compile publishes a copy of `library` (a kernel this run already built) where a compile would, instead
    of running the compiler (12-40 s a build on 2 cores): for tests about what happens around a compile (its cache,
    its checks, the quarantine, what the user is told); the compile itself has its own tests (other compilers,
    assemblers and targets, in a fresh process too). Returns the flags of every compile asked for."""
    asked: list[list[str]] = []

    def copy(compiler: str, flags: list[str], target: Path) -> str:
        asked.append(flags)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        shutil.copyfile(library, partial)
        integrity.publish(partial, target)
        return ""

    monkeypatch.setattr(kernel, "_compile", copy)
    return asked
