"""``sgl.image`` inputs as the URLs OpenAI's vision messages carry (``image_url`` parts)."""

from __future__ import annotations

import base64
import mimetypes
import os

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
          (b"GIF8", "image/gif"), (b"RIFF", "image/webp"), (b"BM", "image/bmp"))  # fmt: skip


def image_url(source: str | bytes | os.PathLike) -> str:
    """An ``http(s)``/``data:`` URL as it is; a file path or raw bytes as a base64 data URL."""
    if isinstance(source, str) and source.startswith(("http://", "https://", "data:")):
        return source
    if isinstance(source, bytes):
        data, mime = source, _sniff(source)
    else:
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise ValueError(f"sgl.image({path!r}): no such file (pass a path, a URL or bytes)")
        with open(path, "rb") as f:
            data = f.read()
        mime = mimetypes.guess_type(path)[0] or _sniff(data)
    if not mime.startswith("image/"):
        raise ValueError(f"sgl.image: not an image ({mime})")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _sniff(data: bytes) -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    return "application/octet-stream"
