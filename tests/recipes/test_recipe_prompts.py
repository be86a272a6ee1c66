"""The Gemma recipe's prompt draws: ``--later-heads`` gives function heads that the other draws never hold."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("gemma_recipe", ROOT / "recipes" / "gemma3_270m_dflash.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_head_offset_draws_each_modules_next_three_documented_functions(tmp_path, monkeypatch):
    recipe = _recipe()
    funcs = [f'def f{i}(x):\n    """Return x plus {i}, the {i}th of seven."""\n    return x + {i}\n\n\n' for i in range(7)]
    (tmp_path / "mod.py").write_text("".join(funcs))
    monkeypatch.setattr(recipe, "package_files", lambda rng: [tmp_path / "mod.py"])

    first = recipe.code_prompts(10, seed=0, packages=True, cuts=False)
    later = recipe.code_prompts(10, seed=0, packages=True, cuts=False, head_offset=3)

    def names(prompts: list[str]) -> set[str]:  # the function each head prompt ends in
        return {p.rsplit("def ", 1)[1].split("(")[0] for p in prompts}

    assert len(first) == 3 and len(later) == 3
    assert not names(first) & names(later)  # no function in both draws
    assert all(p.rstrip().endswith('"""') for p in first + later)  # each ends after its docstring
    assert len(names(first) | names(later)) == 6  # six of the seven, the seventh left for offset 6
