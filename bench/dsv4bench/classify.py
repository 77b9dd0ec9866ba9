"""Output-health classifier for soak responses.

Every response gets a list of labels; an empty list means healthy. A clean
soak run reports zero of every class. Classes:

  error            the request failed (HTTP status, transport, SSE error event,
                   stream without [DONE])
  empty:<finish>:<think_end>
                   no visible content and no tool call although the server
                   reports completion tokens (spec/SERVING.md §4.4 runaways,
                   §4.3 `</think>` never arriving). <think_end> is
                   "think_end" when the literal `</think>` appears in the
                   output, "no_think_end" when the server's reasoning parser
                   kept all output as reasoning (the §4.3 shape of an
                   unterminated think; a think closed with nothing after it
                   looks the same from outside), "no_reasoning" otherwise.
  loop:<field>     repetition loop in content or reasoning: a run of word
                   windows in which almost no word 8-gram is new. Works where
                   block-level checks fail: a loop of long paragraphs, each
                   fine on its own, repeats 8-grams seen many words earlier.
  cjk_drift:<field>
                   an English request answered (partly) in CJK script.
  leak:<field>     chat-template, special-token, DSML or tool-XML markup in
                   text a client sees (SERVING.md §3.5: never emitted).
  bad_json         a response_format JSON request whose content is not JSON
                   (bad_json:length when the token budget cut it).
  bad_tool_args    a tool call whose arguments are not a JSON object.

The thresholds below are deliberately loose: templated yet progressing text
(counting, multiplication tables, SQL INSERTs with new values) keeps a high
share of novel 8-grams; a verbatim loop drops to zero.
"""
import json
import re

NGRAM = 8           # words per n-gram
WINDOW = 48         # words per window
STRIDE = 24         # words between window starts
LOW_NOVEL = 0.15    # a window with fewer new 8-grams than this is "looping"
MIN_LOW_RUN = 3     # this many consecutive looping windows (~96+ words) => loop

# Words: CJK characters one by one (no spaces between them), runs of
# letters/digits, and single punctuation marks (so code and JSON tokenise).
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
                   r"|[^\W_]+|[^\w\s]", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff01-\uff60]")
_LATIN = re.compile(r"[A-Za-z]")
# A short unit repeated many times without spaces ("ababab...", "的的的...").
_CHAR_LOOP = re.compile(r"(.{1,24}?)\1{24,}", re.DOTALL)

_LEAKS = [
    ("special_token", re.compile(r"<\uff5c[^<>\n]{1,40}?\uff5c>")),       # <｜User｜>, <｜end▁of▁sentence｜>
    ("dsml", re.compile(r"\uff5cDSML\uff5c")),                             # ｜DSML｜
    ("think_tag", re.compile(r"</?think>")),
    ("chatml_token", re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|begin_of_text|"
                                r"end_of_text|start_header_id|end_header_id|assistant|user|"
                                r"system|end|tool_call|tool_response)\|>")),
    ("tool_xml", re.compile(r"</?(?:tool_calls?|function_calls|tool_result|tool_response)>"
                            r"|<(?:invoke|parameter) name=\"")),
]


def words(text):
    return _WORD.findall(text.lower())


def loop_span(text):
    """Longest run of looping windows: returns (windows, first word index) or (0, -1).

    A window is looping when fewer than LOW_NOVEL of its 8-grams are new to
    the whole text so far.
    """
    w = words(text)
    if len(w) < NGRAM + WINDOW:
        return 0, -1
    grams = [tuple(w[i:i + NGRAM]) for i in range(len(w) - NGRAM + 1)]
    first_seen = {}
    for i, g in enumerate(grams):
        first_seen.setdefault(g, i)
    best, best_at, run, run_at = 0, -1, 0, -1
    for start in range(0, len(grams) - WINDOW + 1, STRIDE):
        win = range(start, start + WINDOW)
        novel = sum(1 for i in win if first_seen[grams[i]] == i)
        if novel / WINDOW < LOW_NOVEL:
            if run == 0:
                run_at = start
            run += 1
            if run > best:
                best, best_at = run, run_at
        else:
            run = 0
    return best, best_at


def is_loop(text):
    """True when the text contains a repetition loop (word 8-grams or a character loop)."""
    if not text:
        return False
    if loop_span(text)[0] >= MIN_LOW_RUN:
        return True
    m = _CHAR_LOOP.search(text)
    return bool(m and len(m.group(0)) >= 200)


def cjk_drift(text):
    """True when text meant to be English carries a substantial CJK part.

    Flags at least 16 CJK characters that are also at least 5 % of the
    letters; a quoted Chinese word or two in an English answer is allowed.
    """
    if not text:
        return False
    cjk = len(_CJK.findall(text))
    if cjk < 16:
        return False
    latin = len(_LATIN.findall(text))
    return cjk / (cjk + latin) >= 0.05


def leaks(text):
    """Names of the markup kinds that leaked into text (empty list if none)."""
    if not text:
        return []
    return [name for name, rx in _LEAKS if rx.search(text)]


def classify(resp, expect_english=True, expect_json=False):
    """Labels for one response (see the module comment); [] means healthy.

    resp: a dict with keys error (str or None), content (str or None),
    reasoning (str or None), tool_calls (list of {"name","arguments"}),
    finish_reason, completion_tokens (int or None).
    """
    if resp.get("error"):
        return ["error"]
    labels = []
    content = resp.get("content") or ""
    reasoning = resp.get("reasoning") or ""
    tool_calls = resp.get("tool_calls") or []
    toks = resp.get("completion_tokens") or 0
    if not content.strip() and not tool_calls and toks > 0:
        if "</think>" in content or "</think>" in reasoning:
            te = "think_end"
        elif reasoning.strip():
            te = "no_think_end"
        else:
            te = "no_reasoning"
        labels.append(f"empty:{resp.get('finish_reason') or 'none'}:{te}")
    for field, text in (("content", content), ("reasoning", reasoning)):
        if is_loop(text):
            labels.append(f"loop:{field}")
        if expect_english and cjk_drift(text):
            labels.append(f"cjk_drift:{field}")
        if leaks(text):
            labels.append(f"leak:{field}")
    for tc in tool_calls:
        if leaks(tc.get("arguments") or "") or leaks(tc.get("name") or ""):
            labels.append("leak:tool_call")
            break
    if expect_json and content.strip():
        try:
            json.loads(_strip_fence(content))
        except ValueError:
            # Cut by the token budget is told apart from malformed output.
            labels.append("bad_json:length" if resp.get("finish_reason") == "length" else "bad_json")
    for tc in tool_calls:
        try:
            if not isinstance(json.loads(tc.get("arguments") or ""), dict):
                raise ValueError
        except ValueError:
            labels.append("bad_tool_args")
            break
    return labels


def _strip_fence(s):
    """JSON possibly wrapped in a ```json fence (accepted: the content is still JSON)."""
    s = s.strip()
    m = re.match(r"^```[a-zA-Z]*\n(.*)\n```$", s, re.DOTALL)
    return m.group(1) if m else s


# Class families in report order; a clean run prints zero for each.
FAMILIES = ["error", "empty", "loop", "cjk_drift", "leak", "bad_json", "bad_tool_args"]


def family(label):
    return label.split(":", 1)[0]
