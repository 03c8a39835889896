"""Constrained decoding: response formats and tool calls enforced while decoding, with llguidance.

Each step the reply's matcher fills a bitmask of the tokens that keep the reply valid; the engine masks its logits
(numpy arrays here; the torch engine turns the same mask into a tensor) and tells the matcher which token it picked.
The reply can then only be text the grammar accepts, or stop early at the length limit. Torch-free, so the
torch-free runtime enforces the same grammars as the torch one and `hearth serve` runs the runtime `hearth chat` runs.

Before compiling, a schema is checked and bounded (docs/structured-output.md): its size, nesting and properties
against the limits below; every `$ref` must point inside the schema (nothing is ever fetched) and lead somewhere;
integers and numbers get at most NUMBER_DIGITS digits unless the schema's own bounds need more, numbers at most
FRACTION_DIGITS after the point, so a small model writing "1111…" cannot run to the length limit; objects that
list their properties take no others unless the schema says so; a value the schema leaves open is any JSON with
those number bounds. A compile that takes longer than COMPILE_SECONDS is refused, and remembered as refused.
"""

from __future__ import annotations

import collections
import json
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.chat.standalone_tokenizer import StandaloneTokenizer
from app.core.engines.backend import ResponseFormat
from app.core.engines.tool_prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from app.core.errors import HearthError

MAX_SCHEMA_BYTES = 64 * 1024  # the schema as compact JSON text
MAX_SCHEMA_DEPTH = 32  # nested subschemas
MAX_PROPERTIES = 1_000  # named properties, all objects together
MAX_OPTIONAL_PROPERTIES = 200  # named properties one object may leave out (each doubles what the parser tracks)
COMPILE_SECONDS = 5.0  # building the grammar and its first mask
NUMBER_DIGITS = 15  # an integer's digits, a number's before the point (unless the schema's bounds need more)
FRACTION_DIGITS = 9  # a number's digits after the point (as multipleOf 1e-9; llguidance takes no finer step)
COMPILED_KEPT = 32  # compiled grammars kept per engine (an API client repeats its schema)

ANY_VALUE = "hearth-any-value"  # the $defs entry that stands for "any JSON value" with bounded numbers
ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
VALUE_MAPS = ("properties", "patternProperties")  # keywords whose values are the schemas of an object's values
SCHEMA_MAPS = ("$defs", "definitions", "dependentSchemas", *VALUE_MAPS)
VALUE_SCHEMAS = ("additionalProperties", "items", "additionalItems", "unevaluatedProperties", "unevaluatedItems")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
OTHER_SCHEMAS = ("contains", "propertyNames", "not", "if", "then", "else")
OTHER_PROPERTIES = ("additionalProperties", "patternProperties", "unevaluatedProperties")
SAME_VALUE = ("allOf", "anyOf", "oneOf")  # applicators on the same value: a $ref cycle through these never ends

Bools = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float32]


class SchemaError(HearthError):
    """The schema cannot be enforced: the message says why in the schema's own terms (and names the limit)."""


class GrammarError(RuntimeError):
    """The grammar failed while decoding (a parser limit reached mid-reply): the reply ends with this error."""


@dataclass(frozen=True)
class GrammarSpec:
    """What a reply must match: llguidance's grammar text (its cache key) and what it came from, for messages."""

    grammar: str
    source: str  # "The JSON schema in response_format", "The tools' parameters"


# -- schemas: checked, bounded, compiled -----------------------------------------------------------------------
def grammar_for_format(fmt: ResponseFormat, source: str = "The JSON schema in response_format") -> GrammarSpec | None:
    """The grammar of a response format (None for free text); SchemaError when the schema cannot be enforced."""
    if fmt.kind == "text":
        return None
    schema = {"type": "object"} if fmt.kind == "json_object" else (fmt.json_schema or {"type": "object"})
    return GrammarSpec(_json_grammar(bounded_schema(schema, source)), source)


