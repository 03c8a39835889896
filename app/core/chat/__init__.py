"""The vocabulary of a reply: messages and events, chat templates, sampling, detokenizing, the response cache."""
