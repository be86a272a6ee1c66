"""Cheap features of one sample for the learned domain head: rule signals, per-turn evidence, token counts.

Three groups, all computed from the same clipped text the rules read:

* **signals**: every count of :class:`~flashdraft.mix.classify.RuleClassifier` plus the format signals of
  :mod:`flashdraft.mix.signals` (tool-call syntaxes, numbered ReAct steps, equation lines...), log-scaled;
* **turns**: what the assistant does across turns (see :func:`turn_evidence`);
* **tokens**: lower-cased words, digits, punctuation pairs and single non-Latin characters of the ask
  (end of the prompt) and of the response, in two namespaces (``p:``/``r:``), looked up in a vocabulary
  chosen at training time (unknown tokens are dropped; no hashing, so features are stable across runs).
"""

from __future__ import annotations

import math
import re

from flashdraft.mix import signals as S

TOKEN = re.compile(r"[a-zà-ÿ]+|\d|[^\w\s]{1,2}")
ASK_CHARS, RESPONSE_CHARS = 1200, 1200
MAX_TURN_CHARS = 20000  # turn evidence reads the last 20,000 characters of a conversation
NUMBER = S.NUMBER
TURN = re.compile(r"^<\|(\w+)\|>\n", re.M)
OBS_USER = re.compile(r"^\s*(?:Observation|OBSERVATION|Obs\b|The output of|Tool (?:result|output)|Execution|"
                      r"Output:|Result:|\[?tool_result|You (?:are in|arrive|see|pick|open)|Nothing happens)")
SCRIPTS = ("latin", "cjk", "cyrillic", "hangul", "arabic", "other")
RULE_DOMAINS = ("coding", "math", "general", "tool_calling", "agent", "translation", "other")


def _acts(text: str) -> bool:
    """Whether an assistant turn acts: a tool call in any known syntax, a command, or an ``Action:`` line."""
    return bool(S.TOOL_FORMAT.search(text) or S.CALL.search(text) or S.ACTION.search(text)
                or S.NUMBERED_STEP.search(text))


def turn_evidence(prompt: str, response: str) -> dict[str, int]:
    """Per-turn evidence of a conversation rendered by :mod:`flashdraft.mix.records` (``<|role|>`` markers).

    ``assistant_turns`` counts the answer too; ``observation_turns`` counts tool turns, user turns that read
    like an environment's output, and user turns that answer an assistant action; ``call_turns`` counts
    assistant turns (the answer included) that act; ``response_acts`` says whether the answer itself acts.
    """
    parts = TURN.split(prompt[-MAX_TURN_CHARS:]) if "<|" in prompt else [prompt]
    assistant = 1 if response.strip() else 0
    obs = obs_user = calls = 0
    run = longest = 0  # observations since the last real user turn (an autonomous loop), and the longest run
    acted = False
    for i in range(1, len(parts) - 1, 2):
        role, body = parts[i], parts[i + 1][:3000]
        if role == "assistant":
            assistant += 1
            acted = _acts(body)
            calls += acted
        elif role == "tool":
            obs += 1
            run += 1
        elif role == "user" and (acted or OBS_USER.match(body)):
            obs_user += 1
            run += 1
            acted = False
        elif role == "user":
            run = 0
        longest = max(longest, run)
    response_acts = _acts(response[:3000])
    return {"assistant_turns": assistant, "observation_turns": obs + obs_user, "call_turns": calls + response_acts,
            "loop_observations": longest, "current_loop": run,
            "user_obs_turns": obs_user, "response_acts": int(response_acts),
            "response_tool_call": int(bool(S.TOOL_FORMAT.search(response[:3000]) or S.CALL.search(response[:3000])))}


def format_signals(prompt: str, response: str) -> dict[str, int]:
    """Counts of the format signals of :mod:`flashdraft.mix.signals` over the clipped prompt and response."""
    text = prompt + "\n" + response
    tool_resp = len(S.TOOL_FORMAT.findall(response))
    steps = "Thought" in text or "Action" in text or "Observation" in text or "Act " in text or "Obs " in text
    return {
        "tool_format": len(S.TOOL_FORMAT.findall(prompt)) + tool_resp,
        "tool_format_response": tool_resp,
        "numbered_steps": len(S.NUMBERED_STEP.findall(text)) if steps else 0,
        "observation_lines": len(S.OBSERVATION_LINE.findall(text)) if "Observation" in text else 0,
        "game_shell": len(S.GAME_SHELL.findall(text)),
        "equation_lines_response": len(S.EQUATION_LINE.findall(response)),
        "math_cjk": len(S.MATH_CJK.findall(text)) if S.NON_LATIN.search(text) else 0,
        "code_tokens_response": len(S.CODE_TOKENS.findall(response)),
        "shell_lines_response": len(S.SHELL_LINE.findall(response[:1500])),
        "accent_switch": int(_accents(prompt[-ASK_CHARS:]) != _accents(response[:RESPONSE_CHARS])),
        "ask_numbers": len(NUMBER.findall(prompt[-ASK_CHARS:] if prompt.strip() else response[:RESPONSE_CHARS])),
        "response_chars": len(response),
        "response_symbol_ratio": _symbol_ratio(response[:400]),
        "response_number_only": int(bool(S.BARE_NUMBER.match(response[:60]))),
        "response_regex": len(S.REGEX_TOKEN.findall(response[:400])),
        "response_formula": len(S.FORMULA.findall(response[:400])),
        "prose_script_switch": _prose_switch(prompt[-ASK_CHARS:], response[:RESPONSE_CHARS]),
        "response_lines": response.count("\n") + (1 if response else 0),
    }


