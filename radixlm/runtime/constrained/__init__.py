"""Constrained decoding: regex / JSON-schema / choice grammars as token bitmasks.

The package imports nothing itself: the server process uses the torch-free parts (``specs``,
``schema_regex``, ``text_regex``) and must not pay for ``base``'s torch import."""
