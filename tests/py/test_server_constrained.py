"""Constrained decoding over HTTP (spec/SERVING.md §3.3 response_format / tool_choice, §4.6) on the
embedded default model. Its weights are random, so without the constraint its output is noise: every
sampled output below being valid JSON that validates against the schema (jsonschema, the reference
validator), or a parsed tool call with valid arguments, is the constraint's doing."""
import concurrent.futures as cf
import json
import urllib.error
import urllib.request

import jsonschema
import pytest


def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def sse(base, body):
    body = dict(body, stream=True)
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
    return [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: ") and e[6:] != "[DONE]"]


MSG = [{"role": "user", "content": "Describe a person as JSON."}]

# Small on purpose: the random model spends most tokens on the allowed whitespace, and the CPU
# reference takes a fraction of a second per step, so values must finish within ~100 tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "age": {"type": "integer"},
        "admin": {"type": "boolean"},
        "role": {"enum": ["user", "owner", None]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 2}, "maxItems": 1},
        "email": {"type": ["string", "null"], "maxLength": 3},
    },
    "required": ["name", "age", "admin", "role"],
    "additionalProperties": False,
}

TOOLS = [
    {"type": "function", "function": {"name": "now", "description": "The time"}},
    {"type": "function", "function": {
        "name": "pick", "parameters": {"type": "object", "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]}, "n": {"type": "integer"}},
            "required": ["unit"], "additionalProperties": False}}},
]


def many(base, seeds, **kw):
    """Run one request per seed, 8 at a time (the server's max_num_seqs), temperature 1."""
    def one(seed):
        body = {"messages": MSG, "temperature": 1.0, "seed": seed, "max_tokens": 100}
        body.update(kw)
        status, r = post(base, body)
        assert status == 200, r
        return r["choices"][0]
    with cf.ThreadPoolExecutor(8) as ex:
        return list(ex.map(one, seeds))


COMPACT = {"disable_any_whitespace": True}  # vLLM's structured_outputs option: no blanks between tokens


def test_json_schema_20_seeds(default_server):
    # compact JSON: every one of the 20 sampled outputs finishes, parses and validates
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    for ch in many(default_server.base, range(20), response_format=rf, structured_outputs=COMPACT, max_tokens=80):
        assert ch["finish_reason"] == "stop", ch
        text = ch["message"]["content"]
        jsonschema.validate(json.loads(text), SCHEMA)
        assert not any(c in text for c in "\n\t\r"), text


def test_structured_outputs_json(default_server):
    for ch in many(default_server.base, range(40, 42), structured_outputs=dict(COMPACT, json=SCHEMA)):
        assert ch["finish_reason"] == "stop", ch
        jsonschema.validate(json.loads(ch["message"]["content"]), SCHEMA)


def test_json_object(default_server):
    # any object, blanks allowed (bounded runs): strings are unbounded, so the random model
    # rarely closes one; what finishes must be an object, what is cut must start like one
    for ch in many(default_server.base, range(100, 104), response_format={"type": "json_object"}, max_tokens=30):
        if ch["finish_reason"] == "stop":
            assert isinstance(json.loads(ch["message"]["content"]), dict), ch
        else:
            assert ch["message"]["content"].lstrip().startswith("{"), ch


def check_call(tc, names):
    assert tc["type"] == "function" and tc["function"]["name"] in names, tc
    args = json.loads(tc["function"]["arguments"])
    schema = next(t["function"].get("parameters") for t in TOOLS if t["function"]["name"] == tc["function"]["name"])
    jsonschema.validate(args, schema or {"type": "object", "maxProperties": 0})


def test_tool_choice_required(default_server):
    # every response carries at least one call, each with arguments valid for its tool
    for ch in many(default_server.base, range(200, 208), tools=TOOLS, tool_choice="required", max_tokens=130,
                   structured_outputs=COMPACT):
        calls = ch["message"]["tool_calls"]
        assert len(calls) >= 1, ch
        for tc in calls:  # complete calls are kept even when max_tokens cut the block (§5.2)
            check_call(tc, {"now", "pick"})
        assert not ch["message"]["content"], ch  # the block is the whole output
        assert ch["finish_reason"] in ("tool_calls", "length"), ch


