"""Add families from repositories the pool had never drawn on, chosen where the classifier missed on unseen sources.

Appends to ``src/flashdraft/mix/data/pool.jsonl`` (rows of these families already there are replaced; the rest is
kept as it is), in the same layout and with the same rules as ``experiments/build_mix_pool.py``: real public
samples, nothing generated or paraphrased, texts cut to PROMPT_MAX / RESPONSE_MAX characters, every row with its
``label`` (what the source item IS), ``family`` and ``origin`` (``github:owner/repo@commit:path#item``).

    python experiments/extend_mix_pool.py --mirrors MIRRORS_DIR

Families (domain: family <- repository, licence; the miss pattern each one covers):
  coding:      sql-eval <- defog-ai/sql-eval (Apache-2.0; text-to-SQL questions naming only the database);
               nl-rx <- nicholaslocascio/deep-regex (MIT; a regular expression asked for in English);
               nl-to-cf, codefusion-python <- microsoft/prose-benchmarks (MIT; a spreadsheet formatting formula asked
               for in English; one-line Python asked for in English);
               exercism-python, exercism-js <- exercism/{python,javascript} (MIT; a coding request in prose);
               codealpaca <- sahil280114/codealpaca (Apache-2.0 data; requests whose answer is often prose);
               odex <- zorazrw/odex (CC-BY-SA-4.0; Python requests in Spanish, Japanese, Russian and English);
               js-interview, react-interview <- sudheerj/{javascript,reactjs}-interview-questions (no licence file /
               MIT; questions about a language answered mostly in prose, two thirds of them with no code block)
  math:        multiarith, singleeq, addsub <- kojima-takeshi188/zero_shot_cot (MIT; short word problems);
               math-tora, gsm-hard <- microsoft/ToRA (MIT; MATH problems phrased as lookups, "how many ...");
               tabmwp <- lupantech/PromptPG (CC-BY-NC-SA-4.0; a question over a table)
  general:     folio <- Yale-LILY/FOLIO (CC-BY-SA-4.0; natural-language reasoning, "true, false or unknown")
  translation: fastapi-docs <- fastapi/fastapi (MIT); vuepress-docs <- vuejs/vuepress (MIT); hexo-docs <- hexojs/site
               (CC-BY-4.0) (technical documentation with code blocks, paired section by section);
               python-docs-fr, python-docs-es <- python/python-docs-{fr,es} (CC0 / PSF; catalog entries with inline
               identifiers and roles such as :func:)
  agent:       taskweaver <- microsoft/TaskWeaver (MIT; a planner delegating to a code interpreter, no ReAct markers);
               mini-swe-agent <- SWE-agent/mini-swe-agent (MIT; a bash loop whose observations are user turns)
  tool_calling: hugginggpt <- microsoft/JARVIS (MIT; a task plan of tool calls with no schema in the conversation)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import re
import subprocess
import textwrap
from pathlib import Path

import yaml

from build_mix_pool import (OUT, RESPONSE_MAX, Repo, exercism_rows, pair_row, pick, print_counts, read_po, row,
                            run_builders, unique)


class Mirror(Repo):
    """A mirror that may be a work tree's ``.git`` and may read another branch than HEAD."""

    def __init__(self, root: Path, name: str, ref: str = "HEAD"):
        git = root / name.replace("/", "+") / "repo"
        self.ref = ref
        self.name, self.git = name, git / ".git" if (git / ".git").is_dir() else git
        self.head = self._run("rev-parse", ref).strip()[:12]

    def show(self, path: str) -> str:
        return self._run("show", f"{self.ref}:{path}")

    def ls(self, pattern: str) -> list[str]:
        return sorted(p for p in self._run("ls-tree", "-r", "--name-only", self.ref).split("\n") if re.search(pattern, p))


