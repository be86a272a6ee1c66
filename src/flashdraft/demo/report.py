"""The demo's report folder: ``report.html`` (self-contained: plots inlined as base64 PNG) and ``report.md``.

Every figure is read from the run's own files: the stage markers (minutes, outputs), the bench's
``results.json`` and ``machine.json``, the mix ``report.json``, the training ``metrics.jsonl``, the
generate ``manifest.json``. Nothing here measures anything.
"""

from __future__ import annotations

import base64
import html
import json
import shlex
from pathlib import Path

from flashdraft.demo.figures import acceptance_plot, costmodel_curves, costmodel_plot, loss_plot
from flashdraft.demo.stages import read_marker
from flashdraft.io import atomic_write_text

STAGE_ORDER = ("prompts", "generate", "mix", "train", "bench", "export")


def _read_json(path) -> dict:
    return json.loads(Path(path).read_text()) if path and Path(path).is_file() else {}


def collect(out: Path) -> dict:
    """Markers and result files of a demo run folder."""
    markers = {s: read_marker(out, s) for s in STAGE_ORDER}
    o = {s: (m or {}).get("outputs", {}) for s, m in markers.items()}
    bench = _read_json(o["bench"].get("results"))
    if not bench:
        raise FileNotFoundError(f"{out}: no bench results (stages/bench.json -> results.json); run the bench stage")
    return dict(markers=markers, outputs=o, bench=bench, machine=_read_json(o["bench"].get("machine")),
                mix=_read_json(o["mix"].get("json")), manifest=_read_json(o["generate"].get("manifest")),
                metrics_path=o["train"].get("metrics"))


def headline(bench: dict) -> dict:
    """The run's verdict per drafter: the fastest speculative variant, whether it beat AR, lossless or not."""
    key, rows = next(iter(bench["sets"].items()))
    ar = rows["ar"]
    out = dict(set=key, ar_tpot_ms=ar["tpot_ms"], prompts=ar["prompts"], drafters={},
               lossless=all(s["identical_to_ar"] == s["prompts"] for s in rows.values()))
    for d in bench["drafters"]:
        mine = {v: s for v, s in rows.items() if v.startswith(f"{d}/")}
        best_v = max(mine, key=lambda v: mine[v]["speedup"])
        best = {}
        for kind, tag in (("tree", "/ddtree@"), ("hybrid", "/ddtree_ngram@")):  # the drafter's tree; + the lookup's chain
            rows_k = {v: s for v, s in mine.items() if tag in v}
            v = max(rows_k, key=lambda v: rows_k[v]["speedup"]) if rows_k else None
            best.update({f"best_{kind}": v, f"{kind}_speedup": rows_k[v]["speedup"] if v else None,
                         f"{kind}_tau": rows_k[v]["tau_mean"] if v else None})
        out["drafters"][d] = dict(best=best_v, best_speedup=mine[best_v]["speedup"], best_tau=mine[best_v]["tau_mean"],
                                  **best, dflash_tau=mine.get(f"{d}/dflash", {}).get("tau_mean"))
    spec = {v: s for v, s in rows.items() if v != "ar"}
    out["fastest"] = max(spec, key=lambda v: spec[v]["speedup"])
    out["fastest_speedup"], out["fastest_tau"] = spec[out["fastest"]]["speedup"], spec[out["fastest"]]["tau_mean"]
    out["beat_ar"] = out["fastest_speedup"] > 1.0
    return out


def _table(head: list[str], rows: list[list]) -> tuple[str, str]:
    """(markdown, html) of one table."""
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    h = "<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in head) + "</tr>"
    h += "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows) + "</table>"
    return "\n".join(md) + "\n", h


def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def bench_rows(bench: dict) -> tuple[list[str], list[list]]:
    """One row per method (AR, then the drafter rows as the bench ran them: DFlash, DDTree@b, chain@b, the hybrid,
    the cost-sized trees), one column group per drafter."""
    _, rows = next(iter(bench["sets"].items()))
    drafters = list(bench["drafters"])
    kinds = list(dict.fromkeys(v.split("/", 1)[1] for v in rows if v.split("/", 1)[0] in drafters))
    head = ["method"] + [f"{d} {c}" for d in drafters for c in ("tau", "TPOT ms", "speedup", "=AR")]
    ar = rows["ar"]
    out = [["ar"] + [x for _ in drafters for x in ("1.00", _f(ar["tpot_ms"], 1), "1.00", f"{ar['prompts']}/{ar['prompts']}")]]
    for k in kinds:
        cells = []
        for d in drafters:
            s = rows.get(f"{d}/{k}")
            cells += ([_f(s["tau_mean"]), _f(s["tpot_ms"], 1), _f(s["speedup"]), f"{s['identical_to_ar']}/{s['prompts']}"]
                      if s else ["-"] * 4)
        out.append([k] + cells)
    for v, s in rows.items():  # drafter-free variants (prompt lookup): the same figures in every group
        if v != "ar" and "/" not in v:
            out.append([v] + [_f(s["tau_mean"]), _f(s["tpot_ms"], 1), _f(s["speedup"]),
                              f"{s['identical_to_ar']}/{s['prompts']}"] * len(drafters))
    return head, out


