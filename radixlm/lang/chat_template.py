"""Chat templates for roles: a text prefix and suffix per role.

A template is either taken from a small registry by name, or derived from a model's own Jinja
chat template by rendering probe conversations and cutting them around sentinel contents.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

Messages = list[dict[str, str]]
Renderer = Callable[[Messages, bool], str]

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    """How each role is wrapped. ``llama2_style`` puts the system block inside the first
    ``[INST]`` as Llama-2-chat does."""

    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    default_system_prompt: str | None = None
    stop_str: tuple[str, ...] = ()
    llama2_style: bool = False
    image_token: str = "<image>"

    def get_prefix_and_suffix(self, role: str, hist_messages: Messages) -> tuple[str, str]:
        """The prefix and suffix of a ``role`` message that follows ``hist_messages``."""
        prefix, suffix = self.role_prefix_and_suffix.get(role, ("", ""))
        if self.llama2_style:
            if role == "system" and not hist_messages:
                user_prefix = self.role_prefix_and_suffix["user"][0]
                return user_prefix + prefix, suffix
            if role == "user" and [m["role"] for m in hist_messages] == ["system"]:
                return "", suffix
        return prefix, suffix

    def get_prompt(self, messages: Messages) -> str:
        """Render a whole conversation."""
        out = []
        for i, message in enumerate(messages):
            prefix, suffix = self.get_prefix_and_suffix(message["role"], messages[:i])
            out.append(f"{prefix}{message['content']}{suffix}")
        return "".join(out)


_CHATML = {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ROLES}
_LLAMA3 = {r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>") for r in ROLES}

_REGISTRY: dict[str, ChatTemplate] = {}


def register_chat_template(template: ChatTemplate) -> None:
    """Make ``template`` available to ``get_chat_template(template.name)``."""
    _REGISTRY[template.name] = template


def get_chat_template(name: str) -> ChatTemplate:
    """A registered template by name (``chatml``, ``llama-3-instruct``, ``llama-2-chat``,
    ``qwen``, ``default``)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


for _template in (
    ChatTemplate("default", {r: (f"{r.upper()}:", "\n") for r in ROLES}),
    ChatTemplate("chatml", _CHATML, stop_str=("<|im_end|>",)),
    ChatTemplate("qwen", _CHATML, "You are a helpful assistant.", ("<|im_end|>",)),
    ChatTemplate("llama-3-instruct", _LLAMA3, stop_str=("<|eot_id|>",)),
    ChatTemplate(
        "llama-2-chat",
        {"system": ("<<SYS>>\n", "\n<</SYS>>\n\n"), "user": ("[INST] ", " [/INST]"),
         "assistant": ("", " </s><s>")},
        llama2_style=True,
    ),
):
    register_chat_template(_template)

_PATH_RULES = (
    (r"llama-?3.*instruct|llama-?3.*chat", "llama-3-instruct"),
    (r"llama-?2.*chat|mistral.*instruct|mixtral.*instruct", "llama-2-chat"),
    (r"qwen", "qwen"),
    (r"smollm|chatml|hermes|yi-", "chatml"),
)


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    """A registered template guessed from a model name or path; ``default`` when nothing fits."""
    lowered = model_path.lower()
    for pattern, name in _PATH_RULES:
        if re.search(pattern, lowered):
            return get_chat_template(name)
    return get_chat_template("default")


# -- deriving a template from a model's own Jinja template ------------------------------------

_SENTINEL = {r: f"\x1eRADIXLM-{r.upper()}-PROBE\x1e" for r in ROLES}


@dataclass
class _Probe:
    render: Renderer
    parts: dict[str, tuple[str, str]] = field(default_factory=dict)

    def cut(self, history: Messages, role: str) -> str:
        """Render ``history`` + a ``role`` message and return the new text after ``history``."""
        before = self.render(history, False) if history else ""
        after = self.render(history + [{"role": role, "content": _SENTINEL[role]}], False)
        if not after.startswith(before):
            raise ValueError("the template re-renders earlier messages")
        new = after[len(before):]
        if new.count(_SENTINEL[role]) != 1:
            raise ValueError("the template does not echo message contents once")
        prefix, suffix = new.split(_SENTINEL[role])
        self.parts[role] = (prefix, suffix)
        return new


def derive_chat_template(render: Renderer, name: str = "model") -> ChatTemplate | None:
    """A ChatTemplate equivalent to ``render`` (``render(messages, add_generation_prompt)``),
    or ``None`` when the template cannot be cut into a prefix and suffix per role."""
    probe = _Probe(render)
    history: Messages = []
    try:
        for role in ROLES:
            probe.cut(history, role)
            history.append({"role": role, "content": _SENTINEL[role]})
        default_system = _default_system(render, probe.parts)
    except Exception:  # noqa: BLE001  (a template that raises on a probe cannot be derived)
        return None
    stop = probe.parts["assistant"][1].strip()
    return ChatTemplate(name, dict(probe.parts), default_system, (stop,) if stop else ())


def _default_system(render: Renderer, parts: dict[str, tuple[str, str]]) -> str | None:
    """The system prompt the template inserts when a conversation starts without one."""
    text = render([{"role": "user", "content": _SENTINEL["user"]}], False)
    head = text[: text.find(parts["user"][0] + _SENTINEL["user"])]
    prefix, suffix = parts["system"]
    if len(head) > len(prefix) + len(suffix) and head.startswith(prefix) and head.endswith(suffix):
        return head[len(prefix): len(head) - len(suffix)]
    return None


def tokenizer_renderer(tokenizer) -> Renderer | None:
    """A renderer from a Hugging Face tokenizer with a chat template, else ``None``."""
    if not getattr(tokenizer, "chat_template", None):
        return None

    def render(messages: Messages, add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    return render


def jinja_renderer(source: str, bos_token: str = "", eos_token: str = "") -> Renderer:
    """A renderer for a Jinja chat template string (as in ``tokenizer_config.json``)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(source)

    def render(messages: Messages, add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token)

    return render
