"""Hearth: run large language models on your own GPU, with numbers you can trust."""

__version__ = "0.1.0"
APP_NAME = "Hearth"
APP_ID = "hearth"
