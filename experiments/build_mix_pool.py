"""Build the family-labelled pool for leave-one-family-out evaluation of the `flashdraft mix` classifier.

Writes ``src/flashdraft/mix/data/pool.jsonl``: real public samples from many *families* (a benchmark,
a data set, a format document, a translation catalog), each row with its ``label`` (what the source
item IS: the benchmark's own task, or its category field), its ``family`` and its ``origin``
(``github:owner/repo@commit:path#item``). Nothing is generated or paraphrased; texts are cut to
PROMPT_MAX / RESPONSE_MAX characters.

Inputs: bare git mirrors of the repositories below under ``--mirrors`` (``<owner>+<name>/repo``),
read with ``git show``; nothing is downloaded by this script.

    python experiments/build_mix_pool.py --mirrors MIRRORS_DIR

Families (domain: family <- repository):
  math:        cmath, olympiadbench, college-math, cn-middle-school, gaokao-math-qa, carp-en, mawps,
               minerva-math <- QwenLM/Qwen2.5-Math (evaluation/data); svamp <- arkilpatel/SVAMP; asdiv <- chaochun/nlu-asdiv-dataset; aqua <- google-deepmind/AQuA;
               theoremqa <- wenhuchen/TheoremQA; ape210k (Chinese) <- Chenny0808/ape210k;
               mgsm (10 languages) <- google-research/url-nlp; + category rows of mt-bench, belle-eval, wizardlm
  coding:      nl2bash <- TellinaTool/nl2bash; exercism-rust, exercism-go <- exercism/{rust,go};
               leetcode-doocs (zh/en) <- doocs/leetcode; mbppplus <- nlpxucan/WizardLM; + category rows
  general:     mt-bench, vicuna-bench <- lm-sys/FastChat; belle-eval (Chinese) <- LianjiaTech/BELLE;
               wizardlm <- nlpxucan/WizardLM; arena-hard <- lmarena/arena-hard-auto (creative_writing);
               hotpotqa, bamboogle (questions with answers) <- anchen1011/FireAct
  tool_calling: hermes-fc <- NousResearch/Hermes-Function-Calling; functionary <- MeetKai/functionary;
               llama-prompt-format <- meta-llama/llama-models; mistral-common <- mistralai/mistral-common;
               mcp-spec <- modelcontextprotocol/modelcontextprotocol; anthropic-cookbook <- anthropics/anthropic-cookbook;
               toolalpaca <- tangqiaoyu/ToolAlpaca
  agent:       react-prompts <- ysymyth/ReAct; reflexion <- noahshinn/reflexion; fireact <- anchen1011/FireAct;
               webarena <- web-arena-x/webarena; toolbench <- OpenBMB/ToolBench; mint <- xingyaoww/mint-bench
  translation: ntrex <- MicrosoftTranslator/NTREX; wmt22 <- wmt-conference/wmt22-news-systems;
               git-po <- git-l10n/git-po; sphinx-po <- sphinx-doc/sphinx; excalidraw <- excalidraw/excalidraw;
               anki-ftl <- ankitects/anki-core-i18n; keepassxc-ts <- keepassxreboot/keepassxc

The families of the older dev set (HumanEval, GSM8K, BFCL, SWE-agent, Django catalogs, package READMEs,
docstrings, agent prompt files of langchain/smolagents) are added by the evaluation from ``dev_set.jsonl`` (see experiments/mix_lofo.py). Translation rows
wrap a real source/target pair: a bare pair (source as prompt, translation as response) or one of the
request templates of experiments/build_mix_eval_set.py, named in ``origin``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import re
import subprocess
from collections import Counter
from pathlib import Path

PROMPT_MAX, RESPONSE_MAX = 2000, 1500
OUT = Path(__file__).resolve().parents[1] / "src/flashdraft/mix/data/pool.jsonl"
TEMPLATES = [("{src}", "bare_pair"), ("Translate to {lang}: {src}", "request"),
             ("{src}\n\nTranslate the text above into {lang}.", "request"), ("{src}", "bare_pair"),
             ("How do you say \"{src}\" in {lang}?", "how_do_you_say")]


class Repo:
    """A bare mirror read with git (HEAD)."""

    def __init__(self, root: Path, name: str):
        self.name, self.git = name, root / name.replace("/", "+") / "repo"
        self.head = self._run("rev-parse", "HEAD").strip()[:12]

    def _run(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", str(self.git), *args], capture_output=True, text=True,
                              check=True).stdout

    def show(self, path: str) -> str:
        return self._run("show", f"HEAD:{path}")

    def ls(self, pattern: str) -> list[str]:
        return sorted(p for p in self._run("ls-tree", "-r", "--name-only", "HEAD").split("\n") if re.search(pattern, p))

    def origin(self, path: str, item: str = "") -> str:
        return f"github:{self.name}@{self.head}:{path}" + (f"#{item}" if item else "")


def row(label: str, family: str, origin: str, prompt: str = "", response: str = "", messages=None, **extra) -> dict:
    r = {"messages": messages} if messages is not None else {"prompt": prompt[:PROMPT_MAX],
                                                               "response": response[:RESPONSE_MAX]}
    if messages is not None:
        r["messages"] = [{**m, "content": m["content"][:PROMPT_MAX] if isinstance(m.get("content"), str)
                          else m.get("content")} for m in messages]
    return {**r, **extra, "label": label, "family": family, "origin": origin}


def pick(items: list, k: int, rng: random.Random) -> list:
    items = list(items)
    return rng.sample(items, min(k, len(items)))


# ---- math ----------------------------------------------------------------------------------------
def math_families(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Repo(m, "arkilpatel/SVAMP")
    for x in pick(json.loads(r.show("SVAMP.json")), k, rng):
        out.append(row("math", "svamp", r.origin("SVAMP.json", x["ID"]), f"{x['Body']} {x['Question']}",
                       f"{x['Answer']:g}"))
    r = Repo(m, "chaochun/nlu-asdiv-dataset")
    probs = re.findall(r"<Problem ID=\"([\w-]+)\".*?<Body>(.*?)</Body>\s*<Question>(.*?)</Question>.*?<Answer>(.*?)"
                       r"</Answer>", r.show("dataset/ASDiv.xml"), re.S)
    for pid, body, q, ans in pick(probs, k, rng):
        out.append(row("math", "asdiv", r.origin("dataset/ASDiv.xml", pid), f"{body} {q}", ans))
    r = Repo(m, "google-deepmind/AQuA")
    lines = r.show("test.json").split("\n")
    for i in pick(range(len(lines)), k, rng):
        x = json.loads(lines[i])
        out.append(row("math", "aqua", r.origin("test.json", str(i)), x["question"] + "\n" + "\n".join(x["options"]),
                       x["rationale"]))
    r = Repo(m, "wenhuchen/TheoremQA")
    for x in pick([x for x in json.loads(r.show("theoremqa_test.json")) if not x.get("Picture")], k, rng):
        out.append(row("math", "theoremqa", r.origin("theoremqa_test.json", x["id"]), x["Question"], str(x["Answer"])))
    r = Repo(m, "Chenny0808/ape210k")
    lines = r.show("data/test.ape.json").split("\n")
    for i in pick(range(len(lines)), k, rng):
        x = json.loads(lines[i])
        out.append(row("math", "ape210k", r.origin("data/test.ape.json", x["id"]), x["original_text"],
                       x["equation"] if i % 2 else x["ans"]))
    r = Repo(m, "google-research/url-nlp")
    for path in r.ls(r"mgsm/mgsm_(?!en)\w+\.tsv$"):
        lines = [l for l in r.show(path).split("\n") if "\t" in l]
        for i in pick(range(len(lines)), max(2, k // 8), rng):
            q, a = lines[i].rsplit("\t", 1)
            out.append(row("math", "mgsm", r.origin(path, str(i)), q, a))
    r = Repo(m, "QwenLM/Qwen2.5-Math")
    for fam, name, q, a in (("cmath", "cmath", "question", "answer"), ("olympiadbench", "olympiadbench", "question",
                                                                        "final_answer"),
                            ("college-math", "college_math", "question", "answer"),
                            ("cn-middle-school", "cn_middle_school", "question", "answer"),
                            ("gaokao-math-qa", "gaokao_math_qa", "question", "label"),
                            ("carp-en", "carp_en", "content", "steps"), ("mawps", "mawps", "input", "target"),
                            ("minerva-math", "minerva_math", "problem", "solution")):
        path = f"evaluation/data/{name}/test.jsonl"
        lines = [l for l in r.show(path).split("\n") if l.strip()]
        for i in pick(range(len(lines)), k, rng):
            x = json.loads(lines[i])
            ans = x.get(a)
            ans = ", ".join(map(str, ans)) if isinstance(ans, list) else "" if ans is None else str(ans)
            qq = x[q] + ("\n" + "\n".join(f"{kk}. {vv}" for kk, vv in x["options"].items())
                         if isinstance(x.get("options"), dict) else "")
            out.append(row("math", fam, r.origin(path, str(i)), qq, ans))
    return out


# ---- coding --------------------------------------------------------------------------------------
def exercism_rows(r: Repo, solution: str, family: str, k: int, rng: random.Random) -> list[dict]:
    """Up to k practice exercises of an exercism track: the instructions (prose) and the example solution."""
    out = []
    names = sorted({p.split("/")[2] for p in r.ls(rf"^exercises/practice/[^/]+/{re.escape(solution)}$")})
    for name in pick(names, k, rng):
        base = f"exercises/practice/{name}"
        try:
            instr = r.show(f"{base}/.docs/instructions.md")
        except subprocess.CalledProcessError:
            continue
        out.append(row("coding", family, r.origin(f"{base}/{solution}"), instr, r.show(f"{base}/{solution}")))
    return out


def coding_families(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Repo(m, "TellinaTool/nl2bash")
    nl, cm = r.show("data/bash/all.nl").split("\n"), r.show("data/bash/all.cm").split("\n")
    for i in pick(range(min(len(nl), len(cm))), k, rng):
        out.append(row("coding", "nl2bash", r.origin("data/bash/all.nl", str(i)), nl[i], cm[i]))
    for lang, ext in (("rust", "rs"), ("go", "go")):
        out += exercism_rows(Repo(m, f"exercism/{lang}"), f".meta/example.{ext}", f"exercism-{lang}", k, rng)
    r = Repo(m, "doocs/leetcode")
    readmes = r.ls(r"^solution/0\d00-0\d99/[^/]+/README(_EN)?\.md$")
    for path in pick(readmes, k, rng):
        text = r.show(path)
        text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
        desc = text.split("## ", 2)
        body = text[text.find("## "):] if "## " in text else text
        parts = re.split(r"\n#{2,3} (?:解法|Solution)", body, maxsplit=1)
        problem = re.sub(r"<[^>]+>", "", parts[0]).strip()
        if len(parts) < 2:
            continue
        out.append(row("coding", "leetcode-doocs", r.origin(path), problem, parts[1].strip()))
        del desc
    r = Repo(m, "nlpxucan/WizardLM")
    d = json.loads(r.show("WizardCoder/data/mbppplus.json"))
    for key in pick(sorted(d), k, rng):
        out.append(row("coding", "mbppplus", r.origin("WizardCoder/data/mbppplus.json", key), d[key]))
    return out


# ---- mixed benchmarks with a category per item -----------------------------------------------------
MTBENCH = {"writing": "general", "roleplay": "general", "reasoning": "general", "extraction": "general",
           "stem": "general", "humanities": "general", "math": "math", "coding": "coding",
           "generic": "general", "knowledge": "general", "common-sense": "general", "fermi": "general",
           "counterfactual": "general"}
BELLE = {"code": "coding", "math": "math", "brainstorming": "general", "classification": "general",
         "closed qa": "general", "extract": "general", "generation": "general", "open qa": "general",
         "summarization": "general"}  # "rewrite" is left out: it mixes paraphrase and translation
WIZARDLM = {"Math": "math", "Code Generation": "coding", "Code Debug": "coding", "Writting": "general",
            "Reasoning": "general", "Common-Sense": "general", "Counterfactual": "general", "Roleplay": "general",
            "Biology": "general", "Technology": "general", "Ethics": "general", "Sport": "general", "Law": "general",
            "Medicine": "general", "Literature": "general", "Entertainment": "general", "Art": "general",
            "Music": "general", "Economy": "general", "Physics": "general", "History": "general",
            "Academic Writing": "general", "Chemistry": "general", "Philosophy": "general"}


def category_families(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Repo(m, "lm-sys/FastChat")
    for fam, path in (("mt-bench", "fastchat/llm_judge/data/mt_bench/question.jsonl"),
                      ("vicuna-bench", "fastchat/llm_judge/data/vicuna_bench/question.jsonl")):
        qs = [json.loads(l) for l in r.show(path).split("\n") if l.strip()]
        for dom in ("general", "math", "coding"):
            sel = [q for q in qs if MTBENCH.get(q["category"]) == dom]
            for q in pick(sel, k if dom == "general" else k // 2, rng):
                out.append(row(dom, fam, r.origin(path, str(q["question_id"])), q["turns"][0], category=q["category"]))
    r = Repo(m, "LianjiaTech/BELLE")
    d = [json.loads(l) for l in r.show("eval/eval_set.json").split("\n") if l.strip()]
    for dom in ("general", "math", "coding"):
        sel = [(i, x) for i, x in enumerate(d) if BELLE.get(x["class"]) == dom]
        for i, x in pick(sel, k if dom == "general" else k // 2, rng):
            out.append(row(dom, "belle-eval", r.origin("eval/eval_set.json", str(i)), x["question"], x["std_answer"],
                           category=x["class"]))
    r = Repo(m, "nlpxucan/WizardLM")
    qs = [json.loads(l) for l in r.show("WizardLM/data/WizardLM_testset.jsonl").split("\n") if l.strip()]
    for dom in ("general", "math", "coding"):
        sel = [q for q in qs if WIZARDLM.get(q["Skill"]) == dom]
        for q in pick(sel, k if dom == "general" else k // 2, rng):
            out.append(row(dom, "wizardlm", r.origin("WizardLM/data/WizardLM_testset.jsonl", str(q["idx"])),
                           q["Instruction"], category=q["Skill"]))
    r = Repo(m, "lmarena/arena-hard-auto")
    qs = [json.loads(l) for l in r.show("data/arena-hard-v2.0/question.jsonl").split("\n") if l.strip()]
    for q in pick([q for q in qs if q["category"] == "creative_writing"], k, rng):
        out.append(row("general", "arena-hard", r.origin("data/arena-hard-v2.0/question.jsonl", q["uid"]), q["prompt"],
                       category=q["category"]))
    r = Repo(m, "anchen1011/FireAct")
    d = json.loads(r.show("data/hotpotqa/dev.json"))
    items = d if isinstance(d, list) else list(d.values())
    for i in pick(range(len(items)), k, rng):
        x = items[i]
        q = x[0] if isinstance(x, list) else x.get("question")
        a = x[1] if isinstance(x, list) else x.get("answer", "")
        out.append(row("general", "hotpotqa", r.origin("data/hotpotqa/dev.json", str(i)), str(q), str(a)))
    rows = list(csv.reader(io.StringIO(r.show("data/bamboogle/test.csv"))))
    for i in pick(range(1, len(rows)), k, rng):
        out.append(row("general", "bamboogle", r.origin("data/bamboogle/test.csv", str(i)), rows[i][0], rows[i][1]))
    return out


# ---- tool calling --------------------------------------------------------------------------------
def _blocks(md: str) -> list[str]:
    return [b.strip("\n") for b in re.findall(r"```[\w-]*\n(.*?)```", md, re.S)]


def tool_families(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Repo(m, "NousResearch/Hermes-Function-Calling")
    for i, x in enumerate(json.loads(r.show("prompt_assets/few_shot.json"))):
        text = x["example"].strip("`\n")
        cut = text.find("<tool_call>")
        out.append(row("tool_calling", "hermes-fc", r.origin("prompt_assets/few_shot.json", str(i)),
                       text[:cut] if cut > 0 else text, text[cut:] if cut > 0 else ""))
    r = Repo(m, "MeetKai/functionary")
    for path in r.ls(r"^tests/prompt_test_[\w.\-]+\.txt$"):
        out.append(row("tool_calling", "functionary", r.origin(path), response=r.show(path)))
    for path in pick(r.ls(r"^tests/test_case[\w.\-]*\.json$"), k, rng):
        d = json.loads(r.show(path))
        if isinstance(d, dict) and isinstance(d.get("messages"), list):
            msgs = [mm for mm in d["messages"] if isinstance(mm, dict)]
            out.append(row("tool_calling", "functionary", r.origin(path), messages=msgs,
                           tools=d.get("tools") or d.get("functions")))
    r = Repo(m, "meta-llama/llama-models")
    for path in r.ls(r"^models/llama3_[123]/(text_)?prompt_format\.md$"):
        for i, b in enumerate(_blocks(r.show(path))):
            if re.search(r"<\|python_tag\|>|<function=|\"parameters\"|\[\w+\(", b) and "<|eom_id|>" in b or \
                    "<function=" in b or re.search(r"assistant<\|end_header_id\|>\s*\n*\[?\{?\"?\w+\(?", b) and "tool" in b:
                out.append(row("tool_calling", "llama-prompt-format", r.origin(path, f"block{i}"), response=b))
    r = Repo(m, "mistralai/mistral-common")
    for path in r.ls(r"^tests/data/samples/[^/]+/sample\.json$"):
        d = json.loads(r.show(path))
        if d.get("tools"):
            out.append(row("tool_calling", "mistral-common", r.origin(path), messages=d["messages"], tools=d["tools"]))
    for path in r.ls(r"^tests/data/samples/[^/]+/text_v3\.txt$"):
        t = r.show(path).replace("▁", " ")
        if "[TOOL_CALLS]" in t:
            out.append(row("tool_calling", "mistral-common", r.origin(path), response=t))
    r = Repo(m, "modelcontextprotocol/modelcontextprotocol")
    for path in r.ls(r"^docs/specification/[^/]+/server/tools\.mdx$"):
        for i, b in enumerate(_blocks(r.show(path))):
            if '"method": "tools/' in b or '"content": [' in b or '"tools": [' in b:
                out.append(row("tool_calling", "mcp-spec", r.origin(path, f"block{i}"), response=b))
    r = Repo(m, "anthropics/anthropic-cookbook")
    for path in r.ls(r"^tool_use/.*\.ipynb$"):
        nb = json.loads(r.show(path))
        for i, cell in enumerate(nb.get("cells", [])):
            for o in cell.get("outputs", []):
                text = "".join(o.get("text", []) or o.get("data", {}).get("text/plain", []))
                if re.search(r"ToolUseBlock|'type': 'tool_use'|\"type\": \"tool_use\"|tool_result", text):
                    out.append(row("tool_calling", "anthropic-cookbook", r.origin(path, f"cell{i}"), response=text))
    r = Repo(m, "tangqiaoyu/ToolAlpaca")
    for path in ("data/eval_real.json", "data/eval_simulated.json"):
        for api in json.loads(r.show(path)):
            for j, (ins, gold) in enumerate(zip(api.get("Instructions", []), api.get("Golden_Answers", []))):
                steps = "\n".join(f"Action: {g['Action']}\nAction Input: {g['Action_Input']}" for g in gold)
                out.append(row("tool_calling", "toolalpaca", r.origin(path, f"{api['Name']}/{j}"),
                               api.get("NLDocumentation", "")[:1200] + "\n\n" + ins, steps))
    return _cap(out, k, rng)


def _cap(rows: list[dict], k: int, rng: random.Random) -> list[dict]:
    """At most ``k`` rows per family (random, reproducible)."""
    by: dict[str, list[dict]] = {}
    for x in rows:
        by.setdefault(x["family"], []).append(x)
    return [x for fam in by for x in pick(by[fam], k, rng)]


# ---- agent ---------------------------------------------------------------------------------------
STEP = re.compile(r"\n(?=(?:Thought \d+:|Action \d+:|> |Action:|Thought:|Act \d+:))")


def _split_last_step(chunk: str) -> tuple[str, str]:
    cuts = [mt.start() for mt in STEP.finditer(chunk)]
    if len(cuts) < 2:
        return chunk, ""
    c = cuts[-1] if len(chunk) - cuts[-1] > 20 else cuts[-2]
    return chunk[:c], chunk[c + 1:]


def agent_families(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Repo(m, "ysymyth/ReAct")
    for path in r.ls(r"^prompts/.*\.json$"):
        for key, text in json.loads(r.show(path)).items():
            if not isinstance(text, str) or "Observation" not in text and "\n> " not in text:
                continue
            for i, chunk in enumerate(re.split(r"\n(?=Question:|Claim:|You are in the middle of a room)", text)):
                if chunk.count("Observation") + chunk.count("\n> ") >= 2:
                    p, resp = _split_last_step(chunk.strip())
                    out.append(row("agent", "react-prompts", r.origin(path, f"{key}/{i}"), p, resp))
    r = Repo(m, "noahshinn/reflexion")
    text = r.show("alfworld_runs/reflexion_few_shot_examples.txt")
    for i, chunk in enumerate(re.split(r"\n(?=You are in the middle of a room)", text)):
        if chunk.count("\n> ") >= 2:
            p, resp = _split_last_step(chunk.strip())
            out.append(row("agent", "reflexion", r.origin("alfworld_runs/reflexion_few_shot_examples.txt", str(i)),
                           p, resp))
    for path in r.ls(r"^hotpotqa_runs/root/ReAct/.*\.txt$")[:3]:
        for i, chunk in enumerate(re.split(r"\n(?=Question:)", r.show(path))[1:40]):
            if chunk.count("Observation") >= 2:
                p, resp = _split_last_step(chunk.strip())
                out.append(row("agent", "reflexion", r.origin(path, str(i)), p, resp))
    r = Repo(m, "anchen1011/FireAct")
    for path in ("data/finetune/gpt_format/multitask.jsonl",):
        lines = r.show(path).split("\n")
        for i in pick(range(len(lines)), 3 * k, rng):
            msgs = json.loads(lines[i])["messages"]
            last = max(j for j, mm in enumerate(msgs) if mm["role"] == "assistant")
            if last >= 2:
                out.append(row("agent", "fireact", r.origin(path, str(i)), messages=msgs[:last + 1]))
    r = Repo(m, "web-arena-x/webarena")
    import ast

    for path in r.ls(r"^agent/prompts/raw/p_.*\.py$"):
        src = r.show(path)
        d = ast.literal_eval(src[src.index("{"):src.rindex("}") + 1])
        for i, (obs, act) in enumerate(d.get("examples", [])):
            out.append(row("agent", "webarena", r.origin(path, f"example{i}"), d["intro"][:600] + "\n\n" + obs, act))
    r = Repo(m, "OpenBMB/ToolBench")
    for path in r.ls(r"^data_example/answer/G\d_answer/.*\.json$"):
        d = json.loads(r.show(path))
        tm = (d.get("answer_generation") or {}).get("train_messages") or []
        if tm:
            msgs = [{"role": mm["role"], "content": mm.get("content") or "",
                     **({"function_call": mm["function_call"]} if mm.get("function_call") else {})} for mm in tm[-1]]
            out.append(row("agent", "toolbench", r.origin(path), messages=msgs))
    r = Repo(m, "xingyaoww/mint-bench")
    for path in r.ls(r"^mint/tasks/in_context_examples/.*/with_tool\.txt$"):
        text = r.show(path)
        cuts = [mt.start() for mt in re.finditer(r"\nAssistant:", text)]
        if len(cuts) >= 2:
            out.append(row("agent", "mint", r.origin(path), text[:cuts[-1]], text[cuts[-1] + 1:]))
    return _cap(out, k, rng)


# ---- translation ---------------------------------------------------------------------------------
LANG = {"fr": "French", "de": "German", "es": "Spanish", "it": "Italian", "pt": "Portuguese", "ru": "Russian",
        "uk": "Ukrainian", "ja": "Japanese", "zh": "Chinese", "ko": "Korean", "ar": "Arabic", "he": "Hebrew",
        "hi": "Hindi", "el": "Greek", "tr": "Turkish", "pl": "Polish", "cs": "Czech", "vi": "Vietnamese",
        "th": "Thai", "sv": "Swedish", "nl": "Dutch", "bg": "Bulgarian", "ta": "Tamil", "hr": "Croatian",
        "en": "English", "fa": "Persian", "id": "Indonesian", "hu": "Hungarian", "ca": "Catalan"}


def pair_row(family: str, origin: str, src: str, tgt: str, tgt_lang: str, i: int) -> dict:
    tpl, name = TEMPLATES[i % len(TEMPLATES)]
    return row("translation", family, f"{origin}[{name}]", tpl.format(src=src, lang=LANG.get(tgt_lang, tgt_lang)), tgt)


def read_po(text: str) -> list[tuple[str, str]]:
    """(msgid, msgstr) pairs of a gettext catalog, skipping plurals, fuzzy entries and the header."""
    pairs = []
    for entry in text.split("\n\n"):
        if "#, fuzzy" in entry or "msgid_plural" in entry:
            continue
        mid = re.search(r'^msgid ((?:".*"\n?)+)', entry, re.M)
        mstr = re.search(r'^msgstr ((?:".*"\n?)+)', entry, re.M)
        if mid and mstr:
            un = lambda s: "".join(json.loads(x) for x in re.findall(r'^".*"$', s.strip(), re.M))
            try:
                a, b = un(mid.group(1)), un(mstr.group(1))
            except json.JSONDecodeError:
                continue
            if a and b and len(a.split()) >= 3:
                pairs.append((a, b))
    return pairs


def _flat(d, prefix=""):
    for key, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{key}.")
        elif isinstance(v, str):
            yield f"{prefix}{key}", v


def translation_families(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Repo(m, "MicrosoftTranslator/NTREX")
    src = r.show("NTREX-128/newstest2019-src.eng.txt").split("\n")
    for code, lang in (("fra", "fr"), ("deu", "de"), ("rus", "ru"), ("jpn", "ja"), ("zho-CN", "zh"), ("arb", "ar"),
                       ("hin", "hi"), ("kor", "ko"), ("heb", "he"), ("tha", "th"), ("vie", "vi"), ("tur", "tr")):
        ref = r.show(f"NTREX-128/newstest2019-ref.{code}.txt").split("\n")
        for i in pick(range(min(len(src), len(ref))), 3, rng):
            a, b, tl = (src[i], ref[i], lang) if i % 2 else (ref[i], src[i], "en")  # both directions
            out.append(pair_row("ntrex", r.origin(f"NTREX-128/newstest2019-ref.{code}.txt", str(i)), a, b, tl, i))
    r = Repo(m, "wmt-conference/wmt22-news-systems")
    for path in r.ls(r"^txt/sources/generaltest2022\.[a-z]+-[a-z]+\.src\.[a-z]+$"):
        pair = path.split(".")[1]
        s, t = pair.split("-")
        try:
            ref = r.show(f"txt/references/generaltest2022.{pair}.ref.A.{t}").split("\n")
        except subprocess.CalledProcessError:
            continue
        srcl = r.show(path).split("\n")
        for i in pick([i for i in range(min(len(srcl), len(ref))) if len(srcl[i].split()) >= 4 or s in ("ja", "zh")],
                      3, rng):
            out.append(pair_row("wmt22", r.origin(path, str(i)), srcl[i], ref[i], t, i))
    for fam, name, pattern, lang_of in (
            ("git-po", "git-l10n/git-po", r"^po/[a-z_A-Z]+\.po$", lambda p: p.split("/")[-1][:2]),
            ("sphinx-po", "sphinx-doc/sphinx", r"^sphinx/locale/[a-z_A-Z]+/LC_MESSAGES/sphinx\.po$",
             lambda p: p.split("/")[2][:2])):
        r = Repo(m, name)
        for path in pick(r.ls(pattern), 12, rng):
            pairs = read_po(r.show(path))
            for i in pick(range(len(pairs)), 3, rng):
                out.append(pair_row(fam, r.origin(path, str(i)), pairs[i][0], pairs[i][1], lang_of(path), i))
    r = Repo(m, "excalidraw/excalidraw")
    en = dict(_flat(json.loads(r.show("packages/excalidraw/locales/en.json"))))
    for path in pick([p for p in r.ls(r"^packages/excalidraw/locales/[a-z]{2}-[A-Z]{2}\.json$") if "en-" not in p],
                     12, rng):
        tr = dict(_flat(json.loads(r.show(path))))
        keys = [key for key in tr if key in en and len(en[key].split()) >= 4 and tr[key] != en[key]]
        for i, key in enumerate(pick(keys, 3, rng)):
            out.append(pair_row("excalidraw", r.origin(path, key), en[key], tr[key], path.split("/")[-1][:2], i))
    r = Repo(m, "ankitects/anki-core-i18n")
    ftl = lambda t: dict(re.findall(r"^([\w-]+) = (.+)$", t, re.M))
    for path in pick([p for p in r.ls(r"^core/[\w-]+/[\w-]+\.ftl$") if "/templates/" not in p and "/en-" not in p],
                     40, rng):
        try:
            en = ftl(r.show("core/templates/" + path.split("/")[-1]))
        except subprocess.CalledProcessError:
            continue
        tr = ftl(r.show(path))
        keys = [key for key in tr if key in en and len(en[key].split()) >= 4 and "{" not in en[key]]
        for i, key in enumerate(pick(keys, 1, rng)):
            out.append(pair_row("anki-ftl", r.origin(path, key), en[key], tr[key], path.split("/")[1][:2], i))
    r = Repo(m, "keepassxreboot/keepassxc")
    for path in pick(r.ls(r"^share/translations/keepassxc_[a-z]{2}(_[A-Z]{2})?\.ts$"), 12, rng):
        pairs = [(a, b) for a, b in re.findall(r"<source>(.*?)</source>\s*<translation>(.*?)</translation>",
                                               r.show(path), re.S) if len(a.split()) >= 4 and b and a != b]
        unesc = lambda s: s.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"') \
            .replace("&apos;", "'")
        for i in pick(range(len(pairs)), 3, rng):
            out.append(pair_row("keepassxc-ts", r.origin(path, str(i)), unesc(pairs[i][0]), unesc(pairs[i][1]),
                                path.split("_")[-1][:2], i))
    return _cap(out, k, rng)


def run_builders(builders, mirrors: Path, rng: random.Random, k: int) -> list[dict]:
    """The rows of every family builder, in order (one rng for all, so a seed gives the same pool)."""
    rows = []
    for build in builders:
        got = build(mirrors, rng, k)
        print(f"{build.__name__}: {len(got)} rows")
        rows += got
    return rows


def unique(rows: list[dict], seen: set[str] | None = None) -> list[dict]:
    """``rows`` less those whose content (all but origin, family and category) is already in ``seen`` or earlier
    in ``rows``; ``seen`` is updated."""
    seen = set() if seen is None else seen
    out = []
    for x in rows:
        key = json.dumps({k: v for k, v in x.items() if k not in ("origin", "family", "category")}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def print_counts(rows: list[dict]) -> None:
    for (fam, lab), n in sorted(Counter((x["family"], x["label"]) for x in rows).items(), key=lambda t: t[0][1]):
        print(f"  {lab:<13} {fam:<22} {n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirrors", type=Path, required=True)
    ap.add_argument("--per-family", type=int, default=30)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rows = run_builders((math_families, coding_families, category_families, tool_families, agent_families,
                         translation_families), a.mirrors, rng, a.per_family)
    uniq = unique(rows)
    a.out.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in uniq))
    print_counts(uniq)
    print(f"wrote {len(uniq)} rows to {a.out}")


if __name__ == "__main__":
    main()
