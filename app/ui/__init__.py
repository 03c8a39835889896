"""Hearth's Qt front end. Never imports torch or the model libraries: the worker thread reaches the engine."""