def test_tool_choice_named(default_server):
    for ch in many(default_server.base, range(300, 303), tools=TOOLS, max_tokens=160,
                   tool_choice={"type": "function", "function": {"name": "pick"}}, structured_outputs=COMPACT):
        calls = ch["message"]["tool_calls"]
        assert len(calls) == 1 and ch["finish_reason"] == "tool_calls", ch
        check_call(calls[0], {"pick"})


def test_streaming_matches_non_streaming(default_server):
    b = default_server.base
    body = {"messages": MSG, "temperature": 1.0, "seed": 7, "max_tokens": 80, "structured_outputs": COMPACT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    with cf.ThreadPoolExecutor(2) as ex:  # both at once: one batch
        f1, f2 = ex.submit(post, b, body), ex.submit(sse, b, body)
        (status, r), chunks = f1.result(), f2.result()
    assert status == 200
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == r["choices"][0]["message"]["content"]
    json.loads(text)


def test_thinking_constrains_after_reasoning(default_server):
    # With thinking on the constraint arms at </think>; the random model rarely closes its
    # reasoning, so the content stays empty or is valid JSON, and JSON never has to appear in
    # the reasoning (SERVING.md §4.6).
    for ch in many(default_server.base, range(400, 404), response_format={"type": "json_object"},
                   chat_template_kwargs={"thinking": True}, max_tokens=30):
        if ch["message"]["content"] and ch["finish_reason"] == "stop":
            assert isinstance(json.loads(ch["message"]["content"]), dict)


@pytest.mark.parametrize("rf,needle", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 0}}},
     '"minimum" is not supported'),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}},
     '"pattern"'),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/a"}}}, '"$ref"'),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}, "unknown type"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema` is required"),
    ({"type": "json_schema"}, "json_schema` must be an object"),
    ({"type": "yaml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "anyOf": [{"type": "object"}, {"type": "object", "required": []}]}}}, "anyOf"),
])
def test_bad_schemas_are_400(default_server, rf, needle):
    status, r = post(default_server.base, {"messages": MSG, "max_tokens": 4, "response_format": rf})
    assert status == 400, r
    assert needle in r["error"]["message"], r
    assert r["error"]["param"] == "response_format"


@pytest.mark.parametrize("extra,needle", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, '"nope"'),
    ({"tool_choice": "required"}, "non-empty `tools`"),
    ({"tools": TOOLS, "tool_choice": "any"}, "must be"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "must be"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "format": "date"}}}}}],
      "tool_choice": "required"}, '"format" is not supported'),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex` is not supported"),
    ({"structured_outputs": {"json": {"type": "object"}}, "response_format": {"type": "json_object"}},
     "cannot be combined"),
])
def test_bad_tool_choice_is_400(default_server, extra, needle):
    body = {"messages": MSG, "max_tokens": 4}
    body.update(extra)
    status, r = post(default_server.base, body)
    assert status == 400, r
    assert needle in r["error"]["message"], r


def test_tool_choice_none_and_text_unconstrained(default_server):
    b = default_server.base
    status, r = post(b, {"messages": MSG, "max_tokens": 6, "temperature": 0, "tools": TOOLS, "tool_choice": "none"})
    assert status == 200 and r["choices"][0]["message"]["tool_calls"] == []
    status, r2 = post(b, {"messages": MSG, "max_tokens": 6, "temperature": 0, "response_format": {"type": "text"}})
    assert status == 200 and r2["choices"][0]["finish_reason"] == "length"


def test_completions_json_schema(default_server):
    # /v1/completions takes response_format and structured_outputs too (no tools there)
    def one(seed):
        body = {"prompt": "A person as JSON:", "temperature": 1.0, "seed": seed, "max_tokens": 80,
                "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
                "structured_outputs": COMPACT}
        req = urllib.request.Request(default_server.base + "/v1/completions", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())["choices"][0]
    with cf.ThreadPoolExecutor(2) as ex:
        for ch in ex.map(one, (50, 51)):
            assert ch["finish_reason"] == "stop", ch
            jsonschema.validate(json.loads(ch["text"]), SCHEMA)
