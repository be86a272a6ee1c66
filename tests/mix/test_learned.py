"""The learned head, its evidence gates, per-turn precedence and confusion-corrected shares."""

import numpy as np
import pytest

from flashdraft.mix.correct import corrected_shares
from flashdraft.mix.domains import MixError
from flashdraft.mix.features import numeric_features, turn_evidence
from flashdraft.mix.learned import LearnedClassifier, evidence_gates, structural_label
from flashdraft.mix.records import Sample, to_sample

from .conftest import SAMPLES


def _train(samples, gold):
    clf = LearnedClassifier(["coding", "general"], [], np.zeros((0, 2), np.float32), np.zeros(2, np.float32),
                            np.zeros(0))
    feats = [(numeric_features(sig), toks)
             for _, sig, toks in clf.features(samples)]
    return LearnedClassifier.fit(feats, gold, max_tokens=200)


def test_fit_save_load_classify_with_evidence(tmp_path):
    code = [Sample("s", str(i), f"Write a function number {i}.", f"def f{i}(x):\n    return x + {i}\n")
            for i in range(12)]
    prose = [Sample("s", str(i), f"Tell me about topic {i}.", "It is a pleasant subject that many people enjoy "
                    "reading about in the evening.") for i in range(12)]
    clf = _train(code + prose, ["coding"] * 12 + ["general"] * 12)
    clf.meta = {"note": "test"}
    clf.save(tmp_path / "head.npz")
    back = LearnedClassifier.load(tmp_path / "head.npz")
    assert back.meta == {"note": "test"} and back.names == clf.names
    labs = back.classify_batch([Sample("s", "a", "Write a function.", "def g(y):\n    return y * 2\n"),
                                Sample("s", "b", "Tell me about cats.", "Cats are calm animals that many people "
                                       "like to keep at home.")])
    assert [l.domain for l in labs] == ["coding", "general"]
    assert labs[0].rule == "learned_head" and labs[0].signals["p_coding"] > 0.5 and labs[0].signals["evidence"]


def test_shipped_head_labels_each_domain():
    clf = LearnedClassifier.load()
    for domain, row in SAMPLES.items():
        s = to_sample(row, "t", 0)
        assert clf.classify(s.prompt, s.response).domain == domain, domain


def test_formats_named_in_the_issue():
    clf = LearnedClassifier.load()
    bash = clf.classify("How do I count the lines of every Python file under this folder?",
                        "find . -name '*.py' | xargs wc -l")
    assert bash.domain == "coding", bash  # a one-liner after an English question is not a translation
    llama = clf.classify("What is the weather in Tokyo?", '<function=get_weather>{"city": "Tokyo"}</function>')
    assert llama.domain == "tool_calling" and llama.rule == "answer_is_tool_call"
    react = ("Question: Who directed Alien?\nThought 1: I need to search Alien.\nAction 1: Search[Alien film]\n"
             "Observation 1: Alien is a 1979 film directed by Ridley Scott.\nThought 2: The answer is Ridley Scott.")
    assert clf.classify(react, "Action 2: Finish[Ridley Scott]").domain == "agent"


def test_smaller_label_set_and_bad_head(tmp_path):
    clf = LearnedClassifier.load(labels=["coding", "general", "other"])
    s = to_sample(SAMPLES["translation"], "t", 0)
    assert clf.classify(s.prompt, s.response).domain in ("coding", "general")
    assert clf.classify("", "  ").domain == "other"
    with pytest.raises(MixError, match="does not exist"):
        LearnedClassifier.load(tmp_path / "none.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a head")
    with pytest.raises(MixError, match="not a learned head"):
        LearnedClassifier.load(tmp_path / "bad.npz")


