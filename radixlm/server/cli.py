"""``radixlm serve`` / ``python -m radixlm.server``: run the HTTP server."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator

import uvicorn

from radixlm.runtime.config import (
    ATTENTION_ALIASES,
    ATTENTION_BACKENDS,
    DTYPES,
    GRAMMAR_BACKENDS,
    LOAD_FORMATS,
    QUANTIZATIONS,
    SCHEDULE_POLICIES,
    ServerArgs,
)
from radixlm.runtime.function_call import TOOL_PARSERS
from radixlm.runtime.launcher import launch
from radixlm.runtime.models.architectures import ARCHITECTURES
from radixlm.runtime.reasoning import REASONING_PARSERS
from radixlm.server.app import abort_in_flight, api_keys, create_app
from radixlm.server.openai_format import load_chat_template

logger = logging.getLogger(__name__)

HELP = {
    "model_path": "Hugging Face directory or GGUF file (default: the embedded SmolLM2)",
    "host": "address to listen on",
    "port": "port to listen on",
    "max_total_tokens": "KV cache size in tokens (default: from --mem-fraction-static)",
    "max_queued_requests": "requests allowed to wait beyond --max-running-requests (then 503)",
    "api_key": "require 'Authorization: Bearer KEY' on every route but /health*",
    "api_keys_file": "API keys, one per line: 'KEY [TENANT]'; each tenant's requests get their "
    "own cache_salt, so tenants never share cached KV",
    "served_model_name": "the model name clients use (default: the model path)",
    "ignore_model_name": "answer requests whatever model they name, as SGLang does (by default "
    "a name other than the served one is a 404, as vLLM does)",
    "strict_api": "refuse OpenAI requests with fields the server does not know (400); by "
    "default they are ignored, logged once and named in the x-radixlm-ignored-fields header",
    "chat_template": "Jinja chat template, or a file holding one (default: the model's)",
    "skip_tokenizer_init": "load no tokenizer: prompts must be token ids, outputs are token ids",
    "quantization": "int4: int4 weight copies for CPU decode steps of <= 8 tokens and an int8 "
    "LM head for steps of <= 8 logit rows; gguf: a GGUF's quantized weights kept in their blocks "
    "(CPU); auto: int4 for a Q4_0/Q4_1 GGUF in bf16 on CPU, gguf for other quantized GGUFs on CPU "
    "(and for Q4_0/Q4_1 ones in float32)",
    "tool_call_parser": "tool-call format of the model's output (default: from the chat template; "
    "hermes with the built-in tool prompt for templates without tool support)",
    "reasoning_parser": "split <think>...</think> into reasoning_content (qwen3, deepseek-r1)",
    "kv_events_endpoint": "publish KV-cache events (vLLM's format) on this ZMQ endpoint, e.g. "
    "tcp://127.0.0.1:5557 (see docs/architecture.md)",
    "kv_events_block_size": "tokens per block in KV-cache events",
    "low_memory": "CPU: hold each weight once, as int4 layers and an int8 head/embedding, for "
    "every step (prefill matmuls ~2.5x slower): a fraction of the memory",
    "disable_cpu_compile": "run CPU decode steps eagerly (default: compiled step graphs kept "
    "under $RADIXLM_CACHE/aot, built by a child process on first use while steps run eagerly; "
    "RADIXLM_DISABLE_CPU_COMPILE=1)",
    "wait_cpu_graphs": "report ready only once the compiled CPU step graphs are loaded (on a "
    "first start, built: minutes), so the first requests run at full speed",
    "kv_disk_cache": "directory of a disk tier under the radix cache: prefixes outlive eviction "
    "and restarts",
    "kv_disk_cache_size": "byte budget of --kv-disk-cache, e.g. 20GB (least recently used "
    "blocks go first)",
    "kv_disk_block_size": "tokens per block file of --kv-disk-cache",
    "cached_top_logprobs": "top alternatives kept with each prompt token's logprob beside its KV "
    "(echo requests reuse them with the prefix; asking for more computes it again)",
    "speculative_algorithm": "ngram: greedy requests draft tokens from the radix tree and their "
    "own n-grams, verified in the same forward pass (same output, fewer steps)",
    "speculative_num_draft_tokens": "most draft tokens per request and step",
    "lora_paths": "LoRA adapters (peft directories) to serve over the base model, as NAME=DIR "
    "(a request names one by model or lora_path)",
    "enable_lora": "serve LoRA adapters loaded at run time (POST /load_lora_adapter) even "
    "with no --lora-paths",
    "max_loras": "LoRA adapters held in memory at once (idle ones are evicted least recently "
    "used first and read again when next requested)",
    "max_lora_rank": "the largest LoRA rank an adapter may have",
    "spec_ngram_max": "longest suffix looked up for an n-gram draft",
    "spec_ngram_min": "shortest suffix looked up for an n-gram draft",
    "chunked_prefill_size": "longest prompt piece prefilled in one step (-1: no chunking)",
    "attention_backend": "default: triton on CUDA, torch otherwise (torch_native: SGLang's name "
    "for torch)",
    "json_model_override_args": "config.json fields to replace, as a JSON object, e.g. "
    "'{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}'",
    "is_embedding": "serve embeddings only (/v1/embeddings, /encode): generation requests are "
    "refused (embeddings are served either way)",
    "enable_custom_logit_processor": "run the CustomLogitProcessor a request sends (SGLang's "
    "custom_logit_processor: the client's own pickled Python code; trusted clients only)",
    "enable_metrics": "accepted for SGLang's command lines: /metrics is always served",
    "enable_cache_report": "accepted for SGLang's command lines: usage always reports "
    "prompt_tokens_details.cached_tokens",
    "incremental_streaming_output": "/generate stream frames carry only the new text and "
    "output_ids (default: everything so far, as SGLang)",
    "num_threads": "torch threads of the scheduler and of each tensor-parallel rank (default: "
    "$RADIXLM_NUM_THREADS, else $OMP_NUM_THREADS, else the physical cores but one, shared, at "
    "most 8)",
}
CHOICES = {"dtype": DTYPES, "load_format": LOAD_FORMATS, "schedule_policy": SCHEDULE_POLICIES,
           "quantization": QUANTIZATIONS, "grammar_backend": GRAMMAR_BACKENDS,
           "attention_backend": (*ATTENTION_BACKENDS, *ATTENTION_ALIASES),
           "tool_call_parser": sorted(TOOL_PARSERS),
           "reasoning_parser": sorted(REASONING_PARSERS),
           "speculative_algorithm": ["ngram"]}  # fmt: skip
ALIASES = {"max_request_bytes": ("--max-payload-size",)}  # NOTE: SGLang's names of our flags


def build_parser(prog: str = "radixlm serve") -> argparse.ArgumentParser:
    """One ``--flag`` per ``ServerArgs`` field, plus ``--api-key-file``."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Serve a model over HTTP.",
        epilog="architectures (config.json 'architectures', or a GGUF of them): "
        + ", ".join(ARCHITECTURES),
    )  # fmt: skip
    parser.add_argument("--api-key-file", help="a file whose first line is the API key")
    defaults = ServerArgs()
    for f in dataclasses.fields(ServerArgs):
        flags = ["--" + f.name.replace("_", "-"), *ALIASES.get(f.name, ())]
        kind = str(f.type)
        if kind == "bool":
            parser.add_argument(*flags, action="store_true", default=getattr(defaults, f.name),
                                help=HELP.get(f.name))  # fmt: skip
            continue
        if kind.startswith("tuple"):
            parser.add_argument(*flags, nargs="*", default=getattr(defaults, f.name),
                                help=HELP.get(f.name))  # fmt: skip
            continue
        parse = int if "int" in kind else float if "float" in kind else str
        parser.add_argument(
            *flags, type=parse, default=getattr(defaults, f.name), choices=CHOICES.get(f.name),
            help=HELP.get(f.name),
        )
    return parser


