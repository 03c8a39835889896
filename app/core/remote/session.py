"""`hearth chat --engine NAME`: a ChatSession over a RemoteBackend, the engine taken from the registry."""

from __future__ import annotations

from typing import Any

from app.core.remote.backend import RemoteBackend
from app.core.sampling import SamplingParams
from app.core.session import ChatSession


def open_remote_session(settings: Any, args: Any, params: SamplingParams) -> ChatSession:
    """`hearth chat --engine NAME [--model ID]`: the engine from the registry, its key from the keyring."""
    from app.core.errors import HearthError
    from app.core.remote import engines as registry

    engine = registry.get_engine(args.engine)
    if getattr(args, "attach", None):
        raise HearthError("--attach works with local models only; paste the text into the prompt for a remote engine.")
    model = args.model or engine.default_model
    if not model:
        raise HearthError(
            f"Choose a model for engine {engine.name!r} with --model "
            f"(`hearth engines test {engine.name}` lists them), or set one with `hearth engines add --model`."
        )
    cache = None
    if engine.response_cache and settings.response_cache and not getattr(args, "no_response_cache", False):
        from app.core.response_cache import ResponseCache

        cache = ResponseCache()
    backend = RemoteBackend(engine, model, api_key=registry.key_for(engine), response_cache=cache)
    return ChatSession(
        backend,
        system_prompt=args.system if args.system is not None else settings.system_prompt,
        params=params,
        context_policy=args.context_policy or settings.context_policy,
        use_response_cache=not getattr(args, "no_response_cache", False),
    )
