"""`hearth models`: the models on this machine (or the curated list) with the memory planner's verdicts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.cli import Subparsers
from app.cli.common import add_quant_flag, saved_settings
from app.core.settings import DEVICES


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("models", help="list the models on this machine, with whether each one fits")
    parser.add_argument("--json", action="store_true", help="one JSON object per model")
    parser.add_argument("--recommended", action="store_true", help="list the curated chat models instead")
    parser.add_argument("--add", metavar="PATH", type=Path, help="add a model folder or .gguf file kept elsewhere")
    add_quant_flag(parser, default="the settings")
    parser.add_argument("--device", choices=DEVICES, help="device the verdict is for (default: settings)")
    parser.add_argument("--no-verdict", action="store_true", help="skip the memory planner (faster)")
    parser.add_argument(
        "--cache", action="store_true",
        help="show what the cache folder holds, and remove what interrupted runs left in it",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def _count(parameters: int | None) -> str:
    if not parameters:
        return "?"
    return f"{parameters / 1e9:.1f}B" if parameters >= 1e9 else f"{parameters / 1e6:.0f}M"


def run(args: argparse.Namespace) -> int:
    from app.core.engines.verdicts import library_verdict
    from app.core.memory.verdict import Verdict, model_verdict
    from app.core.models import library
    from app.core.models.hub_repo import format_bytes

    if args.cache:
        return show_cache(as_json=args.json)
    settings = saved_settings()
    quant = args.quant or settings.quantization
    device = args.device or settings.device
    if args.add is not None:
        added = library.add_path(args.add)
        print(f"Added {added.name} ({added.path}); load it with --model {added.spec}")
        return 0

    not_planned = Verdict("unknown", note="not planned (--no-verdict)")

    def verdict_for(source: Path | dict[str, object] | None) -> Verdict:
        return not_planned if args.no_verdict else model_verdict(source, quantization=quant, device=device)

    def verdict_on_disk(model: library.LibraryModel) -> Verdict:
        return not_planned if args.no_verdict else library_verdict(model, quantization=quant, device=device)

    if args.recommended:
        return _print_recommended(args, verdict_for)
    models = library.list_models()
    rows = []
    for model in models:
        verdict = verdict_on_disk(model)
        rows.append((model, verdict))
    if args.json:
        for model, verdict in rows:
            print(
                json.dumps(
                    {
                        "name": model.name,
                        "kind": model.kind,
                        "spec": model.spec,
                        "path": str(model.path),
                        "size_bytes": model.size_bytes,
                        "architecture": model.architecture,
                        "parameters": model.parameters or verdict.parameters,
                        "context_length": model.context_length,
                        "complete": model.complete,
                        "fits": verdict.fits,
                        "needs_bytes": verdict.total_bytes,
                        "quantization": quant,
                        "device": device,
                    }
                )
            )
        return 0
    if not models:
        print("No models found. Name a folder or .gguf file with --model, or `hearth pull REPO`.")
        return 0
    width = max(len(m.name) for m in models)
    print(
        f"{'NAME':<{width}}  {'KIND':<9}  {'SIZE':>9}  {'ARCH':<12} {'PARAMS':>6}  {'CONTEXT':>7}  "
        f"FITS ({quant}, {device})"
    )
    for model, verdict in rows:
        label = verdict.summary if model.complete else "incomplete download"
        print(
            f"{model.name:<{width}}  {model.kind:<9}  {format_bytes(model.size_bytes):>9}  "
            f"{model.architecture or '?':<12} "
            f"{_count(model.parameters or verdict.parameters):>6}  {model.context_length or 0:>7,}  {label}"
        )
    from app.core.models.hub import pending_downloads

    for pending in pending_downloads():
        file_flag = f" --file {pending.file}" if pending.file else ""
        print(f"Paused download: {pending.repo_id} (resume with `hearth pull {pending.repo_id}{file_flag}`)")
    return 0


def _print_recommended(args: argparse.Namespace, verdict_for: object) -> int:
    from app.core.models import library

    assert callable(verdict_for)
    entries = library.recommended_models()
    if args.json:
        for entry in entries:
            verdict = verdict_for(entry.config)
            print(
                json.dumps(
                    {
                        "repo_id": entry.repo_id,
                        "size_class": entry.size_class,
                        "parameters": entry.parameters,
                        "licence": entry.licence,
                        "gated": entry.gated,
                        "gguf": f"{entry.gguf_repo}/{entry.gguf_file}" if entry.gguf_repo else None,
                        "fits": verdict.fits,
                        "needs_bytes": verdict.total_bytes,
                    }
                )
            )
        return 0
    width = max(len(e.repo_id) for e in entries)
    print(f"{'REPO':<{width}}  {'PARAMS':>6}  {'LICENCE':<38} {'GATED':<5}  FITS")
    for entry in entries:
        verdict = verdict_for(entry.config)
        print(
            f"{entry.repo_id:<{width}}  {_count(entry.parameters):>6}  {entry.licence:<38} "
            f"{'yes' if entry.gated else 'no':<5}  {verdict.summary}"
        )
    print("\nDownload one with `hearth pull REPO`; gated models need `hearth token set` first.")
    return 0


def show_cache(*, as_json: bool) -> int:
    """`hearth models --cache`: each entry of the cache folder with its size, then the leftovers of killed runs
    (partial files and staging folders whose process is gone), removed."""
    from app.core.storage import paths, staging
    from app.core.storage.space import format_size, free_bytes

    root = paths.cache_dir()
    leftovers = staging.find_leftovers(root)
    skip = {leftover.path for leftover in leftovers}
    entries = []
    for entry in sorted(root.iterdir()):
        if entry in skip:
            continue
        size = _tree_size(entry, skip)
        entries.append((entry, size))
    removed = staging.remove(leftovers)
    freed = sum(leftover.size_bytes for leftover in removed)
    if as_json:
        print(json.dumps({
            "folder": str(root), "free_bytes": free_bytes(root),
            "entries": [{"name": entry.name, "bytes": size} for entry, size in entries],
            "removed": [{"path": str(r.path), "bytes": r.size_bytes, "why": r.why} for r in removed],
        }))  # fmt: skip
        return 0
    free = free_bytes(root)
    print(f"Cache: {root} ({format_size(sum(size for _, size in entries))}; "
          f"{format_size(free) if free is not None else 'unknown'} free on its disk)")  # fmt: skip
    for entry, size in entries:
        print(f"  {format_size(size):>10}  {entry.name}{'/' if entry.is_dir() else ''}")
    if removed:
        print(f"Removed {len(removed)} leftover(s) of interrupted runs, {format_size(freed)}:")
        for leftover in removed:
            print(f"  {format_size(leftover.size_bytes):>10}  {leftover.path} ({leftover.why})")
    else:
        print("No leftovers of interrupted runs.")
    print("Everything here is rebuilt when needed; delete the folder to reclaim all of it.")
    return 0


def _tree_size(path: Path, skip: set[Path]) -> int:
    """Bytes under `path`, leaving out `skip` (what is about to be removed), never following links."""
    if path.is_symlink() or path in skip:
        return 0
    if not path.is_dir():
        try:
            return path.stat().st_size
        except OSError:
            return 0
    return sum(_tree_size(child, skip) for child in _children(path))


def _children(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []
