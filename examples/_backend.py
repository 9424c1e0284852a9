"""Pick the backend for an example: the embedded model in-process, or a server with --url."""

from __future__ import annotations

import argparse

import radixlm as sgl


def backend_from_args(description: str) -> tuple[argparse.Namespace, object]:
    """Parse ``--url`` (a running ``python -m radixlm.server``); without it start the embedded
    SmolLM2 in this process. The backend is also made the default."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="a radixlm server, e.g. http://127.0.0.1:30000")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime(dtype="float32")
    sgl.set_default_backend(backend)
    return args, backend
