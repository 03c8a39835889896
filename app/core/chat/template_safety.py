"""Refuse a chat template that tries to reach outside Jinja's sandbox, when the model loads rather than at every reply.

A model's chat template is code from whoever made the file (tokenizer_config.json, chat_template.jinja, a GGUF's
`tokenizer.chat_template`). transformers renders it in Jinja's sandbox, which holds: `''.__class__.__mro__` raises
SecurityError. But a template that does so fails every reply with that error (a traceback in `hearth chat`, a 500 for
every request to `hearth serve`). Such a template is not a model's honest layout, so it is refused once, by name:
statically where its source reaches for an underscore attribute (what every known escape needs), and by one trial
rendering in the sandbox (transformers', app.core.chat.chat_template) for what only shows when it runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.core.errors import HearthError

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
_TRIAL_MESSAGES = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Thanks"},
]


class UnsafeTemplateError(HearthError):
    """The chat template tries to leave the sandbox; the model is not used with it."""


def template_problem(template: str) -> str:
    """Why a template's source is unsafe ("it reads the attribute '__class__'"), or "" when nothing is seen."""
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        tokens = [(token.type, token.value) for token in ImmutableSandboxedEnvironment().lexer.tokenize(template)]
    except TemplateSyntaxError:
        return ""  # not a template Jinja can read: rendering it fails with its own error
    for index, (kind, value) in enumerate(tokens):
        after = tokens[index + 1 : index + 3]
        # x._y (the sandbox refuses every attribute that starts with "_"), x['__y__'], x|attr('_y')
        if kind == "dot" and after and after[0][0] == "name" and str(after[0][1]).startswith("_"):
            return f"it reads the attribute {after[0][1]!r}"
        if kind == "lbracket" and after and after[0][0] == "string" and str(after[0][1]).startswith("__"):
            return f"it reads the attribute {after[0][1]!r}"
        is_attr_call = kind == "name" and value == "attr" and [k for k, _ in after] == ["lparen", "string"]
        if is_attr_call and str(after[1][1]).startswith("_"):
            return f"it reads the attribute {after[1][1]!r}"
    return ""


def trial_problem(template: str) -> str:
    """Why rendering the template once, in the sandbox replies render it in, is refused by the sandbox; "" otherwise."""
    from jinja2.exceptions import SecurityError

    from app.core.chat.chat_template import compile_template

    try:
        compile_template(template).render(
            messages=_TRIAL_MESSAGES, add_generation_prompt=True, bos_token="<s>", eos_token="</s>", tools=None
        )
    except SecurityError as exc:
        return f"the sandbox stopped it ({exc})"
    except Exception:  # any other failure is the template's own (a role it refuses): rendering will say so
        return ""
    return ""


def check_template(template: str, where: str, name: str = "default") -> None:
    """Raise UnsafeTemplateError naming the file (`where`) and the template (`name`) when it reaches outside."""
    problem = template_problem(template) or trial_problem(template)
    if problem:
        raise refusal(where, name, problem)


def refusal(where: str, name: str, problem: str) -> UnsafeTemplateError:
    label = "chat template" if name == "default" else f"chat template {name!r}"
    return UnsafeTemplateError(
        f"The {label} in {where} tries to reach outside the template sandbox ({problem}); Hearth will not use this "
        "model with it. Replace the template with the model maker's original, or use another copy of the model."
    )


def check_tokenizer(tokenizer: Any, where: str) -> None:
    """check_template for every template a loaded tokenizer carries (one string, or several by name)."""
    for name, template in _named(getattr(tokenizer, "chat_template", None)):
        check_template(template, where, name)


def check_model(weights: Path, tokenizer: Any) -> None:
    """Refuse at load, naming the file, a model whose chat template reaches outside the sandbox: a GGUF's (the
    template its header carries, as `tokenizer` holds it) or a model folder's template files."""
    if weights.is_file():
        check_tokenizer(tokenizer, str(weights))
    else:
        check_model_folder(weights)


def check_model_folder(folder: Path) -> None:
    """check_template for every template stored in a model folder's files (see TEMPLATE_FILES)."""
    for file_name in TEMPLATE_FILES:
        path = folder / file_name
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if file_name.endswith(".jinja"):
            check_template(raw, str(path))
            continue
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            continue  # a damaged file is the loader's to report
        value = data.get("chat_template") if isinstance(data, dict) else None
        for name, template in _named(value):
            check_template(template, str(path), name)


def _named(value: Any) -> Iterator[tuple[str, str]]:
    """(name, template) pairs from a chat_template value: a string, a {name: template} dict or a list of
    {"name", "template"} objects (as tokenizer_config.json stores several)."""
    if isinstance(value, str):
        yield "default", value
    elif isinstance(value, dict):
        yield from ((str(k), v) for k, v in value.items() if isinstance(v, str))
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and isinstance(item.get("template"), str):
                yield str(item.get("name") or "default"), item["template"]
