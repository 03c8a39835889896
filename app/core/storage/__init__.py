"""What Hearth keeps on disk and in the keyring: history, secrets, the JSON schema, where files live."""
