import json

from typer.testing import CliRunner

from flashdraft.mix.cli import app

runner = CliRunner()


def test_report_writes_tables_chart_and_examples(mixed_jsonl, tmp_path):
    out = tmp_path / "rep"
    r = runner.invoke(app, ["report", str(mixed_jsonl), "--out", str(out), "--examples", "2"])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "report.json").read_text())
    assert rep["total"] == 60 and rep["domains"]["coding"]["count"] == 10
    assert rep["domains"]["coding"]["share"] == 10 / 60 and rep["domains"]["coding"]["tokens"] > 0
    assert set(rep["sources"]) == {"a", "b"}
    assert (out / "mix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "## Per source" in md and "Examples to check by hand" in md
    assert len((out / "examples.jsonl").read_text().splitlines()) == 12


def test_plan_from_report_json(mixed_jsonl, tmp_path):
    runner.invoke(app, ["report", str(mixed_jsonl), "--out", str(tmp_path / "rep"), "--no-chart"])
    r = runner.invoke(app, ["plan", str(tmp_path / "rep/report.json"), "--target",
                            "coding=0.4,math=0.2,general=0.1,tool_calling=0.1,agent=0.1,translation=0.1",
                            "--total", "100", "--candidate", f"more={mixed_jsonl}@1000",
                            "--prompts-per-hour", "20", "--out", str(tmp_path / "plan.md"), "--json",
                            str(tmp_path / "plan.json")])
    assert r.exit_code == 0, r.output
    text = (tmp_path / "plan.md").read_text()
    assert "HiGHS" in text and "| more |" in text and "GPU-hours" in text
    plan = json.loads((tmp_path / "plan.json").read_text())  # what a script reads: the same plan as the table
    take = plan["take"]["more"]
    assert take == plan["new_prompts"] > 0 and f"| more | {take:,} | 1,000 |" in text
    assert abs(sum(plan["expected"].values()) - 100) < 1e-6 and set(plan["expected"]) >= {"coding", "math"}


def test_rebalance_prints_achieved_mix(mixed_jsonl, tmp_path):
    r = runner.invoke(app, ["rebalance", str(mixed_jsonl), "--target", "coding=0.5,math=0.5", "--total", "10",
                            "--out", str(tmp_path / "o.jsonl"), "--seed", "3"])
    assert r.exit_code == 0, r.output
    assert "| coding | 10 | 5 | 50.00% | 50.00% |" in r.output


def test_bad_input_gives_clear_errors(mixed_jsonl, tmp_path):
    cases = [
        (["rebalance", str(mixed_jsonl), "--target", "cooking=1", "--out", str(tmp_path / "x.jsonl")], "unknown domain 'cooking'"),
        (["rebalance", str(mixed_jsonl), "--target", "coding=0.3", "--out", str(tmp_path / "x.jsonl")], "sum to 0.3"),
        (["report", str(tmp_path / "missing.jsonl")], "does not exist"),
        (["plan", str(mixed_jsonl), "--target", "coding=1", "--total", "10"], "no --candidate"),
        (["plan", str(mixed_jsonl), "--target", "coding=1", "--total", "100", "--candidate", "bad"], "NAME=PATH"),
        (["report", str(mixed_jsonl), "--labels", "coding,coding"], "more than once"),
    ]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cases.append((["report", str(empty), "--out", str(tmp_path / "r")], "holds no samples"))
    unreadable = tmp_path / "bin.jsonl"
    unreadable.write_bytes(b"\xff\xfe\x00garbage\n")
    cases.append((["report", str(unreadable), "--out", str(tmp_path / "r")], "not UTF-8"))
    for args, msg in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output, (args, r.output)


def test_workers_give_the_same_report(mixed_jsonl, tmp_path):
    from flashdraft.mix.classify import RuleClassifier
    from flashdraft.mix.report import compose_path

    one = compose_path(mixed_jsonl, RuleClassifier(), examples=0, batch_size=7)
    two = compose_path(mixed_jsonl, RuleClassifier(), examples=0, batch_size=7, workers=2)
    assert one.to_json() == two.to_json()
