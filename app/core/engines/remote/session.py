"""Opening a RemoteBackend from the registry: `hearth chat --engine NAME` (a ChatSession over it) and the window's
model picker (a LoadRequest naming a RemoteModel, through app.core.engines.opening.open_backend)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest
from app.core.engines.remote.backend import RemoteBackend
from app.core.engines.session import ChatSession
from app.core.errors import HearthError


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


def open_remote_session(
    settings: Any, args: Any, params: SamplingParams, say: Callable[[str], None] = lambda _note: None
) -> ChatSession:
    """`hearth chat --engine NAME [--model ID]`: the engine from the registry, its key from the keyring. Without
    --model or a default model, an engine that serves exactly one model answers with it (`say` tells the user)."""
    from app.core.engines.remote import engines as registry

    engine = registry.get_engine(args.engine)
    model = args.model or engine.default_model or only_model(engine, registry.key_for(engine), say)
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


def only_model(engine: Any, api_key: str | None, say: Callable[[str], None]) -> str:
    """The one model an engine lists at GET /v1/models; HearthError naming what it lists when that is not one."""
    ask = f"Choose a model for engine {engine.name!r} with --model, or set one with `hearth engines add --model`"
    if engine.kind != "openai-compatible":  # Anthropic lists models through a beta endpoint only on some accounts
        raise HearthError(f"{ask}.")
    backend = RemoteBackend(engine, "?", api_key=api_key)  # a placeholder: listing names no model
    try:
        models = backend.list_models()
    except HearthError as err:
        raise HearthError(f"{ask} (its model list could not be read: {err})") from None
    finally:
        backend.close()
    if len(models) != 1:
        listed = ", ".join(models[:10]) + (f" and {len(models) - 10} more" if len(models) > 10 else "")
        raise HearthError(f"{ask}: it serves {listed}." if models else f"{ask}: it lists no models.")
    say(f"engine {engine.name!r} serves one model, {models[0]}: using it (--model picks another)")
    return models[0]
