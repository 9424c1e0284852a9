"""``python -m radixlm.server``: same as ``radixlm serve``."""

from __future__ import annotations

from radixlm.server.cli import main

if __name__ == "__main__":
    main()