def gpu_commands(out: Path, data: dict, recipe: str, chat_template: str = "auto") -> list[tuple[str, str]]:
    """The exact commands that repeat each stage at full scale on a GPU box (8 GPUs)."""
    o = data["outputs"]
    prompts = o["prompts"].get("prompts", "prompts.jsonl")
    q = shlex.quote
    cmds = [
        ("generate (one vLLM engine per GPU)", f"flashdraft generate {q(prompts)} -o data/generated --backend vllm "
         f"--data-parallel 8 --dtype bfloat16 --temperature 0 --max-tokens 2048 --chat-template {chat_template} --resume"),
        ("mix report", "flashdraft mix report data/generated --out data/mix"),
        ("train (torchrun, one process per GPU)", f"torchrun --nproc-per-node 8 -m flashdraft.cli train --config "
         f"{q(recipe)} --data data/generated --out-dir runs/full --bf16"),
        ("bench decode", "flashdraft bench decode --drafter runs/full/drafter --prompts humaneval --limit 164 "
         f"--budgets 8,16,32,64,128 --repeats 3 --chat-template {chat_template}"),
        ("export for vLLM", "flashdraft export runs/full/drafter --to vllm -o runs/full/vllm"),
    ]
    for name, cmd in (o["export"].get("serve") or {}).items():
        cmds.append((f"serve ({name})", cmd))
    return cmds


