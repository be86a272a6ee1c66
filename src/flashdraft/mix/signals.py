"""Transparent, cheap signals of a sample's domain, each a count or a ratio that a person can check.

All regexes are compiled once; :func:`extract` runs a fixed set of ``findall``/``search`` passes
over a bounded slice of the text, which keeps the rules classifier above 2,000 samples/s per core.
"""

from __future__ import annotations

import re
from functools import lru_cache

# --- code -------------------------------------------------------------------------------------
FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.\-]*)", re.M)
CODE_LINE = re.compile(
    r"^[ \t]*(?:def \w+\(|class \w+[(:]|import \w|from [\w.]+ import |return\b|elif\b|else:|try:|except\b|"
    r"raise \w|yield\b|async def |@\w+|if .+:$|for \w.* in .+:$|while .+:$|with .+ as \w+:$|"
    r"#include\b|#define\b|public |private |protected |static |function\s*\w*\s*\(|const \w+\s*=|"
    r"let \w+|var \w+\s*=|fn \w+|func \w+|package \w+;?$|using \w|namespace \w|impl\b|struct \w+|"
    r"SELECT\b|INSERT INTO|CREATE TABLE|console\.log|print\(|System\.out|std::|>>> |\$ \w|"
    r"\w+(?:\.\w+)*\s*(?:[+\-*/]?=)\s*[\w\[\({\"'].*$|\}[ \t]*$|.*[;{][ \t]*$)",
    re.M,
)
LINE = re.compile(r"^[ \t]*\S", re.M)
PROGRAMMING_LANGS = frozenset(
    "python javascript typescript java golang rust ruby php kotlin swift scala bash sql html css haskell perl "
    "matlab julia lua dart code function script program".split())

# --- math -------------------------------------------------------------------------------------
# any LaTeX-style command of 2+ letters (\\Lambda, \\zeta, \\ge); one-letter escapes like \\n are not counted
TEX_COMMAND = re.compile(r"\\[A-Za-z]{2,}")
INLINE_MATH = re.compile(r"\$\$?[^$\n]{1,200}\$\$?|\\\(|\\\[|:math:`")
ARITH = re.compile(r"(?<![\d,.])\d[\d,.]*+%?\s*+[-+*/×÷^=<>]\s*+\(?\$?\d|<<[^<>]{1,80}>>|^####\s*-?\d|"
                   r"\d\s*\*?\s*[a-z]\s*[-+*/=<>]\s*\(?\d|[-+*/=]\s*\d+\s*\*?\s*[a-z]\b", re.M)
MATH_WORDS = frozenset(
    "solve solving equation equations integral integrate derivative theorem lemma prove proof corollary "
    "probability polynomial matrix matrices vector fraction fractions remainder prime divisible percent "
    "average calculate compute simplify factor factorize root roots triangle circle radius area perimeter "
    "angle geometric arithmetic sequence series converge converges convergent limit modulo inequality "
    "integer integers eigenvalue eigenvalues differentiate function variance mean median".split())
MATH_PHRASES = re.compile(r"[Hh]ow (?:many|much)|sum of|product of|in total|altogether|[Ll]et [a-z] be|f\(x\)")
DIGIT = re.compile(r"\d")

# --- tool calling -----------------------------------------------------------------------------
SCHEMA = re.compile(
    r"\"(?:parameters|input_schema|properties|required)\"\s*:\s*[\[{]|\"type\"\s*:\s*\"(?:function|object)\"|"
    r"'(?:parameters|properties)'\s*:\s*\{|<\|tools\|>|<tools>|\bfunctions?\s+(?:available|provided)\b|"
    r"\"inputSchema\"\s*:")
CALL = re.compile(
    r"\"(?:name|function)\"\s*:\s*\"[\w.\-]+\"\s*,\s*\"(?:arguments|parameters|args|input)\"\s*:|"
    r"\"(?:arguments|tool_calls|function_call|tool_use)\"\s*:|<tool_call>|<functioncall>|"
    r"\[\s*[\w.]+\([\w]+\s*=|^\s*[\w.]+\((?:\w+\s*=\s*[^,()]+,?\s*)+\)\s*$", re.M)

