"""The one load path of the window's worker and the command line: a LoadRequest in, a ChatBackend out.

Torch-free until it has to be: on the CPU, a GGUF file runs on its own blocks and a q4 model folder with its packed
copy cached runs from that copy, on the torch-free runtime (app.core.engines.lite; the process then never imports
torch); a remote engine's model opens a RemoteBackend; everything else loads through torch (app.core.engines.local),
which also writes the packed copy a later load uses. A GGUF the runtime can't run goes through torch with a notice
saying why. HEARTH_RUNTIME=torch always loads through torch; HEARTH_RUNTIME=lite refuses a load the runtime can't
take.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from app.core.engines.backend import ChatBackend, LoadRequest, ProgressCallback
from app.core.engines.lite.backend import GGUF_DECLINED, LiteRefused, open_lite_backend, runtime_choice
from app.core.fastpath.compile_notice import announcing_compile
from app.core.memory.types import MemoryPlan
from app.core.models.model_source import resolve_model

log = logging.getLogger(__name__)
ONE_AT_A_TIME_NOTE = (
    "served replies decode one at a time on this runtime (only the torch-free runtime on a GGUF file batches them): "
    "one KV cache, whatever --parallel"
)


def open_backend(
    request: LoadRequest,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    *,
    runtime: str | None = None,
) -> ChatBackend:
    """Load the request's model: every option in the request reaches the loader the same way from every front end.
    `runtime` overrides HEARTH_RUNTIME ("torch" for a front end that needs what only torch does). A first compile of
    the CPU kernel on the way is said through `progress`, as a stage of its own."""
    say = None if progress is None else lambda message: progress(message, None)
    with announcing_compile(say):
        return _open_backend(request, progress, cancel, runtime)


def _open_backend(
    request: LoadRequest, progress: ProgressCallback | None, cancel: threading.Event | None, runtime: str | None
) -> ChatBackend:
    if request.remote is not None:
        from app.core.engines.remote.session import open_remote_backend

        return open_remote_backend(request)
    resolve_model(request.model)  # a model that is not there is said now, not after importing torch (~3 s)
    choice = runtime or runtime_choice()
    declined = ""  # why the torch-free runtime did not take the load
    if choice != "torch":
        lite = open_lite_backend(request, progress, cancel)
        if not isinstance(lite, str):
            return lite
        if choice == "lite":
            raise LiteRefused(f"The torch-free runtime can't run this model: {lite}.")
        log.info("loading through torch: %s", lite)
        declined = lite
    from app.core.engines.local import open_engine_backend

    backend = open_engine_backend(request, progress, cancel)
    if declined.startswith(GGUF_DECLINED):  # said, never silent: another path, slower and bigger
        said = (
            f"Hearth's own CPU runtime can't run this file ({declined.removeprefix(GGUF_DECLINED)}): it was loaded "
            "through PyTorch instead, dequantized in memory, which is slower and takes more memory."
        )
        backend.info = replace(backend.info, notices=(*backend.info.notices, said))
    return backend


def plan_load(
    request: LoadRequest, free_bytes: int | None = None, cpu_free_bytes: int | None = None, replies: int = 1
) -> MemoryPlan:
    """The memory plan of the runtime this load will take: the torch-free runtime's own figures where it takes the
    model (a GGUF file's blocks to the byte; no torch imported), else the memory planner's (imports torch). What the
    window shows before loading and what `hearth plan` prints. `replies`: served replies decoded together, each
    with its own KV cache, where the runtime batches them (the torch runtimes decode one at a time: one cache).
    HearthError for the user's errors."""
    from app.core.engines.lite.backend import lite_plan

    plan = lite_plan(request, free_bytes, replies)
    if not isinstance(plan, str):
        if plan.replies < replies:
            plan = replace(plan, notes=(*plan.notes, ONE_AT_A_TIME_NOTE))
        return plan
    from app.core.models.model_source import read_config

    source = resolve_model(request.model) if request.model is None or not request.model.endswith(".json") else None
    if source is not None and source.kind != "gguf" and (source.path / "config.json").is_file():
        read_config(source.path)  # a damaged or hostile config is refused here, before torch is imported
    from app.core.memory.planner import plan_memory

    plan = plan_memory(
        request.model,
        quantization=request.quantization,
        context=request.context_length,
        device=request.device,
        free_bytes=free_bytes,
        cpu_free_bytes=cpu_free_bytes,
    )
    return replace(plan, notes=(*plan.notes, ONE_AT_A_TIME_NOTE)) if replies > 1 else plan
