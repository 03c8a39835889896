"""Hearth's engine and data: plain Python, never Qt.

Modules that need torch import it at their top; the GUI reaches them only from its worker thread,
so the window can paint before torch is imported.
"""