# --- agent ------------------------------------------------------------------------------------
REACT = re.compile(r"^[ \t>*#]*(Thought|Action|Action Input|Observation|Final Answer|Code)\s*:", re.M)
# the same steps written as JSON keys by structured agents
JSON_REACT_KEYS = ('"thought":', '"action":', '"code":', '"tool_name":', '"tool_input":')
OBSERVATION = re.compile(
    r"^[ \t>*#]*(?:Observation|OBSERVATION|Execution logs?|Output|Tool output|Result|stdout|Exit code)"
    r"\s*:|<\|tool\|>|<observation>|<tool_response>|\[File: |\(Open file: |bash-\$|\(Current directory:", re.M)
ACTION = re.compile(
    r"^[ \t>*#]*(?:Action|ACTION|COMMAND)\s*:|<execute_\w+>|<function=\w+>|<end_code>|```(?:bash|sh|shell)\n|"
    r"\"tool_calls\"\s*:|^\s*(?:open|edit|goto|scroll_down|find_file|search_dir|search_file|create|submit|"
    r"str_replace_editor|python3?|ls|cd|cat|grep|pytest)\b[^\n]{0,120}$", re.M)

# --- translation ------------------------------------------------------------------------------
TRANSLATE_PREFIXES = ("translat", "traduire", "tradui", "traduc", "traduz", "traduç", "übersetz", "vertaal",
                      "przetłumacz", "tłumacz", "oversæt", "overset", "käänn", "çevir", "dịch", "перевед",
                      "перевод", "переклад", "ترجم", "תרגם", "अनुवाद")
TRANSLATE_CJK = ("翻译", "翻譯", "翻訳", "訳して", "번역", "แปล")
LANG_NAMES = (
    "english|french|german|spanish|italian|portuguese|dutch|russian|chinese|japanese|korean|arabic|hebrew|"
    "hindi|turkish|polish|swedish|danish|norwegian|finnish|greek|czech|ukrainian|vietnamese|thai|"
    "indonesian|romanian|hungarian|persian|bengali|catalan|basque|galician|irish|welsh|latin|"
    "français|deutsch|español|italiano|português|nederlands|русский|中文|日本語|한국어")
LANG_LABEL = re.compile(rf"^[ \t*]*(?:{LANG_NAMES})\s*(?:\([\w-]+\))?\s*:", re.M | re.I)
LANG_NAME_SET = frozenset(LANG_NAMES.split("|"))
DIRECTION_WORDS = frozenset(("in", "into", "to", "from"))
SCRIPTS = {
    "latin": re.compile(r"[A-Za-zÀ-ɏ]"),
    "cyrillic": re.compile(r"[Ѐ-ӿ]"),
    "greek": re.compile(r"[Ͱ-Ͽ]"),
    "arabic": re.compile(r"[؀-ۿݐ-ݿ]"),
    "hebrew": re.compile(r"[֐-׿]"),
    "devanagari": re.compile(r"[ऀ-ॿ]"),
    "bengali": re.compile(r"[ঀ-৿]"),
    "thai": re.compile(r"[฀-๿]"),
    "georgian": re.compile(r"[Ⴀ-ჿ]"),
    "armenian": re.compile(r"[԰-֏]"),
    "cjk": re.compile(r"[぀-ヿ㐀-䶿一-鿿]"),
    "hangul": re.compile(r"[가-힯ᄀ-ᇿ]"),
}
NON_LATIN = re.compile(r"[^\x00-\u024f\u2000-\u206f\u20a0-\u20cf\u2100-\u22ff]")
# Frequent function words of Latin-script languages, for telling the language of a short text.
STOPWORDS = {
    "en": "the and of to is in that it for you with this are on be not have he she they we was were has had "
          "can will would so by at from as or but his her their what how there me my your our do does",
    "fr": "le la les des est et une un du que pour dans pas vous ce qui sur",
    "de": "der die das und ist nicht ein eine zu den von mit sie für auf dem",
    "es": "el la los las es y de que en un una por para con no se del",
    "it": "il la di che è e un una per non con sono del della gli le",
    "pt": "o a os as de que é e um uma para não com do da em se",
    "nl": "de het een en is van dat niet te op voor met zijn je",
    "pl": "i w nie na się z do jest że to jak o co",
    "sv": "och att det är en som på för med inte av till den",
    "da": "og at det er en som på for med ikke af til den har jeg",
    "no": "og at det er en som på for med ikke av til den har jeg",
    "fi": "ja on ei se että oli ole mutta kun tai jos tämä sitä mitä",
    "cs": "a se na je že v to s z do jsou pro není nebo jak",
    "tr": "ve bir bu da de için ile ne çok daha olarak gibi değil",
    "ro": "și în de la cu nu este un o pe care mai să din",
    "hu": "a az és hogy nem is egy van meg de csak ez mint",
    "id": "dan yang di ini itu dengan untuk tidak dari ke ada akan",
    "vi": "và của là có không được cho một những các này trong",
}
WORD = re.compile(r"[^\W\d_]+")
_STOP = {lang: frozenset(ws.split()) for lang, ws in STOPWORDS.items()}
_WORD_LANGS: dict[str, tuple[str, ...]] = {}
for _lang, _ws in _STOP.items():
    for _w in _ws:
        _WORD_LANGS[_w] = _WORD_LANGS.get(_w, ()) + (_lang,)


