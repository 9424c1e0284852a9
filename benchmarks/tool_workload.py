"""A function-calling set written for bench_tools: 8 tools, 56 requests, each offering 4-8 tools
(4 fixed tool sets, as an agent has) and naming the tool a good answer calls."""

from __future__ import annotations


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": params}}


S = {"type": "string", "maxLength": 40}
TOOLS = [
    _fn("get_weather", "Current weather in a city.",
        {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city", "unit"]),
    _fn("search_flights", "Find flights between two cities.",
        {"origin": S, "destination": S, "date": {"type": "string", "format": "date"},
         "passengers": {"type": "object", "required": ["adults", "children"], "properties": {
             "adults": {"type": "integer", "minimum": 1, "maximum": 9},
             "children": {"type": "integer", "minimum": 0, "maximum": 9}}}},
        ["origin", "destination", "passengers"]),
    _fn("add_to_cart", "Add products to the shopping cart.",
        {"items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "required": ["product", "quantity"], "properties": {
                "product": S, "quantity": {"type": "integer", "minimum": 1, "maximum": 99}}}}},
        ["items"]),
    _fn("set_alarm", "Set an alarm on some weekdays.",
        {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
         "minute": {"type": "integer", "minimum": 0, "maximum": 59},
         "days": {"type": "array", "minItems": 1, "maxItems": 7,
                  "items": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]}}},
        ["hour", "minute", "days"]),
    _fn("send_email", "Send an e-mail.",
        {"to": {"type": "string", "format": "email"}, "subject": S,
         "body": {"type": "string", "maxLength": 120}}, ["to", "subject", "body"]),
    _fn("get_stock_price", "The latest price of a stock.",
        {"ticker": {"type": "string", "pattern": "[A-Z]{1,5}"},
         "exchange": {"enum": ["NYSE", "NASDAQ", "LSE", "TSE"]}}, ["ticker"]),
    _fn("translate", "Translate text into another language.",
        {"text": {"type": "string", "maxLength": 80},
         "target_language": {"enum": ["french", "german", "spanish", "japanese", "italian"]}},
        ["text", "target_language"]),
    _fn("convert_units", "Convert a quantity between units.",
        {"value": {"type": "number", "minimum": -1e6, "maximum": 1e6},
         "from_unit": {"enum": ["km", "mile", "kg", "lb", "celsius", "fahrenheit"]},
         "to_unit": {"enum": ["km", "mile", "kg", "lb", "celsius", "fahrenheit"]}},
        ["value", "from_unit", "to_unit"]),
]
TOOL_SETS = [TOOLS[0:4], TOOLS[4:8], TOOLS[0:8], TOOLS[2:8]]

PROMPTS = {
    "get_weather": ["What's the weather in Paris?", "Is it raining in Seattle right now?",
                    "How hot is it in Cairo, in fahrenheit?", "Weather for Tokyo please.",
                    "Do I need a coat in Oslo today?", "Temperature in Lima in celsius?",
                    "What's it like outside in Berlin?"],
    "search_flights": ["Find a flight from Boston to Denver for two adults.",
                       "I need flights from London to Rome on 2027-03-14 for one adult.",
                       "Flights Madrid to Lisbon, two adults and two kids.",
                       "Search flights from Chicago to Miami for 1 adult and 1 child.",
                       "Any flights from Sydney to Auckland for three adults?",
                       "Book-search: Paris to Berlin, 2027-01-05, one passenger.",
                       "Flights from Toronto to Vancouver for a family of four, two kids."],
    "add_to_cart": ["Add two bags of coffee to my cart.", "Put 3 notebooks and a pen in my cart.",
                    "I want to buy 6 eggs and a loaf of bread.", "Add one laptop stand, please.",
                    "Add 10 AA batteries to the basket.", "Cart: 2 green teas and 1 honey jar.",
                    "Buy four tennis balls."],
    "set_alarm": ["Wake me up at 7:30 on weekdays.", "Set an alarm for 6 am on Saturday.",
                  "Alarm at 21:15 every day.", "Remind me at 9:00 on Monday and Thursday.",
                  "Set an alarm for 5:45 on weekends.", "Alarm 12:00 on Friday.",
                  "Wake me at 8 on Tuesday."],
    "send_email": ["Email bob@example.com that the meeting moved to 3pm.",
                   "Send alice@corp.org a note saying thanks for lunch.",
                   "Write to team@startup.io: the release is delayed a day.",
                   "Mail carol@example.net the subject 'Invoice' and say it is attached.",
                   "Tell dave@mail.com by email that I'm running late.",
                   "Email support@shop.com about my broken order.",
                   "Send eve@example.org a birthday greeting."],
    "get_stock_price": ["What's Apple's stock price?", "Price of MSFT on NASDAQ?",
                        "How is TSLA trading?", "Check the price of IBM on the NYSE.",
                        "Latest quote for NVDA.", "What does Toyota (TM) trade at on TSE?",
                        "Get me the price of AMZN."],
    "translate": ["Translate 'good morning' into French.", "How do you say 'thank you' in German?",
                  "Translate 'where is the station' to Spanish.", "Say 'I love coffee' in Italian.",
                  "Translate 'see you tomorrow' into Japanese.", "'Happy birthday' in French?",
                  "Translate 'the bill, please' into German."],
    "convert_units": ["Convert 10 km to miles.", "How many pounds is 70 kg?",
                      "What is 100 fahrenheit in celsius?", "Convert 26.2 miles to km.",
                      "5 lb in kg?", "Convert -40 celsius to fahrenheit.",
                      "How many kilometers are 3 miles?"],
}


def requests() -> list[tuple[str, list[dict], str]]:
    """``(prompt, offered tools, expected tool)``: each prompt offered a tool set holding its
    tool, the sets taken in turn."""
    out = []
    for tool_name, prompts in PROMPTS.items():
        sets = [s for s in TOOL_SETS if any(t["function"]["name"] == tool_name for t in s)]
        for i, prompt in enumerate(prompts):
            out.append((prompt, sets[i % len(sets)], tool_name))
    return out
