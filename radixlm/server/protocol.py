"""Request bodies of the native and OpenAI-compatible routes (pydantic). Unknown fields are
refused, except at the top level of OpenAI bodies (``lenient.py``: accepted and named)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# NOTE: strict types too: a string is not a bool and false is not a token id
Strict = ConfigDict(extra="forbid", strict=True)

# -- native -------------------------------------------------------------------------------------


class GenerateRequest(BaseModel):
    """``POST /generate``: one prompt or a batch, as text or token ids."""

    model_config = Strict
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    # with --schedule-policy priority: lower values are scheduled first
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    # SGLang's: the LoRA adapter (by name) of the prompt, or one per prompt
    lora_path: str | list[str | None] | None = None
    # SGLang's: the logprobs of these token ids at every output position (a list per prompt
    # of a batch, or one list for all); checked in GenerateInput.split
    token_ids_logprob: list[Any] | None = None
    # SGLang's (with --enable-custom-logit-processor): CustomLogitProcessor.to_str(), or one
    # per prompt
    custom_logit_processor: str | list[str | None] | None = None


class EncodeRequest(BaseModel):
    """``POST /encode`` (SGLang's): embed one input or a batch, as text or token ids."""

    model_config = Strict
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    rid: str | list[str] | None = None
    pooling: Literal["last", "mean"] = "last"
    normalize: bool = True
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    lora_path: str | list[str | None] | None = None


class LoadLoraRequest(BaseModel):
    """``POST /load_lora_adapter`` (vLLM's and SGLang's route): a peft adapter directory."""

    model_config = ConfigDict(extra="ignore", strict=True)  # NOTE: vLLM's load_inplace, ...
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1)


class UnloadLoraRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    lora_name: str = Field(min_length=1, max_length=256)


class FlushCacheRequest(BaseModel):
    """Which cache tiers ``POST /flush_cache`` empties (default: the in-memory radix tree)."""

    model_config = Strict
    tiers: list[Literal["memory", "disk"]] = Field(default=["memory"], min_length=1)


class CacheSaveRequest(BaseModel):
    """``POST /cache/save``: compute a prefix (text or ids) and pin it in the disk tier."""

    model_config = Strict
    text: str | None = None
    input_ids: list[int] | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)


class AbortRequest(BaseModel):
    """Abort one request by ``rid`` (its samples too), or every request in flight."""

    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"anyOf": [
            {"required": ["rid"]},
            {"required": ["abort_all"], "properties": {"abort_all": {"const": True}}},
        ]},
    )
    rid: str | None = None
    abort_all: bool = False


# -- OpenAI ---------------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = Strict
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far in every chunk


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs``: one constraint on the output."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # NOTE: vLLM's decoding-backend knobs; this server's backend is chosen at start
    disable_fallback: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions, including radixlm's, vLLM's and
    SGLang's extras. Unknown top-level fields are kept in ``model_extra`` (``lenient.py``)."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    user: str | None = None
    rid: str | list[str] | None = None  # SGLang's: request ids (one per prompt), for aborts
    # vLLM's: requests share cached prefixes only with requests of the same salt
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    # vLLM's, with --schedule-policy priority: lower values are scheduled first
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None  # SGLang's
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    regex: str | None = None
    json_schema: dict[str, Any] | str | None = None
    ebnf: str | None = None  # SGLang's: a GBNF/EBNF grammar (or Lark)
    # vLLM's structured-output fields (the older guided_* and the newer structured_outputs)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    # OpenAI's: token id (as a string) -> bias in [-100, 100] added to its logit
    logit_bias: dict[str, float] | None = None
    # SGLang's (with --enable-custom-logit-processor): a client's processor and its arguments
    custom_logit_processor: str | None = None
    custom_params: dict[str, Any] | None = None
    include_stop_str_in_output: bool | None = None  # vLLM's name for no_stop_trim
    speculative: bool | None = None  # False: no speculative drafts for this request

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = Strict
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    response_format: ResponseFormat | None = None  # vLLM's: as on chat


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``. Unknown top-level fields are kept in ``model_extra``."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    # radixlm's (as /encode's) and vLLM's
    pooling: Literal["last", "mean"] = "last"
    normalize: bool = True
    cache_salt: str | None = Field(None, min_length=1, max_length=256)


class ScoreRequest(BaseModel):
    """``POST /v1/score`` (SGLang's): label-token probabilities after ``query + item``."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    query: str | list[int]
    items: str | list[str] | list[list[int]]
    label_token_ids: list[int]
    apply_softmax: bool = False
    item_first: bool = False
    cache_salt: str | None = Field(None, min_length=1, max_length=256)


class TextPart(BaseModel):
    model_config = Strict
    type: Literal["text"]
    text: str


class MediaPart(BaseModel):
    """An image, audio, video or file part: parsed so the refusal can name it."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image_url", "input_image", "image", "input_audio", "audio_url", "video_url",
                  "file", "input_file"]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallItem(BaseModel):
    """A call the assistant made earlier in the conversation."""

    model_config = ConfigDict(extra="ignore", strict=True)
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | MediaPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            for j, part in enumerate(self.content):
                if isinstance(part, MediaPart):
                    raise ValueError(
                        f"content[{j}] ({part.type}) is not supported by this text-only model"
                    )
            return "".join(part.text for part in self.content)
        return self.content or ""


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(BaseModel):
    model_config = Strict
    type: str = "function"
    function: FunctionDefinition


class ToolChoiceFunction(BaseModel):
    model_config = Strict
    name: str


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": ...}}``: call this tool."""

    model_config = Strict
    type: Literal["function"]
    function: ToolChoiceFunction


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's chat prefill: continue the last (assistant) message instead of opening a new turn
    continue_final_message: bool = False
    add_generation_prompt: bool | None = None  # None: not when continuing, else yes
    separate_reasoning: bool = True


# -- tokenizer routes (SGLang's and vLLM's shapes) ---------------------------------------------


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: ``text`` (SGLang's name), ``prompt`` (vLLM's) or chat ``messages``
    (rendered through the chat template first, as vLLM does)."""

    model_config = Strict
    model: str | None = None
    text: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # None: yes for text, no for messages (vLLM's)
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = Strict
    model: str | None = None
    tokens: list[int]
    skip_special_tokens: bool = False


# -- OpenAI Responses -----------------------------------------------------------------------------


class ResponseTextFormat(BaseModel):
    """``text.format``: plain text, any JSON object, or JSON matching ``schema``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseTextConfig(BaseModel):
    model_config = Strict
    format: ResponseTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # NOTE: a hint; not enforced


class ResponsesRequest(SamplingFields):
    """``POST /v1/responses``, stateless: the whole conversation comes in ``input``. Items are
    checked field by field when they are translated (``responses_format.chat_request``)."""

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: ResponseTextConfig | None = None
    include: list[Literal["message.output_text.logprobs", "reasoning.encrypted_content"]] | None = (
        None
    )
    top_logprobs: int | None = Field(None, ge=0, le=20)
    truncation: Literal["disabled", "auto"] | None = None
    reasoning: dict[str, Any] | None = None  # NOTE: effort/summary are hints; not enforced
    metadata: dict[str, str] | None = None
    store: bool | None = None  # NOTE: nothing is stored; the response says store: false
    # Need a response store, which this server does not keep: a clear 400 when set
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None
    # Accepted and not used (they steer OpenAI's own infrastructure)
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    separate_reasoning: bool = True