def word_signals(words: list[str]) -> tuple[int, int, int, int]:
    """(math words, programming-language words, translate-request words, "into <language>" pairs) in ``words``."""
    math = prog = tr = into = 0
    prev = ""
    for w in words:
        if w in MATH_WORDS:
            math += 1
        elif w in PROGRAMMING_LANGS:
            prog += 1
        elif w in LANG_NAME_SET:
            if prev in DIRECTION_WORDS:
                into += 1
        elif w.startswith(TRANSLATE_PREFIXES):
            tr += 1
        prev = w
    return math, prog, tr, into


@lru_cache(maxsize=512)
def lexer_name(tag: str) -> str | None:
    """Canonical language name of a code-fence tag through pygments' lexer aliases (None if unknown)."""
    if not tag:
        return None
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(tag.lower()).name
    except ClassNotFound:
        return None


def dominant_script(text: str) -> tuple[str | None, float]:
    """The script holding most letters of ``text`` and its share of them (latin counted as a remainder)."""
    if not text:
        return None, 0.0
    non_latin = len(NON_LATIN.findall(text))
    latin = len(SCRIPTS["latin"].findall(text))
    if non_latin == 0:
        return ("latin", 1.0) if latin else (None, 0.0)
    best, best_n = "latin", latin
    for name, rx in SCRIPTS.items():
        if name == "latin":
            continue
        n = len(rx.findall(text))
        if n > best_n:
            best, best_n = name, n
    total = latin + non_latin
    return best, best_n / total if total else 0.0


def latin_language(words: list[str]) -> tuple[str | None, float, float, int]:
    """(best-guess language of lower-cased Latin-script ``words`` or None, share of English function
    words, share of the best non-English language's function words, word count).

    The English share alone already tells an English text (~0.3) from a non-English one (< 0.08).
    """
    hits = dict.fromkeys(_STOP, 0)
    words = [w for w in words if len(w) > 1]  # one-letter words are shared by too many languages
    n_words = len(words)
    if n_words < 2:
        return None, 0.0, 0.0, n_words
    for w in words:
        for lang in _WORD_LANGS.get(w, ()):
            hits[lang] += 1
    en_share = hits["en"] / n_words
    other_share = max(v for k, v in hits.items() if k != "en") / n_words
    ranked = sorted(hits.items(), key=lambda kv: kv[1], reverse=True)
    (lang, n), second = ranked[0], ranked[1][1]
    if n >= 2 and n > 1.3 * second:
        return lang, en_share, other_share, n_words
    return None, en_share, other_share, n_words


