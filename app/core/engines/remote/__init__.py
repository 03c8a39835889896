"""Remote engines: their registry and keyring keys, the streaming RemoteBackend, and what replies cost."""
