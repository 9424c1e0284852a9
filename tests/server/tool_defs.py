"""Four tools with nested, enum and array argument schemas, shared by the tool-calling tests."""

from __future__ import annotations

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
FLIGHTS = {
    "type": "function",
    "function": {
        "name": "search_flights",
        "description": "Find flights between two airports.",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "maxLength": 40},
                "destination": {"type": "string", "maxLength": 40},
                "passengers": {
                    "type": "object",
                    "properties": {
                        "adults": {"type": "integer", "minimum": 1, "maximum": 9},
                        "children": {"type": "integer", "minimum": 0, "maximum": 9},
                    },
                    "required": ["adults", "children"],
                },
            },
            "required": ["origin", "destination", "passengers"],
        },
    },
}
CART = {
    "type": "function",
    "function": {
        "name": "add_to_cart",
        "description": "Add products to the shopping cart.",
        "parameters": {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "maxLength": 20},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                        },
                        "required": ["sku", "quantity"],
                    },
                },
            },
            "required": ["items"],
        },
    },
}
ALARM = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Set an alarm on some weekdays.",
        "parameters": {
            "type": "object",
            "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "days": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 7,
                    "items": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
                },
                "label": {"type": "string", "maxLength": 30},
            },
            "required": ["hour", "days"],
        },
    },
}
TOOLS = [WEATHER, FLIGHTS, CART, ALARM]
PROMPTS = [
    "What's the weather like in Paris right now?",
    "Find me a flight from Boston to Denver for two adults and one child.",
    "Put three bags of coffee (SKU C-100) in my cart.",
    "Wake me up at 7 on weekdays.",
    "Is it cold in Oslo today? Use fahrenheit.",
    "Book a flight from Rome to Madrid for one adult.",
    "Add 2 units of SKU A-7 to the cart.",
    "Set an alarm for 22 on saturday and sunday labelled gym.",
    "Weather in Tokyo in celsius?",
    "I need two flights: NYC to LA, and LA to SF, one adult each.",
    "Remind me at 6 every day.",
    "What is the temperature in Cairo?",
    "Order 5 of SKU Z-9 and 1 of SKU Q-2.",
]


def schema_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
