"""Who hears that the CPU kernel is about to be compiled: its first use on a machine without a prebuilt library runs
`gcc -O3` on its source (16 s on the 2-core Zen 4 CI guest, in parts side by side; 40 s as one object), which a
progress line left on "Opening…" would hide. Each front end says it its own way (the window's model bar and memory
panel, the command line's stderr); the listener is per thread, as the compile runs on the thread that first asks for
the library. Plain Python, so that the command line sets it without importing the kernel's dependencies."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Its words first: the model bar elides the rest at narrow widths (its tooltip and the memory panel show it whole).
COMPILE_NOTICE = "Compiling the CPU kernel (once for this machine, up to a minute)…"
_listener = threading.local()  # .say: this thread's announcer


@contextmanager
def announcing_compile(say: Callable[[str], None] | None) -> Iterator[None]:
    """While inside, a compile this thread starts is said through `say` (COMPILE_NOTICE) before it begins; None: not
    said (an inner front end's own announcer takes over from an outer one, and gives it back)."""
    previous = getattr(_listener, "say", None)
    _listener.say = say
    try:
        yield
    finally:
        _listener.say = previous


def say_compiling() -> None:
    """The kernel module, just before it compiles."""
    say = getattr(_listener, "say", None)
    if say is not None:
        say(COMPILE_NOTICE)
