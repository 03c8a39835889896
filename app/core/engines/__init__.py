"""Chat backends: a ReplyRequest in, typed events out (loading and running the local model, remote engines)."""
