"""Loading and unloading LoRA adapters at run time, at vLLM's routes (``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter``) and SGLang's (the same without ``/v1``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from radixlm.server.errors import ERROR_RESPONSES, APIError
from radixlm.server.protocol import LoadLoraRequest, UnloadLoraRequest
from radixlm.server.state import server_state

router = APIRouter(tags=["lora"], responses=ERROR_RESPONSES)


@router.post("/load_lora_adapter")
@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraRequest, request: Request) -> dict[str, Any]:
    """Serve the peft adapter directory ``lora_path`` as model ``lora_name`` (400 naming what
    is wrong with it)."""
    manager = server_state(request).runtime.manager
    if getattr(manager, "loras", None) is None:
        raise APIError(400, "LoRA is off: start the server with --enable-lora or --lora-paths",
                       param="lora_name")  # fmt: skip
    try:
        await manager.load_lora(body.lora_name, body.lora_path)
    except ValueError as e:
        raise APIError(400, str(e), param="lora_path") from None
    return {"success": True, "message": f"LoRA adapter {body.lora_name!r} added",
            "loaded_adapters": manager.loras}  # fmt: skip


@router.post("/unload_lora_adapter")
@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraRequest, request: Request) -> dict[str, Any]:
    """Stop serving ``lora_name`` (404 when it is not loaded); its running requests finish."""
    manager = server_state(request).runtime.manager
    if body.lora_name not in (getattr(manager, "loras", None) or {}):
        raise APIError(404, f"LoRA adapter {body.lora_name!r} is not loaded", param="lora_name",
                       code="model_not_found")  # fmt: skip
    try:
        await manager.unload_lora(body.lora_name)
    except ValueError as e:
        raise APIError(400, str(e), param="lora_name") from None
    return {
        "success": True,
        "message": f"LoRA adapter {body.lora_name!r} removed",
        "loaded_adapters": manager.loras,
    }
