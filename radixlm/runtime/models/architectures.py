"""The architectures radixlm runs (config.json ``architectures`` names), without torch: the
launcher refuses any other before a process starts, and ``serve --help`` lists them. Each
family's file registers its classes under these names (``registry``); a test keeps the two
lists equal."""

from __future__ import annotations

FAMILIES = {
    "llama.py": ("LlamaForCausalLM", "MistralForCausalLM"),
    "qwen2.py": ("Qwen2ForCausalLM", "Qwen3ForCausalLM"),
    "gemma.py": ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"),
    "phi3.py": ("Phi3ForCausalLM",),
    "granite.py": ("GraniteForCausalLM",),
    "olmo.py": ("Olmo2ForCausalLM", "OlmoeForCausalLM"),
    "smollm3.py": ("SmolLM3ForCausalLM",),
    "mixtral.py": ("MixtralForCausalLM",),
    "qwen_moe.py": ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"),
}
ARCHITECTURES = tuple(sorted(name for names in FAMILIES.values() for name in names))


def check_architecture(name: str) -> None:
    if name not in ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {name!r}; radixlm runs: {', '.join(ARCHITECTURES)}"
        )