def _symbol_ratio(text: str) -> float:
    """Share of the non-space characters that are neither letters nor digits (a regex or a formula is dense)."""
    chars = [c for c in text if not c.isspace()]
    return round(sum(not c.isalnum() for c in chars) / len(chars), 3) if chars else 0.0


def _prose(text: str) -> str:
    """``text`` without fenced code blocks, indented code and inline code spans."""
    return S.CODE_SPAN.sub(" ", text)


def _prose_switch(ask: str, response: str) -> int:
    """1 when the prose of the ask and of the response (code left out) is in two scripts, or in English on one
    side and clearly another Latin-script language on the other: documentation with code blocks translated."""
    a, b = _prose(ask), _prose(response)
    (sa, fa), (sb, fb) = S.dominant_script(a), S.dominant_script(b)
    if sa and sb and sa != sb and fa >= 0.5 and fb >= 0.5 and len(S.NON_LATIN.findall(a + b)) >= 8:
        return 1
    if sa == sb == "latin":
        la, _, _, na = S.latin_language(S.WORD.findall(a.lower())[:200])
        lb, _, _, nb = S.latin_language(S.WORD.findall(b.lower())[:200])
        if na >= 8 and nb >= 8 and la and lb and la != lb and (la == "en" or lb == "en"):
            return 1
    return 0


def _accents(text: str) -> bool:
    """Whether a Latin-script text uses accented letters (about 1 in 40 letters or more)."""
    n = len(S.ACCENTED.findall(text))
    return n >= 2 and n * 40 >= len(text)


def script_of(name: str | None) -> str:
    """Coarse script name (one of SCRIPTS, or "none") of a :func:`flashdraft.mix.signals.dominant_script` name."""
    if not name:
        return "none"
    return name if name in SCRIPTS else "other"


_NAMES: dict[str, tuple[str, bool]] = {}  # signal -> (feature name, log-scaled?)


def numeric_features(sig: dict) -> dict[str, float]:
    """Named numeric features from a merged signal dict: counts log-scaled, ratios kept, scripts one-hot."""
    out: dict[str, float] = {}
    log1p = math.log1p
    for k, v in sig.items():
        if v.__class__ is int or v.__class__ is float:
            spec = _NAMES.get(k)
            if spec is None:
                spec = _NAMES[k] = ("n:" + k, not k.endswith(("ratio", "share")))
            if v:
                out[spec[0]] = log1p(v) if spec[1] and v > 0 else float(v)
    ps, rs = sig.get("prompt_script", "none"), sig.get("response_script", "none")
    # pairs, not sides: "cjk>cjk" is a Chinese chat, "latin>cjk" a translation; a side with no letters (no
    # response, or a bare number) names no pair: which sets leave the answer out says nothing of a domain
    if "none" not in (ps, rs):
        out[f"s:pair={ps}>{rs}"] = 1.0
    out["s:same_script"] = float(ps == rs)
    pl, rl = sig.get("prompt_lang") or "none", sig.get("response_lang") or "none"
    coarse = lambda x: "en" if x == "en" else "none" if x == "none" else "other"
    if "none" not in (pl, rl):
        out[f"l:pair={coarse(pl)}>{coarse(rl)}"] = 1.0
    out["l:differ"] = float(pl != "none" and rl != "none" and pl != rl)
    out[f"rule={sig.get('rule_domain', 'other')}"] = 1.0
    return out


def tokens(prompt: str, response: str) -> list[str]:
    """Namespaced tokens of the ask (end of the prompt) and the head of the response."""
    ask = prompt[-ASK_CHARS:].lower()
    resp = response[:RESPONSE_CHARS].lower()
    return ["p:" + t for t in TOKEN.findall(ask)] + ["r:" + t for t in TOKEN.findall(resp)]