def test_per_turn_precedence():
    loop = {"messages": [
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "Run it.", "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "content": "1 failed"},
        {"role": "assistant", "content": "Open it.", "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "content": "def f(): return 1"},
        {"role": "assistant", "content": "```python\ndef f():\n    return 2\n```"}]}
    s = to_sample(loop, "t", 0)
    ev = turn_evidence(s.prompt, s.response)
    assert ev["loop_observations"] == 2 and ev["assistant_turns"] == 3
    assert structural_label(ev) == ("agent", "turns_action_observation_loop")  # an agent that writes code
    # one call, its result and a user turn in between: a chat with tools, not an agent loop
    chat = {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": "{}"}}]}]}
    s = to_sample(chat, "t", 0)
    assert structural_label(turn_evidence(s.prompt, s.response)) == ("tool_calling", "answer_is_tool_call")


def test_evidence_gates():
    assert not evidence_gates({"prompt_script": "latin", "response_script": "latin"})["translation"]
    assert evidence_gates({"translate_request": 1})["translation"]
    assert not evidence_gates({"translate_request": 0, "two_scripts": 1, "code_fences": 2})["translation"]
    assert not evidence_gates({"ask_numbers": 0})["math"] and evidence_gates({"ask_numbers": 3})["math"]


def test_corrected_shares_undo_a_known_confusion():
    # a classifier that labels 20% of true coding as general: observed 40/60 means 50/50 in truth
    confusion = {"coding": {"coding": 800, "general": 200}, "general": {"general": 1000}}
    out = corrected_shares({"coding": 400, "general": 600}, confusion, draws=200)
    assert out["coding"]["raw"] == pytest.approx(0.4)
    assert out["coding"]["corrected"] == pytest.approx(0.5, abs=0.01)
    assert out["coding"]["low"] < 0.5 < out["coding"]["high"]
    assert sum(v["corrected"] for v in out.values()) == pytest.approx(1.0)


def test_notation_answers_are_code():
    """A regular expression or a spreadsheet formula asked for in English is coding, though the ask is prose."""
    from flashdraft.mix.classify import RuleClassifier

    rules = RuleClassifier()
    regex = rules.classify("lines that contain a word ending in 'er' followed by a number", r"\b\w+er\b.*[0-9].*")
    formula = rules.classify("Highlight the rows where sales are above the average of the column",
                             "=AND($C2>AVERAGE($C$2:$C$50),$C2<>\"\")")
    prose = rules.classify("What should I name my cat?", "Whiskers is a classic name (short and easy to call).")
    assert (regex.domain, regex.rule) == ("coding", "notation_answer")
    assert (formula.domain, formula.rule) == ("coding", "notation_answer")
    assert prose.domain == "general"


DOC_EN = ("## Install\n\nYou can install the package with pip, and then you run the server with the command below "
          "and open the browser at the address it prints.\n\n```bash\npip install fastapi\nfastapi dev main.py\n```\n")
DOC_ES = ("## Instalar\n\nPuedes instalar el paquete con pip, y luego ejecutas el servidor con el comando de abajo y "
          "abres el navegador en la dirección que imprime.\n\n```bash\npip install fastapi\nfastapi dev main.py\n```\n")


def test_translated_documentation_with_code_may_be_translation():
    """Code blocks on both sides used to close the translation gate; the prose around them decides now."""
    from flashdraft.mix.features import format_signals

    switched = format_signals(DOC_EN, DOC_ES)
    same = format_signals(DOC_EN, DOC_EN.replace("Install", "Setup"))
    assert switched["prose_script_switch"] == 1 and same["prose_script_switch"] == 0
    gates = lambda f: evidence_gates({"code_fences": 2, "prompt_script": "latin", "response_script": "latin", **f})
    assert gates(switched)["translation"] and not gates(same)["translation"]
    zh = format_signals(DOC_EN, "## 安装\n\n你可以用 pip 安装这个包，然后用下面的命令运行服务器，并在浏览器中打开它打印的地址。\n\n"
                                "```bash\npip install fastapi\n```\n")
    assert zh["prose_script_switch"] == 1


def test_report_gives_the_repository_figure_and_corrects_with_its_confusion():
    """mix report prints leave-one-repository-out next to the family figure, and corrects shares with the
    confusion measured on unseen repositories."""
    from flashdraft.mix.correct import quality_of
    from flashdraft.mix.report import _quality_lines

    fig = lambda acc, conf: {"accuracy": acc, "recall": {"coding": acc, "general": acc}, "families": 3, "rows": 10,
                             "repositories": 4, "confusion": conf,
                             "interval": {"accuracy": [acc - 0.1, acc + 0.05], "recall": {"coding": [0.5, 1.0]}}}
    lofo_conf = {"coding": {"coding": 5}, "general": {"general": 5}}
    loro_conf = {"coding": {"coding": 4, "general": 1}, "general": {"general": 5}}
    clf = type("Head", (), {"method": "learned", "meta": {"lofo": fig(0.9, lofo_conf), "loro": fig(0.8, loro_conf)}})()
    q = quality_of(clf)
    assert q["confusion"] == loro_conf and q["loro_accuracy"] == 0.8
    text = "\n".join(_quality_lines({"classifier": q, "corrected_shares": {}, "method": "learned"}))
    assert "leave-one-family-out accuracy 0.900" in text
    assert "Leave-one-repository-out accuracy 0.800** (0.70-0.85)" in text and "coding 0.80 (0.50-1.00)" in text
    old = type("Head", (), {"method": "learned", "meta": {"lofo": fig(0.9, lofo_conf)}})()
    q_old = quality_of(old)
    assert q_old["confusion"] == lofo_conf
    assert "repository" not in "\n".join(_quality_lines({"classifier": q_old, "corrected_shares": {}}))
