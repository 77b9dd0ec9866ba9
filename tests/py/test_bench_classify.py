"""Soak classifier (bench/dsv4bench/classify.py) on hand-made examples of each class.

Healthy examples include the repetitive-but-progressing outputs the decode set
asks for (counting, multiplication table, templated SQL), which a naive
repetition check would flag. The loop examples include one that passes a
block-level check (every paragraph is varied on its own) yet repeats.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from dsv4bench import classify  # noqa: E402
from dsv4bench.classify import classify as cl  # noqa: E402


def resp(content="", reasoning="", finish="stop", tokens=50, tool_calls=None, error=None):
    return {"content": content, "reasoning": reasoning, "finish_reason": finish,
            "completion_tokens": tokens, "tool_calls": tool_calls or [], "error": error}


PROSE = ("The keeper climbed the spiral stairs at dusk, as she had every evening for thirty years. "
         "Below, the tide pulled at the rocks and a gull complained about the wind. On the landing "
         "she found the bottle, green glass furred with salt, wedged against the rail where no wave "
         "should have reached. Inside was a letter in her grandmother's careful hand, dated the "
         "winter before the war, describing a lamp that never went out and a daughter not yet born.")


def test_healthy_outputs_have_no_labels():
    cases = [
        PROSE,
        ", ".join(str(i) for i in range(1, 301)),
        "\n".join(f"| {a} | " + " | ".join(str(a * b) for b in range(1, 13)) + " |" for a in range(1, 13)),
        "\n".join(f"INSERT INTO orders (id, customer_id, product, quantity, status) VALUES "
                  f"({i}, {100 + i * 7 % 100}, 'stapler', {1 + i % 20}, 'pending');" for i in range(1, 61)),
        json.dumps([{"id": i, "name": f"Person {i}", "department": "Sales", "salary": 50000 + i,
                     "active": True} for i in range(1, 61)], indent=1),
        "def insert(self, key):\n    node = self.root\n    while node:\n        if key < node.key:\n"
        "            node = node.left\n        else:\n            node = node.right\n" * 1,
        "A quoted word is fine: the Chinese for water is 水 (shuǐ), and that is all.",
    ]
    for c in cases:
        assert cl(resp(c)) == [], c[:60]


def test_error():
    assert cl(resp(error="HTTP 500: engine failure")) == ["error"]


def test_empty_content_split_by_finish_and_think_end():
    # Runaway reasoning cut by max_tokens: all output is reasoning (SERVING.md §4.3/4.4).
    assert cl(resp("", "Let me think about this. " + PROSE, "length", 900)) == ["empty:length:no_think_end"]
    # EOS inside reasoning.
    assert cl(resp(None, PROSE, "stop", 120)) == ["empty:stop:no_think_end"]
    # A server without a reasoning parser: the literal </think> ends the text, nothing after it.
    labels = cl(resp("", PROSE + "</think>", "stop", 130))
    assert "empty:stop:think_end" in labels and "leak:reasoning" in labels
    # Chat mode, tokens generated but nothing visible.
    assert cl(resp("  \n", "", "stop", 3)) == ["empty:stop:no_reasoning"]
    # Zero tokens and no content is not "empty with real tokens".
    assert cl(resp("", "", "stop", 0)) == []
    # Tool-call-only answers are not empty.
    tc = [{"name": "bash", "arguments": "{\"command\": \"ls 2>&1\"}"}]
    assert cl(resp(None, "", "tool_calls", 30, tool_calls=tc)) == []


def test_verbatim_loop_in_content_and_reasoning():
    loop = "I will check the file again. " * 60
    assert cl(resp("Sure. " + loop)) == ["loop:content"]
    assert cl(resp("42", "First, " + loop)) == ["loop:reasoning"]


def test_loop_that_looks_healthy_block_by_block():
    """Four varied paragraphs (each ~70 words with no repeated 8-gram and a
    high distinct-word ratio), cycled six times: any block-level check passes,
    but from the second cycle on no 8-gram is new."""
    paras = [
        "Alright, so the user wants the count of test files. First I should list the directory, "
        "then filter by the python suffix, and finally count what remains. There might be nested "
        "folders, which the find command handles, although hidden caches could add noise. The safest "
        "approach is to exclude pycache explicitly and report the number together with the command used.",
        "Wait, maybe the tests live somewhere else entirely. The repository layout mentions a tests "
        "folder with unit and py subfolders, so the python tests are probably under tests/py. Counting "
        "only that subfolder would miss fixtures, but fixtures are data rather than tests, therefore "
        "excluding them seems right. Let me reconsider whether conftest counts as a test file.",
        "Conftest is a support module, not a test, yet it ends in .py and the question says Python "
        "files, not test files. So the literal reading includes it. I should state which reading I "
        "used. Also the command should redirect errors into the output stream so the user sees "
        "permission problems, which means appending two greater-than ampersand one.",
        "Hmm, but the user might prefer a recursive count across every subdirectory beneath tests. "
        "Running find with type f and a name pattern, piped into wc with the lines flag, gives that "
        "total directly. Before answering, double check that symbolic links are not followed, because "
        "following them could double count files shared between fixture folders.",
    ]
    for p in paras:  # each block is healthy on its own
        w = classify.words(p)
        grams = [tuple(w[i:i + 8]) for i in range(len(w) - 7)]
        assert len(set(grams)) == len(grams)
        assert len(set(w)) / len(w) > 0.6
        assert cl(resp("ok", p)) == []
    text = "\n\n".join(paras * 6)
    assert cl(resp("ok", text)) == ["loop:reasoning"]
    # The first cycle alone is not a loop.
    assert cl(resp("ok", "\n\n".join(paras))) == []


def test_character_level_loop_without_spaces():
    assert cl(resp("Result: " + "ab" * 300)) == ["loop:content"]


def test_cjk_drift():
    drift = PROSE + " 然后我们需要检查文件的数量，并且确认每一个测试文件都已经被正确地统计在内。"
    assert cl(resp(drift)) == ["cjk_drift:content"]
    assert cl(resp(drift), expect_english=False) == []
    assert cl(resp("fine", "好的，" + "用户想要知道答案是什么，我需要仔细思考这个问题的每一个步骤。")) == ["cjk_drift:reasoning"]


def test_template_dsml_and_xml_leakage():
    cases = {
        "Hello<｜end▁of▁sentence｜>": "leak:content",
        "<｜Assistant｜>Sure, here it is.": "leak:content",
        "Done.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">": "leak:content",
        "text </｜DSML｜parameter> more": "leak:content",
        "<think>hidden</think>Answer": "leak:content",
        "<|im_start|>assistant\nhi": "leak:content",
        "<tool_calls>\n<invoke name=\"bash\">\n<parameter name=\"command\">ls</parameter>": "leak:content",
    }
    for text, label in cases.items():
        assert label in cl(resp(text)), text
    assert cl(resp("ok", "thinking <｜User｜> oops")) == ["leak:reasoning"]
    tc = [{"name": "bash", "arguments": "{\"command\": \"ls</｜DSML｜parameter>\"}"}]
    assert cl(resp(None, "", "tool_calls", 20, tool_calls=tc)) == ["leak:tool_call"]
    # Ordinary HTML or generic angle brackets are not leakage.
    assert cl(resp("Use <div class=\"x\"> and a < b > c in code.")) == []


def test_bad_json_and_tool_args():
    assert cl(resp('{"people": ["Ada"]}'), expect_json=True) == []
    assert cl(resp('```json\n{"people": ["Ada"]}\n```'), expect_json=True) == []
    assert cl(resp('{"people": ["Ada"'), expect_json=True) == ["bad_json"]
    assert cl(resp('{"people": ["Ada"', finish="length"), expect_json=True) == ["bad_json:length"]
    bad = [{"name": "bash", "arguments": "{\"command\": \"ls"}]
    assert cl(resp(None, "", "tool_calls", 20, tool_calls=bad)) == ["bad_tool_args"]
    notobj = [{"name": "bash", "arguments": "[1, 2]"}]
    assert cl(resp(None, "", "tool_calls", 20, tool_calls=notobj)) == ["bad_tool_args"]


def test_families_cover_every_label():
    labels = set()
    for r in [resp(error="x"), resp("", PROSE, "length", 9), resp("a " * 400),
              resp("x" + "漢字" * 20), resp("<｜User｜>"), resp("{", tokens=1)]:
        labels.update(cl(r, expect_json=True))
    assert {classify.family(x) for x in labels} <= set(classify.FAMILIES)
