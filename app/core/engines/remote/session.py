"""Opening a RemoteBackend from the registry: `hearth chat --engine NAME` (a ChatSession over it) and the window's
model picker (a LoadRequest naming a RemoteModel, through app.core.engines.opening.open_backend)."""

from __future__ import annotations

from typing import Any

from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest
from app.core.engines.remote.backend import RemoteBackend
from app.core.engines.session import ChatSession


def open_remote_backend(request: LoadRequest) -> RemoteBackend:
    """The request's remote model on its engine; HearthError (one sentence) for an unknown engine or a key the
    keyring lacks. Opens no connection: a bad key or an unknown model is reported at the first reply, in the chat."""
    from app.core.engines.remote import engines as registry

    assert request.remote is not None
    engine = registry.get_engine(request.remote.engine)
    cache = None
    if engine.response_cache and request.response_cache:  # off unless both the engine and the settings allow it
        from app.core.chat.response_cache import ResponseCache

        cache = ResponseCache()
    return RemoteBackend(
        engine,
        request.remote.model,
        api_key=registry.key_for(engine),
        context_window=request.context_length or 0,
        response_cache=cache,
    )


def open_remote_session(settings: Any, args: Any, params: SamplingParams) -> ChatSession:
    """`hearth chat --engine NAME [--model ID]`: the engine from the registry, its key from the keyring."""
    from app.core.engines.remote import engines as registry
    from app.core.errors import HearthError

    engine = registry.get_engine(args.engine)
    model = args.model or engine.default_model
    if not model:
        raise HearthError(
            f"Choose a model for engine {engine.name!r} with --model "
            f"(`hearth engines test {engine.name}` lists them), or set one with `hearth engines add --model`."
        )
    cache = None
    if engine.response_cache and settings.response_cache and not getattr(args, "no_response_cache", False):
        from app.core.chat.response_cache import ResponseCache

        cache = ResponseCache()
    backend = RemoteBackend(engine, model, api_key=registry.key_for(engine), response_cache=cache)
    return ChatSession(
        backend,
        system_prompt=args.system if args.system is not None else settings.system_prompt,
        params=params,
        context_policy=args.context_policy or settings.context_policy,
        use_response_cache=not getattr(args, "no_response_cache", False),
    )
