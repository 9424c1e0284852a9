"""The tokenizer of the processes that only turn text into ids and back (the server and the
detokenizer), without torch.

transformers' tokenizer classes import torch: ~220 MB resident in each process that holds one.
The scheduler loads transformers' tokenizer anyway (grammars and stop strings need it), and
saves what that tokenizer runs on (:func:`save_text_tokenizer`): its ``tokenizers`` backend as
transformers set it up (``tokenizer.json``), its named special tokens, its chat template(s) and
whether decoding cleans up spaces. :class:`TextTokenizer` loads those with the ``tokenizers``
library and renders chat templates with transformers' own Jinja renderer
(``transformers.utils.chat_template_utils``, which imports no torch), so ids, text and prompts
are the ones transformers' tokenizer gives (``tests/runtime/loader/test_text_tokenizer.py``).
A tokenizer without a ``tokenizers`` backend is not saved; those processes then load
transformers' tokenizer, as the scheduler does.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from typing import Any

from radixlm.runtime.config import ServerArgs

logger = logging.getLogger(__name__)

BACKEND_FILE = "tokenizer.json"
META_FILE = "text_tokenizer.json"
# NOTE: weights are not read to tokenize: their sizes and dates do not key the saved tokenizer
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")


def cache_root() -> str:
    return os.environ.get("RADIXLM_CACHE", os.path.expanduser("~/.cache/radixlm"))


def text_tokenizer_dir(args: ServerArgs, path: str) -> str | None:
    """Where the tokenizer of ``args`` (model at ``path``) is saved for the torch-free
    processes, keyed by its source files' names, sizes and dates and the library versions;
    None when the source is not a local file or directory."""
    source = os.path.abspath(args.tokenizer_path or path)
    if not os.path.exists(source):
        return None
    if os.path.isdir(source):
        names = sorted(n for n in os.listdir(source) if not n.endswith(_WEIGHT_SUFFIXES))
        files = [os.path.join(source, n) for n in names if os.path.isfile(os.path.join(source, n))]
    else:
        files = [source]
    stats = ((f, os.stat(f)) for f in files)
    key = [source, *(f"{f}:{s.st_size}:{s.st_mtime_ns}" for f, s in stats)]
    for package in ("transformers", "tokenizers"):
        key.append(importlib.metadata.version(package))
    digest = hashlib.sha256("\n".join(key).encode()).hexdigest()[:24]
    return os.path.join(cache_root(), "text-tokenizers", digest)


def save_text_tokenizer(tokenizer: Any, directory: str | None) -> bool:
    """Save what ``tokenizer`` (transformers') runs on into ``directory``, unless it is there;
    False when the tokenizer has no ``tokenizers`` backend, this transformers has no
    torch-free template renderer, or the directory is not writable."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if directory is None or backend is None or not _renderer_available():
        return False
    if os.path.isfile(os.path.join(directory, META_FILE)):
        return True
    clean = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    if type(backend.model).__name__ == "BPE" and not getattr(
        tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
    ):
        clean = False  # NOTE: what transformers' decode does (the clean-up corrupts BPE text)
    meta = {
        "special_tokens": dict(tokenizer.special_tokens_map),
        "chat_template": tokenizer.chat_template,
        "clean_up_tokenization_spaces": clean,
    }
    try:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        staging = tempfile.mkdtemp(dir=os.path.dirname(directory))
        backend.save(os.path.join(staging, BACKEND_FILE))
        with open(os.path.join(staging, META_FILE), "w") as f:
            json.dump(meta, f)
        try:
            os.rename(staging, directory)  # NOTE: atomic; another process may have won the race
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError:
        return False
    return True


def _renderer_available() -> bool:
    try:
        from transformers.utils.chat_template_utils import (  # noqa: F401
            _normalize_chat_messages,
            render_jinja_template,
        )
    except ImportError:  # NOTE: an older transformers: those processes load its tokenizer
        return False
    return True


def load_text_tokenizer(args: ServerArgs, path: str, fmt: str):
    """The torch-free tokenizer saved for this model, else transformers' (which saves it for
    next time); None with ``skip_tokenizer_init``."""
    if args.skip_tokenizer_init:
        return None
    directory = text_tokenizer_dir(args, path)
    if directory is not None and os.path.isfile(os.path.join(directory, META_FILE)):
        try:
            return TextTokenizer(directory)
        except Exception as e:  # noqa: BLE001  (a damaged save: transformers' tokenizer serves)
            logger.warning("cannot load the saved tokenizer %s (%s); loading transformers'",
                           directory, e)  # fmt: skip
    from radixlm.runtime.loader.model_files import load_tokenizer

    return load_tokenizer(args, path, fmt)


class TextTokenizer:
    """encode, decode and ``apply_chat_template`` as transformers' tokenizer does them (the
    subset the server and the detokenizer use)."""

    def __init__(self, directory: str) -> None:
        from tokenizers import Tokenizer

        self._backend = Tokenizer.from_file(os.path.join(directory, BACKEND_FILE))
        with open(os.path.join(directory, META_FILE)) as f:
            meta = json.load(f)
        self.special_tokens_map: dict[str, str] = meta["special_tokens"]
        self.chat_template: str | dict[str, str] | None = meta["chat_template"]
        self._clean_up = meta["clean_up_tokenization_spaces"]
        for name, token in self.special_tokens_map.items():
            setattr(self, name, token)
            setattr(self, f"{name}_id", self._backend.token_to_id(token))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self._clean_up else text

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self._backend.id_to_token(i) for i in ids]

    def apply_chat_template(
        self,
        conversation: list,
        chat_template: str | None = None,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> str | list[int]:
        from transformers.utils.chat_template_utils import (
            _normalize_chat_messages,
            render_jinja_template,
        )

        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        rendered, _ = render_jinja_template(
            conversations=[_normalize_chat_messages(conversation)],
            tools=tools,
            documents=documents,
            chat_template=self._template(chat_template, tools),
            continue_final_message=continue_final_message,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **kwargs},
        )
        return self.encode(rendered[0], add_special_tokens=False) if tokenize else rendered[0]

    def _template(self, chat_template: str | None, tools: list[dict] | None) -> str:
        """transformers' choice: a name among several templates, a template, the default."""
        own = self.chat_template
        if isinstance(own, dict):
            if chat_template is not None:
                return own.get(chat_template, chat_template)
            if tools is not None and "tool_use" in own:
                return own["tool_use"]
            if "default" in own:
                return own["default"]
            raise ValueError(f"the model has several chat templates and none is the default: "
                             f"name one of {sorted(own)}")  # fmt: skip
        if chat_template is not None:
            return chat_template
        if own is None:
            raise ValueError("the tokenizer has no chat template")
        return own


def _clean_up(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (spaces before punctuation and contractions)."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                           (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                           (" 're", "'re")):  # fmt: skip
        text = text.replace(spaced, joined)
    return text
