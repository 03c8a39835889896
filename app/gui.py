"""`hearth-gui`: the desktop app. Paints the window first; torch is imported later, inside the worker thread."""

from __future__ import annotations

import argparse
import os
import sys
import time


def _process_age_s() -> float:
    """Seconds since this process started (the OS's own start time, so interpreter start-up counts too)."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:
        return time.perf_counter()


def freeze_startup_objects() -> None:
    """Move everything allocated at start-up out of the cyclic GC's reach: full collections then only walk
    objects made since, so they stop pausing the GUI for tens of milliseconds mid-reply."""
    import gc

    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    from app.core.fastpath.openmp import prefer_short_spin

    prefer_short_spin()  # before the worker imports torch (app.core.fastpath.openmp)
    parser = argparse.ArgumentParser(prog="hearth-gui", description="Hearth: chat with a local language model.")
    parser.add_argument(
        "model",
        nargs="?",
        default=os.environ.get("HEARTH_OPEN_MODEL") or None,  # a double-clicked .gguf, passed by the launcher
        help="open this model (folder, .gguf file or cached repo id) for this run",
    )
    parser.add_argument("--no-autoload", action="store_true", help="do not load the model at start")
    parser.add_argument(
        "--first-paint-report",
        action="store_true",
        help="print the time from process start to the first paint (and whether torch was imported), then quit",
    )
    args = parser.parse_args(argv if argv is not None else sys.argv[1:])

    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from app import APP_NAME
    from app.core.crash import install_hooks
    from app.core.settings import read_settings
    from app.ui import theme
    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    assert isinstance(app, QApplication)
    app.setApplicationName(APP_NAME)
    app.setDesktopFileName("hearth")
    try:
        from app.resources import resource_path

        app.setWindowIcon(QIcon(str(resource_path("icons", "hearth.svg"))))
    except FileNotFoundError:
        pass

    early_errors: list[str] = []
    hooks = install_hooks(lambda message, details: early_errors.append(message))
    # A damaged or mistyped settings file never stops the window: it runs on defaults and says so in a banner.
    settings_file = read_settings()
    settings = settings_file.settings
    startup_notes = [settings_file.window_line()] if not settings_file.ok else []
    if settings_file.unknown_keys:
        startup_notes.append(settings_file.unknown_line())
    # What killed runs left in the cache goes, as at every command-line start (each removal is logged; a start-up
    # banner for a cleanup would be noise). A few ms: one listing of the cache's folders.
    from app.core.storage import staging

    staging.sweep_at_start()
    if args.model:
        settings = settings.with_changes(model=args.model)  # this run only: not saved
    theme.apply(app, settings.theme)
    window = MainWindow(
        settings,
        autoload=not (args.no_autoload or args.first_paint_report),
        settings_file_rejected=not settings_file.ok,
    )
    hooks.callback = window.errors.report
    for message in [*early_errors, *startup_notes]:
        window.show_error(message)

    freeze_startup_objects()
    if args.first_paint_report:

        def report() -> None:
            print(
                f"first_paint_s={_process_age_s():.3f} cpu_s={time.process_time():.3f} "
                f"torch_imported={'torch' in sys.modules}",
                flush=True,
            )
            QTimer.singleShot(0, window.close)

        window.first_painted.connect(report)
    window.show()
    code = app.exec()
    hooks.uninstall()
    return int(code)


if __name__ == "__main__":
    os.environ.setdefault("QT_ENABLE_HIGHDPI_SCALING", "1")
    raise SystemExit(main())