def coding(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Mirror(m, "defog-ai/sql-eval")
    for path in r.ls(r"^data/questions_gen_(postgres|sqlite|mysql)\.csv$"):
        rows = list(csv.DictReader(io.StringIO(r.show(path))))
        for i in pick(range(len(rows)), k // 3, rng):
            x = rows[i]
            ask = x["question"] + (f"\n{x['instructions']}" if x.get("instructions") else "") + \
                f" (database: {x['db_name']})"
            out.append(row("coding", "sql-eval", r.origin(path, str(i)), ask, x["query"]))
    r = Mirror(m, "nicholaslocascio/deep-regex")
    src, tgt = r.show("datasets/NL-RX-Turk/src.txt").split("\n"), r.show("datasets/NL-RX-Turk/targ.txt").split("\n")
    for i in pick(range(min(len(src), len(tgt))), k, rng):
        if src[i].strip():
            out.append(row("coding", "nl-rx", r.origin("datasets/NL-RX-Turk/src.txt", str(i)), src[i], tgt[i]))
    r = Mirror(m, "microsoft/prose-benchmarks")
    cf = json.loads(r.show("ConditionalFormatting/Benchmarks/NLToCF/Benchmarks.json"))
    for i in pick(range(len(cf)), k // 2, rng):
        out.append(row("coding", "nl-to-cf", r.origin("ConditionalFormatting/Benchmarks/NLToCF/Benchmarks.json", str(i)),
                       cf[i]["query"], cf[i]["code"]))
    py = json.loads(r.show("CodeFusion/Benchmarks/PythonBenchmarks.json"))
    items = [x for part in py.values() for x in part]
    for i in pick(range(len(items)), k // 2, rng):
        out.append(row("coding", "codefusion-python", r.origin("CodeFusion/Benchmarks/PythonBenchmarks.json",
                                                               str(items[i]["ID"])),
                       items[i]["NL Utterance"], items[i]["Code"]))
    for lang, solution, fam in (("python", ".meta/example.py", "exercism-python"),
                                ("javascript", ".meta/proof.ci.js", "exercism-js")):
        out += exercism_rows(Mirror(m, f"exercism/{lang}"), solution, fam, k, rng)
    r = Mirror(m, "sahil280114/codealpaca")
    data = json.loads(r.show("data/code_alpaca_2k.json"))
    for i in pick(range(len(data)), k, rng):
        x = data[i]
        out.append(row("coding", "codealpaca", r.origin("data/code_alpaca_2k.json", str(i)),
                       x["instruction"] + (f"\n{x['input']}" if x.get("input") else ""), x["output"]))
    for name, fam in (("sudheerj/javascript-interview-questions", "js-interview"),
                      ("sudheerj/reactjs-interview-questions", "react-interview")):
        r = Mirror(m, name)
        qa = []
        for q, a in re.findall(r"^\s*\d+\.\s+### (.+?)\n(.*?)(?=\*\*\[⬆ Back to Top\]|^\s*\d+\.\s+### )", r.show("README.md"),
                               re.S | re.M):
            a = textwrap.dedent(a).strip()
            if len(a) >= 80:
                qa.append((q.strip(), a))
        prose = [x for x in qa if "```" not in x[1]]  # answered in prose first, as the misses were
        chosen = pick(prose, k * 2 // 3, rng)
        chosen += pick([x for x in qa if x not in chosen], k - len(chosen), rng)
        for q, a in chosen:
            out.append(row("coding", fam, r.origin("README.md", q[:60]), q if q.endswith("?") else q + "?", a))
    r = Mirror(m, "zorazrw/odex")
    for lang in ("es", "ja", "ru", "en"):
        path = f"data/{lang}_test.jsonl"
        lines = [json.loads(l) for l in r.show(path).split("\n") if l.strip()]
        for x in pick(lines, k // 4, rng):
            code = x["prompt"] + x["canonical_solution"] + x["suffix"]
            out.append(row("coding", "odex", r.origin(path, str(x["task_id"])), x["intent"], code))
    return out


def math(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Mirror(m, "kojima-takeshi188/zero_shot_cot")
    for fam, path in (("multiarith", "dataset/MultiArith/MultiArith.json"), ("singleeq", "dataset/SingleEq/questions.json"),
                      ("addsub", "dataset/AddSub/AddSub.json")):
        for x in pick(json.loads(r.show(path)), k // 3, rng):
            out.append(row("math", fam, r.origin(path, str(x["iIndex"])), x["sQuestion"].strip(),
                           f"{x['lEquations'][0]}\n{float(x['lSolutions'][0]):g}"))
    r = Mirror(m, "microsoft/ToRA")
    lines = [json.loads(l) for l in r.show("src/data/math/test.jsonl").split("\n") if l.strip()]
    for x in pick(lines, k, rng):
        out.append(row("math", "math-tora", r.origin("src/data/math/test.jsonl", str(x["idx"])), x["problem"],
                       x["solution"]))
    lines = [json.loads(l) for l in r.show("src/data/gsm-hard/test.jsonl").split("\n") if l.strip()]
    for i, x in enumerate(pick(lines, k // 2, rng)):
        out.append(row("math", "gsm-hard", r.origin("src/data/gsm-hard/test.jsonl", str(lines.index(x))), x["input"],
                       x.get("code", "") if i % 2 else str(x.get("target", ""))))
    r = Mirror(m, "lupantech/PromptPG")
    probs = json.loads(r.show("data/tabmwp/problems_test1k.json"))
    for pid in pick(sorted(probs), k, rng):
        x = probs[pid]
        ask = (f"{x['table_title']}\n" if x.get("table_title") else "") + x["table"] + "\n\n" + x["question"] + (
            "\n" + "\n".join(x["choices"]) if x.get("choices") else "")
        out.append(row("math", "tabmwp", r.origin("data/tabmwp/problems_test1k.json", pid), ask,
                       x.get("solution") or x["answer"]))
    return out


def general(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Mirror(m, "Yale-LILY/FOLIO")
    path = "data/v0.0/folio-validation.jsonl"
    lines = [json.loads(l) for l in r.show(path).split("\n") if l.strip()]
    for i in pick(range(len(lines)), k, rng):
        x = lines[i]
        ask = "\n".join(x["premises"]) + f"\n\nIs the following true, false or unknown? {x['conclusion']}"
        out.append(row("general", "folio", r.origin(path, str(i)), ask, str(x["label"])))
    return out


def _sections(md: str) -> list[str]:
    """Level-2 sections of a Markdown page (front matter dropped)."""
    md = re.sub(r"\A---\n.*?\n---\n", "", md, flags=re.S)
    return [s.strip() for s in re.split(r"\n(?=## )", md) if s.strip()]


def _doc_pairs(r: Mirror, family: str, pairs: list[tuple[str, str, str]], k: int, rng: random.Random) -> list[dict]:
    """Rows from (English page, translated page, language) triples, sections paired by position where both pages
    have the same number of sections and the code blocks match; sections with code are preferred."""
    cands = []
    for en_path, tr_path, lang in pairs:
        try:
            en, tr = _sections(r.show(en_path)), _sections(r.show(tr_path))
        except subprocess.CalledProcessError:
            continue
        if len(en) != len(tr) or len(en) < 2:
            continue
        for j, (a, b) in enumerate(zip(en, tr)):
            if a.count("```") == b.count("```") and 80 <= len(a) <= 1500 and a != b:
                cands.append((("```" in a or "`" in a), tr_path, j, a, b, lang))
    with_code = [c for c in cands if c[0]]
    chosen = pick(with_code, k, rng)
    chosen += pick([c for c in cands if not c[0]], k - len(chosen), rng)
    return [pair_row(family, r.origin(tr_path, f"section-{j}"), a, b[:RESPONSE_MAX], lang, i)
            for i, (_, tr_path, j, a, b, lang) in enumerate(chosen)]


def translation(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Mirror(m, "fastapi/fastapi")
    trs = [p for p in r.ls(r"^docs/(es|zh|ja|pt|ru|ko|de|fr|tr|uk)/docs/.+\.md$") if "/img/" not in p]
    triples = [(re.sub(r"^docs/\w+/", "docs/en/", p), p, p.split("/")[1]) for p in pick(trs, 60, rng)]
    out += _doc_pairs(r, "fastapi-docs", triples, k, rng)
    r = Mirror(m, "vuejs/vuepress")
    trs = r.ls(r"^packages/docs/docs/zh/.+\.md$")
    out += _doc_pairs(r, "vuepress-docs", [(p.replace("/docs/zh/", "/docs/"), p, "zh") for p in trs], k, rng)
    r = Mirror(m, "hexojs/site")
    trs = r.ls(r"^source/(zh-cn|zh-tw|ja|ko|ru|pt-br|th)/docs/.+\.md$")
    triples = [(re.sub(r"^source/[\w-]+/docs/", "source/docs/", p), p, p.split("/")[1][:2]) for p in pick(trs, 60, rng)]
    out += _doc_pairs(r, "hexo-docs", triples, k, rng)
    for fam, ref, lang in (("python-docs-fr", "3.13", "fr"), ("python-docs-es", "3.12", "es")):
        r = Mirror(m, f"python/{fam}", ref)
        pairs = []
        for path in pick(r.ls(r"^(library|tutorial|howto|reference)/.+\.po$"), 25, rng):
            pairs += [(path, a, b) for a, b in read_po(r.show(path)) if re.search(r"``|:\w+:`", a) and a != b]
        for i, (path, a, b) in enumerate(pick(pairs, k, rng)):
            out.append(pair_row(fam, r.origin(path, str(i)), a, b, lang, i))
    return out


def _taskweaver_rows(r: Mirror, path: str) -> list[dict]:
    """Conversation cuts of one TaskWeaver example: the agent's posts are assistant turns (the planner's, or the code
    interpreter's with its code), every other post a user turn; one row per agent post after the first."""
    ex = yaml.safe_load(r.show(path))
    agent = "CodeInterpreter" if "codeinterpreter" in path else "Planner"
    msgs = []
    for rnd in ex.get("rounds", []):
        for post in rnd.get("post_list", []):
            text = post.get("message") or ""
            for att in post.get("attachment_list") or []:
                if att.get("type") in ("thought", "reply_content", "execution_result") and att.get("content"):
                    text += "\n" + str(att["content"])
            msgs.append({"role": "assistant" if post.get("send_from") == agent else "user", "content": text.strip()})
    return loop_cuts(msgs, "taskweaver", r, path)


def loop_cuts(msgs: list[dict], family: str, r: Mirror, path: str) -> list[dict]:
    """One agent row per assistant turn that follows an earlier one (the conversation up to it): a loop's steps."""
    starts = [i for i, x in enumerate(msgs) if x["role"] == "assistant"]
    return [row("agent", family, r.origin(path, str(i)), messages=msgs[:i + 1]) for i in starts[1:]]


def agent(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Mirror(m, "microsoft/TaskWeaver")
    for path in r.ls(r"examples/.+\.yaml$"):
        out += _taskweaver_rows(r, path)
    out = pick(out, k, rng)
    r = Mirror(m, "SWE-agent/mini-swe-agent")
    for path in r.ls(r"\.traj\.json$"):
        d = json.loads(r.show(path))
        msgs = [{"role": x["role"], "content": x["content"] if isinstance(x["content"], str) else json.dumps(x["content"])}
                for x in (d["messages"] if isinstance(d, dict) else d) if x.get("role") != "system"]
        out += loop_cuts(msgs, "mini-swe-agent", r, path)
    return out


def tool_calling(m: Path, rng: random.Random, k: int) -> list[dict]:
    out = []
    r = Mirror(m, "microsoft/JARVIS")
    for path in r.ls(r"^hugginggpt/server/demos/demo_parse_task\.json$"):
        msgs = json.loads(r.show(path))
        for i, msg in enumerate(msgs):
            if msg["role"] == "assistant":
                out.append(row("tool_calling", "hugginggpt", r.origin(path, str(i)), msgs[i - 1]["content"],
                               msg["content"]))
    return out


FAMILIES = (coding, math, general, translation, agent, tool_calling)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirrors", type=Path, required=True)
    ap.add_argument("--per-family", type=int, default=30)
    ap.add_argument("--pool", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    new = run_builders(FAMILIES, a.mirrors, rng, a.per_family)
    fams = {x["family"] for x in new}
    kept = [json.loads(l) for l in a.pool.read_text().split("\n") if l.strip()]
    seen: set[str] = set()
    kept = unique([x for x in kept if x.get("family") not in fams], seen)
    added = unique(new, seen)
    a.pool.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in kept + added))
    print_counts(added)
    print(f"kept {len(kept)} rows, added {len(added)} from {len({x['origin'].split('@')[0] for x in added})} "
          f"repositories -> {a.pool}")


if __name__ == "__main__":
    main()
