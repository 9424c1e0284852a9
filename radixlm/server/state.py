"""What the server knows once its runtime has started (kept on ``app.state``, nothing global)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from starlette.requests import Request

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.runtime import Runtime
from radixlm.server.errors import APIError
from radixlm.server.metrics import ServerMetrics


@dataclass
class ServerState:
    args: ServerArgs
    runtime: Runtime
    metrics: ServerMetrics
    served_model_name: str
    chat_template: str | None
    started: int = field(default_factory=lambda: int(time.time()))

    @property
    def tokenizer(self):
        return self.runtime.tokenizer

    @property
    def model_path(self) -> str:
        return self.runtime.backend.info["model_path"]

    @property
    def context_len(self) -> int:
        return self.runtime.backend.info["context_len"]

    @property
    def loras(self) -> dict[str, str]:
        """The LoRA adapters served, name -> directory (none with LoRA off; the data-parallel
        and Ray managers serve none)."""
        return getattr(self.runtime.manager, "loras", None) or {}

    def check_model(self, name: str | None, lookup: bool = False) -> str | None:
        """The LoRA adapter ``name`` names, else None: 404 unless it (when given) names the
        served model or one of its adapters, or ``ignore_model_name`` is set and this is not a
        ``lookup`` of the name itself (``GET /v1/models/{name}``, a 404 as SGLang's)."""
        loras = self.loras
        if name in loras:
            return name
        known = {self.served_model_name, self.model_path, self.args.model_path}
        lenient = self.args.ignore_model_name and not lookup
        if name is not None and name not in known and not lenient:
            raise APIError(
                404, f"the model {name!r} does not exist; this server serves "
                f"{self.served_model_name!r}" + (f" and LoRA adapters {sorted(loras)}" if loras
                                                   else ""),
                param="model", code="model_not_found",
            )  # fmt: skip
        return None


def served_name(args: ServerArgs, model_path: str) -> str:
    """``--served-model-name``, else the model path as given, else the default file's stem."""
    if args.served_model_name:
        return args.served_model_name
    if args.model_path:
        return args.model_path
    return os.path.basename(model_path).removesuffix(".gguf")


def tenant_salt(request: Request, salt: str | None) -> str | None:
    """The ``cache_salt`` a request runs with: its own, inside its API key's tenant (so one
    tenant cannot name another's salt)."""
    tenant = getattr(request.state, "tenant", None)
    if tenant is None:
        return salt
    return f"{tenant}\x1f{salt}" if salt is not None else tenant


def server_state(request: Request) -> ServerState:
    """The started server's state, or 503 while it is still starting."""
    state = getattr(request.app.state, "server", None)
    if state is None:
        raise APIError(503, "the server is starting", code="not_ready")
    return state
