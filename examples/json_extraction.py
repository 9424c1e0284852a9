"""JSON extraction: a ``gen`` constrained by a JSON schema always parses; ``gen_int`` returns
an int. Run: ``python examples/json_extraction.py [--url URL]``
"""

from __future__ import annotations

import json

from _backend import backend_from_args

import radixlm as sgl

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "city": {"type": "string", "maxLength": 24},
        "profession": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "city", "profession"],
    "additionalProperties": False,
}
TEXTS = [
    "Maria Lopez is a nurse who has lived in Madrid for ten years. She is 34 years old.",
    "Tom Becker, 51, teaches history at a school in Berlin.",
]


@sgl.function
def extract(s, text):
    s += sgl.user("Extract the person's name, city and profession as JSON.\n\n" + text)
    s += sgl.assistant(sgl.gen("person", max_tokens=64, json_schema=PERSON))
    s += sgl.user("How old is the person? Answer with a number.")
    s += sgl.assistant(sgl.gen_int("age", max_tokens=4))


def main() -> None:
    _, backend = backend_from_args(__doc__)
    for state in extract.run_batch([{"text": t} for t in TEXTS], temperature=0):
        if state.error() is not None:
            print("failed:", state.error())
            continue
        person = json.loads(state["person"])
        person["age"] = state["age"]
        print(json.dumps(person))
    backend.shutdown()


if __name__ == "__main__":
    main()