def _img_html(path: Path, title: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return (f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(title)}</figcaption></figure>")


def write_report(out: Path, cfg) -> dict[str, Path]:
    """Write ``out/report/report.html``, ``report.md`` and ``figures/*.png``; return their paths."""
    from flashdraft.bench.plots import decode_plots

    out = Path(out)
    rdir, fdir = out / "report", out / "report" / "figures"
    data = collect(out)
    bench, mach, h = data["bench"], data["machine"], headline(data["bench"])
    figs: list[tuple[str, Path]] = []
    for p in decode_plots(bench, fdir):
        figs.append((("tau histogram" if p.name.startswith("tau_hist") else "speedup and tau vs tree budget")
                     + f" ({p.stem.rsplit('_', 1)[-1]} drafter)", p))
    figs.append(("per-position acceptance (share of rounds that accept draft k)", acceptance_plot(bench, fdir)))
    curves = costmodel_curves(bench)
    figs.append((f"cost model: speedup vs concurrency, {curves['target']} on 8 GPUs (TP=8), PCIe vs NVLink, "
                 f"with the acceptance measured here ({curves['drafter']} drafter)", costmodel_plot(curves, fdir)))
    if data["metrics_path"] and Path(data["metrics_path"]).is_file():
        lp = loss_plot(Path(data["metrics_path"]), fdir)
        if lp:
            figs.append(("training loss", lp))
    if data["outputs"]["mix"].get("chart"):
        figs.append(("domain mix of the generated data", Path(data["outputs"]["mix"]["chart"])))

    minutes = [[s, _f((data["markers"][s] or {}).get("minutes"), 1)] for s in STAGE_ORDER]
    total = sum((m or {}).get("minutes", 0.0) for m in data["markers"].values())
    t_min = _table(["stage", "minutes"], minutes + [["total", _f(total, 1)]])
    t_bench = _table(*bench_rows(bench))
    def _spec(best: dict) -> str:  # the best speculative choice, also where it loses to AR
        s = best["best_speculative"]
        return f"{s['speedup']:.2f} ({s['method']}@{s['budget']})" if s else "-"

    cm_rows = [[c["concurrency"]] + [_spec(curves["boxes"][b]["best"][i]) for b in curves["boxes"]]
               for i, c in enumerate(next(iter(curves["boxes"].values()))["best"])]
    t_cm = _table(["concurrency"] + [f"{b}: best speculative speedup" for b in curves["boxes"]], cm_rows)
    gen, tr, mix, man = data["outputs"]["generate"], data["outputs"]["train"], data["mix"], data["manifest"]
    shares = ", ".join(f"{d} {100 * v['share']:.0f}%" for d, v in (mix.get("domains") or {}).items() if v.get("count"))
    cmds = gpu_commands(out, data, cfg.recipe, cfg.chat_template)

    verdict = []
    for d, r in h["drafters"].items():
        verdict.append(f"{d} drafter: fastest speculative variant {r['best']} at {r['best_speedup']:.2f}x AR "
                       f"(tau {r['best_tau']:.2f}); best DDTree {r['best_tree']} at {_f(r['tree_speedup'])}x "
                       f"(tau {_f(r['tree_tau'])})"
                       + (f"; best hybrid tree (DDTree + prompt lookup) {r['best_hybrid']} at "
                          f"{_f(r['hybrid_speedup'])}x (tau {_f(r['hybrid_tau'])})" if r["best_hybrid"] else "")
                       + f"; DFlash tau {_f(r['dflash_tau'])}.")
    beat = (f"Speculation beat autoregressive decoding on this machine: fastest {h['fastest']} at "
            f"{h['fastest_speedup']:.2f}x AR (tau {h['fastest_tau']:.2f})." if h["beat_ar"] else
            "Speculation did NOT beat autoregressive decoding on this machine: every speculative variant was slower "
            "than AR here (speedup below 1.00x). On this CPU a verify round over many draft tokens costs several AR "
            "steps; the cost model below shows what the acceptance measured here would give on an 8-GPU box.")
    same = ("Outputs were token-identical to AR for every variant and prompt (greedy)." if h["lossless"] else
            "Some outputs DIFFERED from AR (see the =AR columns): this is a bug to report.")
    where = (f"Measured {mach.get('date', '?')} on {mach.get('host', '?')}: {mach.get('cpu', '?')}, "
             f"{mach.get('cores', '?')} cores, {mach.get('torch_threads', '?')} torch thread(s)"
             + (f", GPU {mach['gpu']}" if mach.get("gpu") else ", no GPU") + f"; target {bench['target']}.")
    facts = [
        f"Prompts: {data['outputs']['prompts'].get('count')} from {', '.join(data['outputs']['prompts'].get('sources', []))}; "
        f"generate backend {gen.get('backend')}: {man.get('counts', {}).get('done')} answers, "
        f"{man.get('tokens', {}).get('response')} new tokens in {_f(man.get('elapsed_s'), 0)} s "
        f"({(man.get('throughput') or {}).get('response_tokens_per_s')} tokens/s) -> {gen.get('data')}.",
        f"Mix: {shares or 'n/a'}.",
        f"Train: {tr.get('steps')} of {tr.get('total_steps')} steps (stopped: {tr.get('stopped')}), "
        f"started from {tr.get('init_from') or 'a fresh drafter'} -> {tr.get('drafter')}.",
        f"Prompting (generate and bench): {bench.get('prompting', 'raw prompt text')}.",
        f"Bench: {h['prompts']} held-out HumanEval prompts x {bench['max_new_tokens']} new tokens, "
        f"{bench['repeats']} run(s) each, all variants interleaved; AR TPOT {h['ar_tpot_ms']:.1f} ms.",
        f"Export: {data['outputs']['export'].get('exported')} ({data['outputs']['export'].get('format')}).",
    ]
    title = f"flashdraft demo: {bench['target']}"

    md = [f"# {title}", "", where, "", f"**{beat}** {same}", ""] + [f"- {v}" for v in verdict] + [""]
    md += ["## Decode benchmark (" + h["set"] + ")", "", t_bench[0], "## Run", ""] + [f"- {f}" for f in facts]
    md += ["", "Minutes per stage:", "", t_min[0], "## Cost model (" + curves["source"] + ")", "", t_cm[0]]
    md += ["## Figures", ""] + [f"![{t}](figures/{p.name})" if p.parent == fdir else f"![{t}]({Path(p).resolve()})"
                                for t, p in figs]
    md += ["", "## Full scale on GPUs", ""] + [f"{n}:\n\n```bash\n{c}\n```\n" for n, c in cmds]

    css = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}table{border-collapse:collapse;"
           "margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}"
           "pre{background:#f4f4f4;padding:8px;white-space:pre-wrap}.verdict{font-size:1.15em}")
    e = html.escape
    body = [f"<h1>{e(title)}</h1>", f"<p>{e(where)}</p>", f'<p class="verdict"><b>{e(beat)}</b> {e(same)}</p>',
            "<ul>" + "".join(f"<li>{e(v)}</li>" for v in verdict) + "</ul>",
            f"<h2>Decode benchmark ({e(h['set'])})</h2>", t_bench[1], "<h2>Run</h2>",
            "<ul>" + "".join(f"<li>{e(f)}</li>" for f in facts) + "</ul>", t_min[1],
            f"<h2>Cost model ({e(curves['source'])})</h2>", t_cm[1], "<h2>Figures</h2>"]
    body += [_img_html(p, t) for t, p in figs]
    body += ["<h2>Full scale on GPUs</h2>"] + [f"<p>{e(n)}:</p><pre>{e(c)}</pre>" for n, c in cmds]
    page = (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{e(title)}</title><style>{css}</style>'
            f"</head><body>{''.join(body)}</body></html>\n")
    paths = {"html": rdir / "report.html", "markdown": rdir / "report.md", "summary": rdir / "summary.json"}
    atomic_write_text(paths["html"], page)
    atomic_write_text(paths["markdown"], "\n".join(md) + "\n")
    atomic_write_text(paths["summary"], json.dumps(dict(headline=h, machine=mach, minutes={s: (data['markers'][s] or {}).get('minutes') for s in STAGE_ORDER}, total_minutes=total,
                                                        costmodel={b: c["best"] for b, c in curves["boxes"].items()}),
                                                   indent=1) + "\n")
    return paths
