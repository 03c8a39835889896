"""What vulture (`make lint`, [tool.vulture] in pyproject.toml) takes for unused but is used, each with its reason.

A line names the thing as vulture's --make-whitelist writes it; `_.name` is an attribute. Adding a line here needs
its reason: dead code is deleted, not listed.
"""
# ruff: noqa
# type: ignore

# Parameters a caller's signature requires (signal handlers, HTMLParser, keyring backends, tokenizer callbacks).
frame  # app/cli/chat.py: signal handler
signum  # app/cli/chat.py: signal handler
attrs  # app/core/documents/html_text.py: HTMLParser.handle_starttag
priority  # tests/helpers/memory_keyring.py: keyring's backend priority
token_type  # bench/engine_speed.py: an unpacked tuple's unused part

# Dataclass fields read through asdict() / JSON (the `--json` schemas, server records, llama-server timings).
peak_memory_bytes  # app/core/chat/events.py: ReplyStats, in `--json` stats
conversation_total_usd  # app/core/engines/remote/pricing.py: ReplyCost, in `--json` stats
predicted_n  # app/core/engines/remote/backend.py: llama-server's timings block
prompt_per_second  # app/core/engines/remote/backend.py: llama-server's timings block
queued_ms  # app/core/server/api.py: the request record the window's server panel and logs get
duration_ms  # app/core/server/api.py: the request record
media_type  # app/core/server/api.py: starlette Response class attribute
taken_at  # app/core/memory/types.py: MemoryReading's time, part of the record
is_default  # app/core/models/model_source.py: ModelSource field
restored_tokens  # app/core/chat/events.py: ReplyStats, read through asdict() by app/core/stats_text.py
lookup_checks  # app/core/chat/events.py: ReplyStats, in `--json` stats
lookup_proposed  # app/core/chat/events.py: ReplyStats, read through asdict() by app/core/stats_text.py
lookup_accepted  # app/core/chat/events.py: ReplyStats, read through asdict() by app/core/stats_text.py

# Fields of pydantic models the client-library tests hand to the libraries, which fill them from the reply.
town  # tests/cli/test_serve_clients.py: an enum member of Kind
village  # tests/cli/test_serve_clients.py: an enum member of Kind
population  # tests/cli/test_serve_clients.py: City
area_km2  # tests/cli/test_serve_clients.py: City
mayor  # tests/cli/test_serve_clients.py: City

# Attributes set on library objects, read by the library.
_.writeable  # numpy array flags
_.__class__  # swapping a module's class (app/core/fastpath/prefill.py, tests/core/engines/test_loader.py)
_.background  # starlette Response
_.text_factory  # sqlite3.Connection
_.exc_text  # logging.LogRecord
_.pre_tokenizer  # tokenizers.Tokenizer (bench/gpu_check.py)
_.optionxform  # configparser (tests/packaging/test_packaging_files.py)
_.pure  # PyInstaller spec objects (tests/packaging/test_packaging_files.py)
_.raiseExceptions  # logging module flag (app/cli/__init__.py): a failed log write prints no traceback
_.encode_special_tokens  # tokenizers.Tokenizer: special-token text in user text stays text
_.eof_received  # asyncio.Protocol callback (app/core/server/connection.py)
_.tags  # jinja2.ext.Extension: the block tags it parses (app/core/chat/chat_template.py)
_._body  # called from the compiled template through Extension.call_method (app/core/chat/chat_template.py)
_.scripts

# pytest fixtures asked for by name for their side effect.
packed_default
no_keyring
no_fused_step
fresh_library

# In the lead's areas (app/core/engines, fastpath, planner, quant; app/ui): left for their owners (issue 32).
device_map_json  # app/core/engines/loader.py: dead, the lead deletes it
used_fallback_template  # app/core/engines/generation.py: never read
prepare_seconds  # app/core/fastpath/select.py: never read
WEIGHT_FORMATS  # app/core/fastpath/kernel.py: named in a docstring only
other_bytes  # app/core/memory/planner.py: never read
DESCRIPTIONS  # app/core/models/quant.py: never read
_._notes  # app/ui/model_bar.py: set, never read
