"""Hearth's chat template rendering gives transformers' text for the same template and conversation."""

from __future__ import annotations

import jinja2
import numpy as np
import pytest

from app.core.chat.chat_template import compile_template, plain_data, render_chat
from tests.helpers.fresh_process import run_fresh

# Templates in the shapes the Hub's models use: ChatML with a default system prompt, tools written with tojson,
# Llama 3's header tokens with a namespace and loop controls, a `{% generation %}` block, a reasoning field, dates.
TEMPLATES = {
    "chatml": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are helpful<|im_end|>\\n' }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
    "tools": (
        "{%- if tools %}{{ '<tools>' }}{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
        "{{ '\\n' }}{{ tools[0] | tojson(indent=2, sort_keys=true) }}{{ '</tools>\\n' }}{% endif %}"
        "{%- for message in messages %}{{ message.role }}: {{ message.content }}\n{% endfor %}"
        "{%- if add_generation_prompt %}assistant:{% endif %}"
    ),
    "llama3": (
        "{{- bos_token }}{%- set ns = namespace(found=false) %}{%- for message in messages %}"
        "{%- if message['role'] == 'system' %}{%- set ns.found = true %}{%- endif %}{%- endfor %}"
        "{%- for message in messages %}{%- if loop.index > 8 %}{% break %}{% endif %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
        " + '<|eot_id|>' }}{%- endfor %}{%- if not ns.found %}(no system){% endif %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    ),
    "generation": (
        "{% for message in messages %}{% if message.role == 'assistant' %}{% generation %}"
        "{{ message.content }}{{ eos_token }}{% endgeneration %}{% else %}{{ message.content }}{% endif %}"
        "{% endfor %}"
    ),
    "reasoning": (
        "{% for message in messages %}{% if message.reasoning_content %}<think>{{ message.reasoning_content }}"
        "</think>{% endif %}{% if message.thinking %}[{{ message.thinking }}]{% endif %}{{ message.content }}"
        "{% endfor %}"
    ),
    "dict": "{% set d = dict(a=1) %}{{ d | tojson }}{{ messages | length }}{{ messages[0].content | tojson }}",
}
MESSAGES = [
    {"role": "user", "content": 'Hi 🤗 <b>bold</b> & "quotes"', "name": None},
    {"role": "assistant", "content": "Hello!", "reasoning": "greet back"},
    {"role": "user", "content": "Weather in Paris?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather — «today»",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_it_renders_what_transformers_renders(name: str, generation_prompt: bool) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    template = TEMPLATES[name]
    variables = {"bos_token": "<s>", "eos_token": "</s>"}
    for tools in (None, TOOLS):
        ours = render_chat(template, MESSAGES, tools=tools, add_generation_prompt=generation_prompt, **variables)
        [theirs], _ = render_jinja_template(
            conversations=[[{k: v for k, v in m.items() if v is not None} for m in MESSAGES]],
            tools=tools,
            chat_template=template,
            add_generation_prompt=generation_prompt,
            **variables,
        )
        assert ours == theirs, (name, tools is not None)
    assert "None" not in render_chat("{{ messages[0] }}", MESSAGES)  # a None value is dropped, not written


def test_the_sandbox_and_its_helpers_hold() -> None:
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat("{{ ''.__class__.__mro__ }}", MESSAGES)
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore-prefixed"):
        render_chat("{% set ns = namespace(_x=1) %}", MESSAGES)
    with pytest.raises(jinja2.exceptions.TemplateError, match="System role not supported"):
        render_chat("{{ raise_exception('System role not supported') }}", MESSAGES)
    assert render_chat("{{ strftime_now('%Y') }}", MESSAGES).isdigit()
    with pytest.raises(ValueError, match="empty conversation"):
        render_chat("{{ messages }}", [])
    assert compile_template("x{{ 1 }}") is compile_template("x{{ 1 }}")  # compiled once


def test_rich_values_reach_the_template_as_plain_data() -> None:
    class Rich:  # an object whose methods the sandbox knows nothing of
        pass

    assert plain_data({"a": np.bool_(False), "b": (np.float32(1.5), Rich())}) == {"a": False, "b": (1.5, "<Rich>")}


def test_rendering_never_imports_transformers() -> None:
    done = run_fresh(
        "from app.core.chat.chat_template import render_chat\n"
        "print(render_chat('{{ messages[0].content }}', [{'role': 'user', 'content': 'x'}]))\n"
    )
    assert done.out == "x" and done.imported == set()
