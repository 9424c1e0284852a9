"""Random peft LoRA adapters over the tiny test checkpoints, and peft's greedy tokens for them."""

from __future__ import annotations

import torch

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(base: str, out: str, seed: int, r: int = 4, modules=ALL_MODULES, **config) -> str:
    """Save a peft adapter over ``base`` with random A and B (non-zero B: it changes outputs)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config.setdefault("lora_alpha", 2 * r)
    lora = LoraConfig(r=r, target_modules=list(modules), init_lora_weights=False, **config)
    peft_model = get_peft_model(model, lora)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.4)
    peft_model.save_pretrained(out)
    return out


def peft_greedy(
    base: str, adapter: str | None, prompts: list[list[int]], new: int
) -> list[list[int]]:
    """Greedy continuations by transformers (with peft's ``PeftModel`` over it when
    ``adapter``), float32, one prompt at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            for _ in range(new):
                nxt = model(input_ids=x).logits[0, -1].argmax()
                x = torch.cat([x, nxt.view(1, 1)], dim=1)
            outs.append(x[0, len(ids) :].tolist())
    return outs
