"""Hearth's engine and data: plain Python, never Qt. Grouped by job, lowest layer first (an import-linter contract
keeps the packages free of cycles):

- storage: what Hearth keeps on disk and in the keyring (history, secrets, the JSON schema, paths)
- models: finding models and the facts about them (Hub, library, GGUF files, quantization names, attention shape)
- fastpath: faster CPU decode steps (the C kernels) chosen per loaded model
- memory: the memory planner (before a load) and live accounting (after it)
- chat: the vocabulary of a reply (messages, events, chat templates, sampling, the response cache)
- engines: chat backends, a ReplyRequest in and typed events out (the local engine and its loader, remote engines)
- documents: documents in prompts; server: the OpenAI-compatible server; settings, errors, crash: shared by all

Modules that need torch import it at their top; the GUI reaches them only from its worker thread, so the window can
paint before torch is imported.
"""
