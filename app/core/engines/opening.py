"""The one load path of the window's worker and the command line: a LoadRequest in, a ChatBackend out.

Torch-free until it has to be: a q4 model on the CPU with its packed copy cached runs on the torch-free runtime
(app.core.engines.lite; the process then never imports torch), a remote engine's model opens a RemoteBackend, and
everything else loads through torch (app.core.engines.local), which also writes the packed copy a later load uses.
HEARTH_RUNTIME=torch always loads through torch; HEARTH_RUNTIME=lite refuses a load the runtime can't take.
"""

from __future__ import annotations

import logging
import threading

from app.core.engines.backend import ChatBackend, LoadRequest, ProgressCallback
from app.core.engines.lite.backend import LiteRefused, open_lite_backend, runtime_choice

log = logging.getLogger(__name__)


def open_backend(
    request: LoadRequest,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    *,
    runtime: str | None = None,
) -> ChatBackend:
    """Load the request's model: every option in the request reaches the loader the same way from every front end.
    `runtime` overrides HEARTH_RUNTIME ("torch" for a front end that needs what only torch does)."""
    if request.remote is not None:
        from app.core.engines.remote.session import open_remote_backend

        return open_remote_backend(request)
    choice = runtime or runtime_choice()
    if choice != "torch":
        lite = open_lite_backend(request, progress, cancel)
        if not isinstance(lite, str):
            return lite
        if choice == "lite":
            raise LiteRefused(f"The torch-free runtime can't run this model: {lite}.")
        log.info("loading through torch: %s", lite)
    from app.core.engines.local import open_engine_backend

    return open_engine_backend(request, progress, cancel)