def parse_args(argv: list[str]) -> ServerArgs:
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    return server_args(vars(build_parser().parse_args(argv)))


def server_args(kwargs: dict, prog: str = "radixlm serve") -> ServerArgs:
    """``ServerArgs`` from parsed flags; a bad value ends the program with a one-line error."""
    try:
        kwargs["api_key"] = api_key(kwargs["api_key"], kwargs.pop("api_key_file"))
        return ServerArgs.from_kwargs(**kwargs)
    except ValueError as e:
        raise SystemExit(f"{prog}: error: {e}") from None


def api_key(flag: str | None, path: str | None) -> str | None:
    """``--api-key``, else the first line of ``--api-key-file``, else ``$RADIXLM_API_KEY``
    (the file and the variable keep the key out of ``ps``)."""
    if flag is not None and path is not None:
        raise ValueError("give --api-key or --api-key-file, not both")
    if path is not None:
        try:
            with open(path) as f:
                key = f.readline().strip()
        except OSError as e:
            raise ValueError(f"api_key_file {path!r} cannot be read: {e.strerror}") from None
        if not key:
            raise ValueError(f"api_key_file {path!r} is empty")
        return key
    return flag if flag is not None else os.environ.get("RADIXLM_API_KEY") or None


class _Server(uvicorn.Server):
    """Prints the URL once the model is loaded and the socket is listening."""

    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self.url = url
        self.fatal: str | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(f"radixlm is ready at {self.url} (web page: {self.url}/)", flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        abort_in_flight(self.config.app)
        await super().shutdown(sockets)

    def die(self, reason: str) -> None:
        self.fatal = reason
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # NOTE: SIGTERM / SIGINT ask for a graceful stop, and a graceful stop exits 0 (uvicorn
        # would re-raise the signal afterwards and die with -15)
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


def check_port_free(host: str, port: int) -> None:
    """ValueError when ``host:port`` cannot be bound (taken, or not an address of this host),
    so that the model is not loaded for nothing."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # NOTE: as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def serve(args: ServerArgs) -> int:
    """Run until SIGTERM/SIGINT (0) or until the engine dies or fails to start (1). Bad flags,
    a port in use and a model that cannot load end with a one-line error before uvicorn starts."""
    host = f"[{args.host}]" if ":" in args.host else args.host
    holder: list[_Server] = []
    started = time.perf_counter()
    try:
        load_chat_template(args.chat_template)
        api_keys(args)
        check_port_free(args.host, args.port)
        backend = launch(args)
    except (ValueError, OSError, RuntimeError) as e:  # NOTE: OSError covers a missing model
        raise SystemExit(f"radixlm serve: error: {e}") from None
    except KeyboardInterrupt:  # NOTE: Ctrl-C while loading; launch stopped its children
        raise SystemExit(130) from None
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in backend.info.get("startup_s", {}).items())
    logger.info("engine ready in %.2f s (scheduler: %s)", time.perf_counter() - started, phases)
    app = create_app(args, on_fatal=lambda reason: holder[0].die(reason), backend=backend)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level,
        timeout_graceful_shutdown=5, lifespan="on",
    )
    server = _Server(config, f"http://{host}:{args.port}")
    holder.append(server)
    server.run()
    if server.fatal is not None:
        print(f"radixlm: the engine died: {server.fatal}", file=sys.stderr, flush=True)
        return 1
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve-ray"]:
        from radixlm.deploy.ray import main as serve_ray  # NOTE: needs the ray extra

        sys.exit(serve_ray(argv[1:]))
    if argv[:1] == ["build-graphs"]:
        sys.exit(build_graphs(parse_args(argv[1:])))
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[server] %(levelname)s %(message)s")
    sys.exit(serve(args))


def build_graphs(args: ServerArgs) -> int:
    """``radixlm build-graphs [serve flags]``: start the engine ``radixlm serve`` would with
    these flags until its compiled CPU step graphs are loaded (built first where missing, one
    line each), then stop: what ``make serve`` runs first, so that it serves at full speed
    from its first request. 1 if the graphs are unavailable."""
    backend = launch(args.replace(wait_cpu_graphs=True))
    try:
        status = backend.info.get("cpu_compile", "off")
    finally:
        backend.shutdown()
    print(f"radixlm build-graphs: CPU step graphs {status}", flush=True)
    return 0 if status in ("ready", "off") else 1
