"""``bench model``: assemble cost-model inputs (file, preset or profile + bench-decode acceptance), predict,
validate against measured batch-1 speedups, write JSON / markdown / PNG."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml

from flashdraft.bench.costmodel import PRESETS, Acceptance, CostModel, CostModelInput, Hardware, ModelTarget
from flashdraft.config import ConfigError
from flashdraft.errors import FlashdraftError
from flashdraft.io import atomic_write_text


class ModelCmdError(FlashdraftError, ValueError):
    """Bad ``bench model`` input; the message names it and the fix."""


def acceptance_from_decode(results: dict) -> tuple[Acceptance, int, dict]:
    """Acceptance (chain tau per gamma, tree tau per budget) from `bench decode` results.

    Uses the first T=0 set (else the first set) and the first drafter. Chain tau(gamma) = 1 + sum of
    DFlash's first gamma per-position acceptance rates (exact at T=0: a truncated chain accepts
    min(accepted, gamma)), replaced by the measured chain@b control where present.
    Returns (acceptance, drafter block size, the set's rows).
    """
    sets = results.get("sets") or {}
    if not sets:
        raise ModelCmdError("decode results hold no measured set; run `flashdraft bench decode` to completion first")
    key = next((k for k in sets if k.endswith("@T=0")), next(iter(sets)))
    rows = sets[key]
    drafter, info = next(iter(results["drafters"].items()))
    block = int(info["block_size"])
    d = rows.get(f"{drafter}/dflash")
    acc = Acceptance.from_per_position(d["per_position_acceptance"], source=f"bench decode {key}") if d else Acceptance()
    for v, s in rows.items():
        if v.startswith(f"{drafter}/chain@"):
            acc.chain_tau[min(int(v.split("@")[1]), block - 1)] = s["tau_mean"]
        if v.startswith(f"{drafter}/ddtree@"):
            acc.tree_tau[int(v.split("@")[1])] = s["tau_mean"]
            if "spine_rows_mean" in s:
                acc.tree_spine[int(v.split("@")[1])] = s["spine_rows_mean"]
    acc.source = f"bench decode {key} ({drafter})"
    return acc, block, {v.removeprefix(f"{drafter}/"): s for v, s in rows.items()}


def validate_batch1(cm: CostModel, rows: dict) -> list[dict]:
    """Predicted (profiled costs + measured tau) vs measured speedup at batch 1 for every measured variant."""
    out, g_max = [], cm.inp.max_depth
    for v, s in rows.items():
        if v == "ar" or v.startswith("ngram"):  # prompt lookup has no drafter pass to price
            continue
        if v == "dflash":
            p = cm.chain(1, g_max)
        elif v.startswith("chain@"):
            p = cm.chain(1, min(int(v.split("@")[1]), g_max))
        else:
            p = cm.tree(1, int(v.split("@")[1]), s["tau_mean"])
        p_speed = s["tau_mean"] * cm.ar_ms(1) / p["round_ms"]
        out.append(dict(variant=v, tau=s["tau_mean"], measured=s["speedup"], predicted=p_speed,
                        error_pct=100 * (p_speed - s["speedup"]) / s["speedup"],
                        measured_round_ms=sum(s["stage_ms_per_round"].values()), predicted_round_ms=p["round_ms"]))
    return out


def prediction_table(pred: dict) -> str:
    """Speedup per concurrency: chain columns per distinct chain length, tree columns per budget."""
    rows = pred["rows"]
    gammas = sorted({r["gamma"] for r in rows if r["method"] == "dflash"})
    budgets = sorted({r["budget"] for r in rows if r["method"] == "ddtree"})
    lines = ["| concurrency | AR ms/step | " + " | ".join(f"chain@{g}" for g in gammas) + " | "
             + " | ".join(f"tree@{b}" for b in budgets) + " | best |",
             "|" + "---|" * (3 + len(gammas) + len(budgets))]
    for b in pred["best"]:
        c = b["concurrency"]
        chain = {r["gamma"]: r for r in rows if r["concurrency"] == c and r["method"] == "dflash"}
        tree = {r["budget"]: r for r in rows if r["concurrency"] == c and r["method"] == "ddtree"}
        ar = next((r["ar_ms"] for r in rows if r["concurrency"] == c), float("nan"))
        lines.append(f"| {c} | {ar:.2f} | " + " | ".join(f"{chain[g]['speedup']:.2f}" if g in chain else "-" for g in gammas)
                     + " | " + " | ".join(f"{tree[x]['speedup']:.2f}" if x in tree else "-" for x in budgets)
                     + f" | {_best(b)} |")
    stop = pred["stops_paying_at"]
    lines.append("")
    lines.append(f"speculation stops paying (best speedup <= 1) at concurrency: {stop if stop else 'not within the sweep'}")
    lines.append("chain@g = DFlash verifying g drafts (g <= B-1); tree@b = DDTree with b drafted nodes; "
                 "best = method@budget (a chain's budget is the tree budget it controls for)")
    return "\n".join(lines) + "\n"


def _best(b: dict) -> str:
    if b["method"] != "ar":
        return f"{b['method']}@{b['budget']} {b['speedup']:.2f}x"
    s = b.get("best_speculative")
    return "ar" + (f" (best speculative {s['method']}@{s['budget']} {s['speedup']:.2f}x)" if s else "")


def validation_table(val: list[dict]) -> str:
    lines = ["| variant | tau (measured) | measured speedup | predicted speedup | error % | round ms meas/pred |",
             "|---|---|---|---|---|---|"]
    for v in val:
        lines.append(f"| {v['variant']} | {v['tau']:.2f} | {v['measured']:.2f} | {v['predicted']:.2f} | "
                     f"{v['error_pct']:+.1f} | {v['measured_round_ms']:.1f}/{v['predicted_round_ms']:.1f} |")
    within = sum(abs(v["error_pct"]) <= 15 for v in val)
    med = statistics.median(abs(v["error_pct"]) for v in val) if val else float("nan")
    lines.append(f"\nwithin 15%: {within}/{len(val)}; median |error| {med:.1f}%")
    return "\n".join(lines) + "\n"


def run_model_command(input, preset, profile, target, drafter, decode_results, hardware: dict, concurrency,
                      budgets, threads, out: Path, console,
                      profile_opts: dict | None = None) -> dict:
    """Build the input, predict, print and write; returns {prediction, validation}."""
    import torch

    torch.set_num_threads(threads)
    if sum(x is not None and x is not False for x in (input, preset, profile or None)) != 1:
        raise ModelCmdError("give exactly one of --input FILE, --preset NAME or --profile")
    dec = None
    if decode_results is not None:
        p = Path(decode_results)
        if not p.is_file():
            raise ModelCmdError(f"--decode-results {p} does not exist; run `flashdraft bench decode -o DIR` first")
        try:
            dec = json.loads(p.read_text())
            if not isinstance(dec, dict) or not isinstance(dec.get("sets"), dict):
                raise ValueError("no 'sets' mapping")
        except (ValueError, UnicodeDecodeError) as e:
            raise ModelCmdError(f"--decode-results {p} is not the results.json that `flashdraft bench decode -o DIR` "
                                f"writes ({str(e).splitlines()[0]}); pass DIR/results.json") from None
    try:
        if input is not None:
            inp = CostModelInput.load(input)
        elif preset is not None:
            if preset not in PRESETS:
                raise ModelCmdError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
            inp = PRESETS[preset]()
        else:
            inp = _profiled_input(target, drafter, dec, console, profile_opts or {})
    except ConfigError as e:
        raise ModelCmdError(str(e)) from None
    hw = {k: v for k, v in hardware.items() if v is not None}
    if hw:
        try:
            inp.hardware = Hardware(**(inp.hardware.model_dump() | hw))
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ModelCmdError(f"hardware flags do not fit together: {str(e).splitlines()[-1].strip()}") from None
    if concurrency:
        inp.concurrency = concurrency
    if budgets:
        inp.budgets = budgets
    rows = None
    if dec is not None:
        acc, block, rows = acceptance_from_decode(dec)
        if input is None and preset is None:
            inp.acceptance, inp.block_size = acc, block
            inp.budgets = budgets or sorted(acc.tree_tau) or inp.budgets
    cm = CostModel(inp)
    pred = cm.predict()
    out = Path(out)
    md = "## Predicted speedup over AR\n\n" + prediction_table(pred)
    val = None
    if rows is not None and inp.measured is not None:
        val = validate_batch1(cm, rows)
        md += "\n## Batch 1: predicted vs measured (this machine)\n\n" + validation_table(val)
    md += "\n## Inputs (every assumed or measured value)\n\n```yaml\n" + yaml.safe_dump(
        inp.model_dump(mode="json"), sort_keys=False) + "```\n"
    atomic_write_text(out / "model_prediction.json", json.dumps(dict(pred, validation=val), indent=1))
    atomic_write_text(out / "model_table.md", md)
    from flashdraft.bench.plots import model_plots

    plots = model_plots(pred, out)
    console.print(md, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'model_prediction.json'}, {out / 'model_table.md'}, {plots[0]}")
    return dict(prediction=pred, validation=val)


def _profiled_input(target_spec: str, drafter_dir, dec: dict | None, console, opts: dict) -> CostModelInput:
    from flashdraft.bench.profile import profile_costs
    from flashdraft.models.drafter import DrafterError, load_drafter
    from flashdraft.models.target import TargetError, load_target

    try:
        tgt = load_target(target_spec)
        d = load_drafter(drafter_dir, tgt) if drafter_dir else None
    except (DrafterError, TargetError) as e:
        raise ModelCmdError(str(e)) from None
    console.print(f"profiling {target_spec} (batch 1) ...")
    costs = profile_costs(tgt, d, **opts)
    return CostModelInput(
        target=ModelTarget(name=target_spec, layers=tgt.num_layers, hidden=tgt.hidden_size,
                           drafter_layers=d.cfg.num_hidden_layers if d else 1),
        measured=costs, acceptance=Acceptance.synthetic() if dec is None else Acceptance(),
        block_size=d.max_depth + 1 if d else 16, concurrency=[1], budgets=[4, 8, 16, 32, 64, 128],
    )
