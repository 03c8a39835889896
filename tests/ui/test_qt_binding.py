"""The Qt binding itself: PySide6 6.12.0 under Python 3.11 decremented None's refcount on every void call, which
kills the app with 'none_dealloc' after a few minutes of streaming. Guard against that build coming back."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, QTimer, Signal


class Emitter(QObject):
    ping = Signal(int, str)


def test_void_qt_calls_and_signal_emits_keep_none_and_bool_refcounts(qapp) -> None:
    timer = QTimer()
    emitter = Emitter()
    none_before, true_before, false_before = sys.getrefcount(None), sys.getrefcount(True), sys.getrefcount(False)
    for i in range(2000):
        timer.setInterval(5 + i % 3)  # void
        qapp.processEvents()  # void
        emitter.ping.emit(i, "x")  # returns a bool
        timer.isActive()
    # Other code may create or drop a few references meanwhile; a leak here is one per call (thousands).
    assert sys.getrefcount(None) - none_before > -100
    assert sys.getrefcount(True) - true_before > -100
    assert sys.getrefcount(False) - false_before > -100
