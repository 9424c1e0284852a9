"""The HTTP server: native and OpenAI-compatible routes over one runtime (``radixlm serve``)."""
