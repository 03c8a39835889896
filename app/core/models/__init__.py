"""Finding models and the facts about them: the Hub, the library on disk, GGUF files, quantization names."""
