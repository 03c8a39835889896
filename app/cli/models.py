"""`hearth models`: what can be loaded without a download."""

from __future__ import annotations

import argparse
import json

from app.cli import Subparsers
from app.core.local_models import list_local_models


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("models", help="list the models on this machine")
    parser.add_argument("--json", action="store_true", help="one JSON object per model")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    models = list_local_models()
    if args.json:
        for model in models:
            print(
                json.dumps(
                    {"name": model.name, "kind": model.kind, "path": str(model.path), "size_bytes": model.size_bytes}
                )
            )
        return 0
    if not models:
        print("No models found. Name a folder or .gguf file with --model, or `hearth pull REPO`.")
        return 0
    width = max(len(m.name) for m in models)
    print(f"{'NAME':<{width}}  {'KIND':<9}  {'SIZE':>9}  PATH")
    for model in models:
        print(f"{model.name:<{width}}  {model.kind:<9}  {model.size_bytes / 2**20:>7.0f}MB  {model.path}")
    return 0
