"""The documents cannot drift from the CLI: every `flashdraft ...` command in README.md, docs/ and the asset
READMEs names a verb that exists and only flags that verb has (checked at --help level, nothing runs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from flashdraft.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "assets").glob("*/README.md"))]
NUMBER = re.compile(r"-\d+(\.\d+)?")


def doc_commands(text: str) -> list[list[str]]:
    """The argument lists after ``flashdraft`` (or ``-m flashdraft.cli``) of every command in the fenced and
    indented code of a Markdown text; line continuations joined, comments dropped."""
    code = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    code += re.findall(r"^ {4}\S.*(?:\n {4}.*)*", text, re.M)  # indented code blocks
    out = []
    for block in code:
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # not shell (a table, an unbalanced quote in prose code)
                continue
            for i, w in enumerate(words):
                if w == "flashdraft" and i == 0 or w == "flashdraft.cli" and i > 0 and words[i - 1] == "-m":
                    out.append(words[i + 1:])
                    break
    return out


def check_command(words: list[str]) -> None:
    """Raise AssertionError unless ``words`` name an existing (sub)command and only its flags."""
    words = list(words)
    cmd = typer.main.get_command(app)
    path = ["flashdraft"]
    while hasattr(cmd, "commands"):  # a group (typer vendors its own click)
        assert words, f"{' '.join(path)} needs a subcommand"
        name = words.pop(0)
        assert name in cmd.commands, f"{' '.join(path)} has no command {name!r} (has: {sorted(cmd.commands)})"
        cmd, path = cmd.commands[name], path + [name]
    flags = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
    for w in words:
        if w.startswith("-") and w != "-" and not NUMBER.fullmatch(w):
            flag = w.split("=", 1)[0]
            assert flag in flags, f"{' '.join(path)} has no flag {flag}"


def all_commands() -> list[tuple[str, list[str]]]:
    return [(f"{doc.relative_to(ROOT)}: flashdraft {' '.join(c)}", c) for doc in DOCS for c in doc_commands(doc.read_text())]


@pytest.mark.parametrize("where,words", all_commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_documented_command_parses(where, words):
    check_command(words)


def test_the_check_can_fail_and_reaches_every_page():
    with pytest.raises(AssertionError, match="has no flag --no-such-flag"):
        check_command(["run", "hi", "--no-such-flag", "3"])
    with pytest.raises(AssertionError, match="has no command 'frobnicate'"):
        check_command(["frobnicate"])
    with pytest.raises(AssertionError, match="has no command 'tabulate'"):
        check_command(["mix", "tabulate"])
    assert doc_commands("```bash\nflashdraft export a \\\n    --to vllm -o b   # note\n```\n") == [["export", "a", "--to", "vllm", "-o", "b"]]
    assert doc_commands("text\n\n    torchrun -m flashdraft.cli train --max-steps 3\n") == [["train", "--max-steps", "3"]]
    pages = {where.split(":")[0] for where, _ in all_commands()}
    assert {"README.md", "docs/training.md", "docs/decoding.md", "docs/export.md"} <= pages, pages


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    first = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link
