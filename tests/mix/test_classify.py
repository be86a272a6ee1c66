import pytest

from flashdraft.mix.classify import RuleClassifier
from flashdraft.mix.domains import MixError
from flashdraft.mix.records import to_sample

from .conftest import SAMPLES


@pytest.mark.parametrize("domain", sorted(SAMPLES))
def test_each_domain(domain):
    s = to_sample(SAMPLES[domain], "t", 0)
    label = RuleClassifier().classify(s.prompt, s.response)
    assert label.domain == domain, label
    assert label.rule and label.signals  # the deciding signals come with the label


def test_code_translation_request_is_coding():
    label = RuleClassifier().classify("Translate this Python function to Rust:\n```python\ndef f(x):\n    return x\n```",
                                      "```rust\nfn f(x: i32) -> i32 { x }\n```")
    assert label.domain == "coding"


def test_two_scripts_without_request_is_translation():
    assert RuleClassifier().classify("Good morning, how are you?", "おはようございます、お元気ですか？").domain == "translation"


def test_tool_loop_with_observations_is_agent():
    msgs = {"messages": [
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{"function": {"name": "bash", "arguments": "{\"cmd\": \"pytest\"}"}}]},
        {"role": "tool", "content": "1 failed"},
        {"role": "assistant", "content": "Open the file.", "tool_calls": [{"function": {"name": "bash", "arguments": "{\"cmd\": \"cat a.py\"}"}}]},
        {"role": "tool", "content": "def f(): return 1"},
        {"role": "assistant", "content": "The bug is in f; I will edit it."}]}
    s = to_sample(msgs, "t", 0)
    assert RuleClassifier().classify(s.prompt, s.response).domain == "agent"


def test_smaller_label_set_falls_through():
    clf = RuleClassifier(labels=["coding", "general"])
    s = to_sample(SAMPLES["translation"], "t", 0)
    assert clf.classify(s.prompt, s.response).domain == "general"
    assert RuleClassifier(labels=["coding", "other"]).classify("", "").domain == "other"


def test_keyword_labels_come_first():
    clf = RuleClassifier(labels=["medical", "general", "other"], keyword_labels={"medical": [r"\bdiagnos\w*"]})
    label = clf.classify("What is the diagnosis for these symptoms?", "It could be a cold.")
    assert label.domain == "medical" and label.signals["keyword"].lower().startswith("diagnos")


def test_keyword_label_must_be_in_label_set():
    with pytest.raises(MixError, match="not in the label set"):
        RuleClassifier(labels=["general"], keyword_labels={"medical": ["x"]})


def test_empty_text_is_other():
    assert RuleClassifier().classify("", "   ").domain == "other"