def grammar_for_tool_calls(tools: list[dict[str, Any]]) -> GrammarSpec:
    """Free text, or tool calls as <tool_call>{"name", "arguments"}</tool_call> blocks (what the fallback prompt
    asks for): the text can't start with '<', and once a call opens it must name a tool and match its parameters."""
    source = "The tools' parameters"
    call = bounded_schema(tool_call_schema(tools), source)
    call["x-guidance"] = {"whitespace_flexible": False}
    lark = (
        "start: TEXT | calls\n"
        "TEXT: /[^<](.|\\n)*/\n"
        "calls: call+\n"
        f'call: "{TOOL_CALL_OPEN}" body "{TOOL_CALL_CLOSE}" "\\n"?\n'
        f"body: %json {json.dumps(call, ensure_ascii=False)}\n"
    )
    import llguidance

    return GrammarSpec(llguidance.LLMatcher.grammar_from_lark(lark), source)


def tool_call_schema(tools: list[dict[str, Any]], only: str | None = None) -> dict[str, Any]:
    """The JSON a call must be: {"name": one of the tools, "arguments": its parameters} (`only`: that tool)."""
    chosen = [tool["function"] for tool in tools if only is None or tool["function"]["name"] == only]
    options = []
    for i, function in enumerate(chosen):
        # The parameters' own "#/$defs/…" references, re-rooted where the parameters now sit.
        at = "#/properties/arguments" if len(chosen) == 1 else f"#/anyOf/{i}/properties/arguments"
        try:
            parameters = _rerooted(function.get("parameters") or {"type": "object"}, at)
        except RecursionError:
            raise SchemaError(
                f"The parameters of the tool {function['name']!r} nest more than {MAX_SCHEMA_DEPTH} deep; Hearth "
                f"enforces at most {MAX_SCHEMA_DEPTH} levels (its limit on schema size)."
            ) from None
        options.append({
            "type": "object",
            "properties": {"name": {"const": function["name"]}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })  # fmt: skip
    return options[0] if len(options) == 1 else {"anyOf": options}


def _rerooted(schema: Any, at: str) -> Any:
    """A copy of the schema with its local JSON-pointer references ('#', '#/…') made relative to `at`."""
    if isinstance(schema, list):
        return [_rerooted(item, at) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _rerooted(value, at) for key, value in schema.items()}
    reference = schema.get("$ref")
    if isinstance(reference, str) and (reference == "#" or reference.startswith("#/")):
        out["$ref"] = at + reference[1:]
    return out


def _json_grammar(schema: dict[str, Any]) -> str:
    import llguidance

    try:
        # Compact JSON: with free whitespace a small model can pad forever inside the braces.
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": False}))
    except ValueError as exc:
        raise SchemaError(f"The JSON schema cannot be read: {exc}") from None


def bounded_schema(schema: Any, source: str) -> dict[str, Any]:
    """A copy of the schema, checked against the limits and its references, with the bounds described above."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{source} must be a JSON object, not {type(schema).__name__}.")
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except RecursionError:
        size = MAX_SCHEMA_BYTES + 1  # nested past what Python's JSON writer follows
    if size > MAX_SCHEMA_BYTES:
        raise SchemaError(
            f"{source} is {size:,} bytes; Hearth enforces schemas of at most {MAX_SCHEMA_BYTES:,} bytes "
            "(its limit on schema size)."
        )
    copy = json.loads(json.dumps(schema))
    nodes = list(_walk(copy, source))
    properties = sum(len(node.get("properties") or {}) for node, _ in nodes if isinstance(node.get("properties"), dict))
    if properties > MAX_PROPERTIES:
        raise SchemaError(
            f"{source} names {properties:,} properties; Hearth enforces at most {MAX_PROPERTIES:,} in all "
            "(its limit on schema size)."
        )
    for node, path in nodes:
        _check_node(node, path, copy, source)
    _check_reference_cycles(copy, nodes, source)
    needs_any = False
    for node, _ in nodes:
        _bound_numbers(node)
        if isinstance(node.get("properties"), dict) and not any(k in node for k in OTHER_PROPERTIES):
            node["additionalProperties"] = False  # the listed properties only, as OpenAI's strict mode
        needs_any |= _close_open_values(node)
    if copy.get("type") == "object" and not any(k in copy for k in ("properties", "additionalProperties")):
        copy["additionalProperties"] = {"$ref": f"#/$defs/{ANY_VALUE}"}  # {"type": "object"}: json_object
        needs_any = True
    if needs_any:
        copy.setdefault("$defs", {})[ANY_VALUE] = _any_value()
    return copy


def _walk(root: dict[str, Any], source: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every subschema object with its JSON pointer, depth-first; SchemaError past MAX_SCHEMA_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(
                f"{source} nests subschemas more than {MAX_SCHEMA_DEPTH} deep (at {path or '/'}); Hearth enforces "
                f"at most {MAX_SCHEMA_DEPTH} levels (its limit on schema size)."
            )
        yield node, path
        for key in (*SCHEMA_MAPS, *VALUE_SCHEMAS, *SCHEMA_LISTS, *OTHER_SCHEMAS):
            value = node.get(key)
            if key in SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((sub, f"{path}/{key}/{_escape(name)}", depth + 1) for name, sub in value.items())
            elif isinstance(value, list) and key in (*SCHEMA_LISTS, "items"):
                stack.extend((sub, f"{path}/{key}/{i}", depth + 1) for i, sub in enumerate(value))
            elif isinstance(value, dict):
                stack.append((value, f"{path}/{key}", depth + 1))


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _check_node(node: dict[str, Any], path: str, root: dict[str, Any], source: str) -> None:
    where = path or "/"
    properties = node.get("properties")
    if isinstance(properties, dict):
        required = node.get("required")
        listed = {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()
        optional = len([name for name in properties if name not in listed])
        if optional > MAX_OPTIONAL_PROPERTIES:
            raise SchemaError(
                f"{source} leaves {optional:,} properties of the object at {where} optional; Hearth enforces at "
                f"most {MAX_OPTIONAL_PROPERTIES} optional properties per object (its limit on schema size): list "
                "more of them in 'required'."
            )
    reference = node.get("$ref")
    if reference is None:
        return
    if not isinstance(reference, str):
        raise SchemaError(f"{source} has a $ref at {where} that is not a string.")
    if not reference.startswith("#"):
        raise SchemaError(
            f"{source} has a $ref at {where} to {reference[:200]!r}, outside the schema: Hearth enforces only "
            "references within the schema ('#/$defs/…') and never fetches one. Put the definition in '$defs'."
        )
    if _resolve(root, reference) is None:
        raise SchemaError(f"{source} has a $ref at {where} to {reference[:200]!r}, which is not in the schema.")


def _resolve(root: dict[str, Any], reference: str) -> Any:
    """The subschema a local reference ('#', '#/a/b', '#anchor') points to, or None."""
    fragment = reference[1:]
    if fragment and not fragment.startswith("/"):  # a plain-name fragment: an $anchor
        return next((node for node, _ in _walk(root, "") if node.get("$anchor") == fragment), None)
    node: Any = root
    for part in fragment.split("/")[1:]:
        part = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), part)
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _check_reference_cycles(root: dict[str, Any], nodes: list[tuple[dict[str, Any], str]], source: str) -> None:
    """Refuse a $ref that leads back to itself through the same value (no property or item in between): such a
    schema describes nothing a reply could ever finish ({"$ref": "#"} is the shortest)."""
    paths = {id(node): path for node, path in nodes}

    def same_value(node: dict[str, Any]) -> list[Any]:
        targets: list[Any] = []
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            targets.append(_resolve(root, node["$ref"]))
        for key in SAME_VALUE:
            if isinstance(node.get(key), list):
                targets.extend(node[key])
        return [target for target in targets if isinstance(target, dict)]

    done: set[int] = set()
    for start, _ in nodes:
        if id(start) in done:
            continue
        trail: list[int] = []
        stack: list[tuple[dict[str, Any], Iterator[Any]]] = [(start, iter(same_value(start)))]
        trail.append(id(start))
        while stack:
            node, targets = stack[-1]
            target = next(targets, None)
            if target is None:
                stack.pop()
                done.add(trail.pop())
                continue
            if id(target) in trail:
                where = paths.get(id(node), "?") or "/"
                raise SchemaError(
                    f"{source} has a $ref at {where} that leads back to {paths.get(id(target), '?') or '/'} without "
                    "any property or item in between: a definition in terms of itself, which no reply can finish."
                )
            if id(target) not in done:
                trail.append(id(target))
                stack.append((target, iter(same_value(target))))


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return {kind} if isinstance(kind, str) else set()


def _bound_numbers(node: dict[str, Any]) -> None:
    """At most NUMBER_DIGITS digits (more where the schema's own bounds need them), as minimum/maximum the schema
    lacks; numbers at most FRACTION_DIGITS after the point, as a multipleOf, unless the schema's bounds are finer."""
    kinds = _types(node)
    if not kinds & {"integer", "number"}:
        return
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    for key in keys:  # llguidance reads numbers as 64-bit: a larger integer bound becomes a float
        if isinstance(node.get(key), int) and not isinstance(node[key], bool) and abs(node[key]) >= 2**53:
            node[key] = float(node[key])
    bounds = [node[k] for k in keys if _is_number(node.get(k))]
    digits = max([NUMBER_DIGITS, *(len(str(int(abs(b)))) for b in bounds if math.isfinite(b))])
    limit: int | float = 10**digits - 1 if digits <= NUMBER_DIGITS else float(10**digits - 1)
    if not _is_number(node.get("minimum")) and not _is_number(node.get("exclusiveMinimum")):
        node["minimum"] = -limit
    if not _is_number(node.get("maximum")) and not _is_number(node.get("exclusiveMaximum")):
        node["maximum"] = limit
    fine = any(0 < abs(b) < 10.0**-FRACTION_DIGITS * 1000 for b in bounds)
    if "number" in kinds and "multipleOf" not in node and not fine:
        node["multipleOf"] = float(f"1e-{FRACTION_DIGITS}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_open(schema: Any) -> bool:
    """True or a schema of annotations only: any JSON value."""
    return schema is True or (isinstance(schema, dict) and set(schema) <= ANNOTATIONS)


def _close_open_values(node: dict[str, Any]) -> bool:
    """Replace value schemas that allow any JSON with the bounded any-value; whether any was replaced."""
    replaced = False
    reference = {"$ref": f"#/$defs/{ANY_VALUE}"}
    for key in VALUE_MAPS:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                if _is_open(sub):
                    node[key][name] = dict(reference)
                    replaced = True
    for key in ("additionalProperties", "items"):
        if key in node and _is_open(node[key]):
            node[key] = dict(reference)
            replaced = True
    if isinstance(node.get("prefixItems"), list):
        for i, sub in enumerate(node["prefixItems"]):
            if _is_open(sub):
                node["prefixItems"][i] = dict(reference)
                replaced = True
    if node.get("type") == "array" and "items" not in node and "prefixItems" not in node:
        node["items"] = dict(reference)
        replaced = True
    return replaced


def _any_value() -> dict[str, Any]:
    reference = {"$ref": f"#/$defs/{ANY_VALUE}"}
    limit = 10**NUMBER_DIGITS - 1
    return {"anyOf": [
        {"type": "object", "additionalProperties": reference},
        {"type": "array", "items": reference},
        {"type": "string"},
        {"type": "number", "minimum": -limit, "maximum": limit, "multipleOf": float(f"1e-{FRACTION_DIGITS}")},
        {"type": "boolean"},
        {"type": "null"},
    ]}  # fmt: skip


# -- compiling, per engine ---------------------------------------------------------------------------------------
class GrammarCompiler:
    """One engine's compiled grammars: llguidance's view of the tokenizer (built on first use, ~1 s), and the
    last COMPILED_KEPT grammars as matchers in their start state (each reply takes a copy), refusals included."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self._llg_tokenizer: Any = None
        self._compiled: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> Any:
        """The grammar's matcher in its start state (cached); SchemaError when it can't be enforced or takes
        longer than COMPILE_SECONDS (the build then finishes in the background, bounded by llguidance's fuel)."""
        with self._lock:
            found = self._compiled.get(spec.grammar)
            if found is not None:
                self._compiled.move_to_end(spec.grammar)
        if found is None:
            self.llg_tokenizer()  # once per engine (~1 s), not counted against the compile's time
            found = self._compile_in_time(spec)
            with self._lock:
                self._compiled[spec.grammar] = found
                while len(self._compiled) > COMPILED_KEPT:
                    self._compiled.popitem(last=False)
        if isinstance(found, SchemaError):
            raise SchemaError(str(found))
        return found

    def mask(self, spec: GrammarSpec) -> LogitsMask:
        """A fresh grammar state for one reply."""
        return LogitsMask(self.compile(spec).deep_copy(), self.vocab_size)

    def _compile_in_time(self, spec: GrammarSpec) -> Any:
        result: list[Any] = []
        worker = threading.Thread(target=lambda: result.append(self._build(spec)), name="grammar-compile", daemon=True)
        worker.start()
        worker.join(COMPILE_SECONDS)
        if not result:
            return SchemaError(
                f"{spec.source} took longer than {COMPILE_SECONDS:g} s to compile into a grammar (Hearth's limit on "
                "compile time): simplify it (fewer properties, shorter patterns and repeats)."
            )
        return result[0]

    def _build(self, spec: GrammarSpec) -> Any:
        import llguidance

        try:
            matcher = llguidance.LLMatcher(
                self.llg_tokenizer(), spec.grammar, log_level=0, limits=llguidance.LLParserLimits(verbose_errors=False)
            )
            if not matcher.is_error():  # the first mask: parser limits a schema reaches at once show up here
                bitmask = np.full((self.vocab_size + 31) // 32, -1, dtype=np.int32)
                matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
        except SchemaError as exc:
            return exc
        except Exception as exc:  # llguidance raises on misuse only; keep the worker's thread alive regardless
            return SchemaError(f"{spec.source} cannot be enforced: {_short(str(exc))}")
        if matcher.is_error():
            return SchemaError(f"{spec.source} cannot be enforced: {_short(matcher.get_error())}")
        return matcher

    def llg_tokenizer(self) -> Any:
        with self._lock:
            if self._llg_tokenizer is None:
                import llguidance

                eos = sorted(self.eos_ids) or None
                slices = llguidance.LLTokenizer.json_slices()
                if isinstance(self.tokenizer, StandaloneTokenizer):  # what llguidance.hf does, without transformers
                    backend_json = self.tokenizer.backend_tokenizer.to_str()
                    self._llg_tokenizer = llguidance.LLTokenizer(
                        backend_json, n_vocab=self.vocab_size, eos_token=eos, slices=slices
                    )
                    return self._llg_tokenizer
                import llguidance.hf

                try:
                    self._llg_tokenizer = llguidance.hf.from_tokenizer(
                        self.tokenizer, n_vocab=self.vocab_size, eos_token=eos, slices=slices
                    )
                except ValueError as exc:  # "Only fast tokenizers are supported"
                    raise SchemaError(f"This model's tokenizer cannot drive a grammar: {exc}") from None
            return self._llg_tokenizer


def _short(message: str) -> str:
    """llguidance's error without its parser-state dump, on one line."""
    return " ".join(message.split("<state>")[0].split())[:300]


# -- one reply's state -----------------------------------------------------------------------------------------
class LogitsMask:
    """One reply's grammar state: the allowed tokens each step, then the picked one."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.bitmask = np.full((vocab_size + 31) // 32, -1, dtype=np.int32)

    def allowed(self) -> Bools:
        """Which of the vocabulary's tokens keep the reply valid now."""
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar stopped: {_short(self.matcher.get_error())}")
        bits = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")[: self.vocab_size]
        return bits.view(np.bool_)

    def apply(self, logits: Floats) -> Floats:
        """The logits with every token the grammar forbids at -inf (a new array; logits past the vocabulary too)."""
        allowed = self.allowed()
        if logits.shape[-1] != allowed.shape[0]:
            allowed = np.pad(allowed, (0, max(logits.shape[-1] - allowed.shape[0], 0)))[: logits.shape[-1]]
        return np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32, copy=False)

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):  # a masked token cannot be picked
            raise GrammarError(f"the grammar rejected token {token}: {_short(self.matcher.get_error())}")

    @property
    def finished(self) -> bool:
        """Nothing but the end of the reply can follow."""
        return bool(self.matcher.is_stopped())