# --- formats of tool calls, agent transcripts and math without LaTeX ---------------------------
# Tool-call syntaxes of model families and protocols (from their public format documents): Llama 3.x
# (<|python_tag|>, <function=...>), Hermes/Qwen <tool_call>, Mistral [TOOL_CALLS], functionary
# (>>>name / <|from|>), NexusRaven "Call:", Anthropic content blocks, MCP tools/call, ReAct-style
# "Action Input:" JSON, OpenAI tool_calls/function_call JSON.
TOOL_FORMAT = re.compile(
    r"<\|python_tag\|>|<function=[\w.\-]+>|</?tool_call>|\[TOOL_CALLS\]|<\|from\|>|^>>>\s*\w+|^Call:\s*\w+\(|"
    r"\"type\"\s*:\s*\"tool_(?:use|result)\"|'type'\s*:\s*'tool_(?:use|result)'|ToolUseBlock|tool_use_id|"
    r"\"method\"\s*:\s*\"tools/(?:call|list)\"|tools/call|\"tool_calls\"\s*:|\"function_call\"\s*:|"
    r"^Action Input\s*:\s*\{|<\|tool_calls?_section_begin\|>|<tool_use>|<invoke name=", re.M)
OBSERVATION_LINE = re.compile(r"^[ \t>*#]*Observation(?:\s+\d+)?\s*:", re.M)
# Numbered ReAct steps (Thought 1: / Action 2: / Observation 3:) and text-game / shell transcripts.
NUMBERED_STEP = re.compile(r"^(?:Thought|Action|Observation|Act|Obs)\s+\d+\s*:", re.M)
GAME_SHELL = re.compile(r"^> [a-z]+\b|The output of the OS|^Observation\s*:|You are in the middle of a room|"
                        r"^\$ [a-z]|<execute>|</execute>|<solution>|\[Search\]|Search\[|click\s*\[|Finish\[", re.M)
# A short answer or one equation line without LaTeX: "x = 4", "a_n = 9n - 4", "#### 18", "= 51.0".
EQUATION_LINE = re.compile(r"^\s*(?:[a-zA-Z](?:_\{?\w+\}?)?(?:\([a-z]\))?\s*=\s*[-+*/^().\w\s]{1,40}|[-+]?\d[\d,.]*"
                           r"(?:\s*\(?[a-z ]{1,20}\)?)?|[-+*/().\d\s]+=\s*[-\d.]+)\s*$", re.M)
# Math words of other scripts (Chinese/Japanese word problems, equations named in Russian).
MATH_CJK = re.compile(r"多少|几[个只本元天]|平均|面积|周长|方程|一共|[求解]得?[:：]?\s*x|千克|公里|百分之|分数|"
                      r"比例|速度|计算|答案|何個|いくつ|いくら|сколько|уравнени")  # run only on text with non-Latin letters
CODE_TOKENS = re.compile(r"[{};][ \t]*$|=>|->|::|\b(?:fn|func|def|class|return|impl|pub|SELECT|FROM|WHERE|awk|sed)\b|"
                         r"\|[ \t]*(?:grep|xargs|sort|wc)\b|\bfind \.", re.M)
# A shell command with flags or a pipe, the way one-liners are written ("find . -name x | xargs rm").
SHELL_LINE = re.compile(r"^[ \t]*[a-z][\w.-]*(?: [^ \n|;]+)*? --?[a-zA-Z]|\| ?[a-z][\w-]* ", re.M)
ACCENTED = re.compile(r"[À-ɏ]")
# What a one-line answer in a notation (not prose) looks like: regular-expression tokens and spreadsheet formulas.
REGEX_TOKEN = re.compile(r"\\[bdwsDWS](?![a-z])|\.\*|\.\+|\[(?:\^?[A-Za-z0-9]-[A-Za-z0-9]|\^)|\(\?[:=!<]|[)\]][*+?]|(?:(?<=[\])])|(?<=\\[dwsDWS]))\{\d+(?:,\d*)?\}")
FORMULA = re.compile(r"\b[A-Z][A-Za-z0-9.]{1,20}\([^()\n]{0,60}?(?:\$?[A-Z]{1,3}\$?\d+\b|c\[\d+\])|^\s*=\s*[A-Z]+\(", re.M)
BARE_NUMBER = re.compile(r"\s*[-+]?\$?\d[\d,]*(?:\.\d+)?\s*%?\s*$")
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?")
LATEX_COMMON = re.compile(r"\\(?:frac|dfrac|sqrt|begin|end|left|right|cdot|times|leq?|geq?|pi|sum|int|boxed|text)\b")
CODE_SPAN = re.compile(r"^[ \t]*```.*?(?:^[ \t]*```|\Z)|`[^`\n]+`|^(?: {4}|\t).+$", re.S | re.M)
