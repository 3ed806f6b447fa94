"""The `interp` command: fast help, lazy imports, exit codes, clear errors, JSON output."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interp import cli
from interp.cli import commands, tables
from interp.specs import PROMPT_KINDS, PromptSpec, SpecError, build_prompts, parse_heads_flag, parse_layers_flag

ROOT = Path(__file__).resolve().parents[3]
SUBCOMMANDS = ["report", "audit-leakage", "claims", "scan", "heads", "circuit", "qk", "verify", "train", "demo"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "160"}


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "interp.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=timeout)


# --------------------------------------------------------------------------- help and start-up


def test_help_lists_every_subcommand_and_answers_fast():
    start = time.perf_counter()
    result = run_cli("--help")
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert name in result.stdout
    # a Python start-up is ~0.05 s here; importing torch alone would take ~1.6 s
    assert elapsed < 1.0, f"interp --help took {elapsed:.2f} s"


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_help_has_an_example(name):
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices[name]
    text = sub.format_help()
    assert "example:" in text and f"interp {name}" in text


def test_parsing_flags_imports_neither_torch_nor_transformer_lens():
    code = (
        "import sys; from interp.cli import build_parser; "
        "build_parser().parse_args(['report', 'toy-induction', '--n', '8', '--layers', '0-1']); "
        "build_parser().parse_args(['audit-leakage', 'toy-induction', '--json', '-']); "
        "print(sorted(m for m in ('torch', 'transformer_lens', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "commands" in capsys.readouterr().err


def test_unknown_flag_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["report", "--no-such-flag"])
    assert exit_info.value.code == 2


def _subparsers(parser):
    return parser._subparsers._group_actions[0].choices


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    return " ".join(capsys.readouterr().err.split())


def test_no_parser_takes_abbreviations(capsys):
    """Issue 37 item 4: `interp scan --out x` was parsed as --output (the logits key), a folder became a key."""
    parser = cli.build_parser()
    assert not parser.allow_abbrev and not any(sub.allow_abbrev for sub in _subparsers(parser).values())
    err = _usage_error(["scan", "--out", "reports/x"], capsys)
    assert "interp scan: error: unrecognized arguments: --out" in err
    assert "did you mean --claims?" in _usage_error(["report", "--claim", "c.toml"], capsys)
    assert "unrecognized arguments: --verb" in _usage_error(["verify", "--verb"], capsys)


def test_the_logits_key_is_logits_key_and_the_old_name_says_so(capsys):
    reading = {name for name, sub in _subparsers(cli.build_parser()).items() if "--logits-key" in sub._option_string_actions}
    assert reading == {"report", "audit-leakage", "claims", "scan", "circuit", "verify"}  # every command reading logits
    for name in sorted(reading):
        argv = [name, *(["toy-induction"] if name == "audit-leakage" else []), "--output", "logits"]
        err = _usage_error(argv, capsys)
        assert "--output was renamed --logits-key" in err and "pass --logits-key logits" in err, name
    args = cli.build_parser().parse_args(["verify", "--logits-key", "1"])
    assert args.logits_key == "1"


def test_demo_offers_neither_backend_nor_logits_key(capsys):
    """FD14: --backend and --output cannot apply to the embedded model."""
    demo = _subparsers(cli.build_parser())["demo"]
    assert not {"--backend", "--output", "--logits-key"} & set(demo._option_string_actions)
    assert "unrecognized arguments: --backend native" in _usage_error(["demo", "--backend", "native"], capsys)


def test_the_main_help_lists_every_exit_code():
    """FD13: the help listed 0, 1 and 2; 3 (an internal error) was only in the docs."""
    text = " ".join(cli.build_parser().format_help().split())
    for code in ("0 ok", "1 a finding", "2 bad input", "3 an internal error"):
        assert code in text


def test_the_package_docstring_lists_every_subcommand():
    """Issue 37 item 4: interp/cli/__init__.py's list of subcommands left out `circuit`."""
    listed = {line.split()[1] for line in cli.__doc__.splitlines() if line.strip().startswith("interp ")}
    assert listed == set(_subparsers(cli.build_parser())) == set(SUBCOMMANDS)


@pytest.mark.parametrize("argv, message", [
    (["circuit", "--threshold", "nan"], "nan is outside [0, 1)"), (["circuit", "--threshold", "inf"], "inf is outside"),
    (["circuit", "--threshold", "-0.1"], "-0.1 is outside [0, 1)"),
    (["audit-leakage", "toy-induction", "--tol", "nan"], "nan is outside (0, 0.05)"),
    (["audit-leakage", "toy-induction", "--tol", "0"], "0 is outside (0, 0.05)")])
def test_every_float_flag_refuses_nan_and_values_out_of_range(argv, message, capsys):
    assert message in _usage_error(argv, capsys)


# --------------------------------------------------------------------------- input errors: exit 2, no traceback


@pytest.mark.parametrize(
    "args, message",
    [
        (["heads", "--prompts", "nope"], "unknown prompt kind 'nope'"),
        (["report", "--prompts", "rnd"], "Did you mean 'random'"),
        (["report", "--heads", "L0X"], "'L0X' is not a head label"),
        (["report", "--layers", "a-b"], "expected layer numbers"),
        (["heads", "no-such-model-anywhere"], "cannot load model spec 'no-such-model-anywhere'"),
        (["verify", "no_such_pkg.mod:factory"], "cannot load model spec"),
    ],
)
def test_input_errors_exit_2_with_a_message_and_no_traceback(args, message, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_prompt_spec_parsing():
    assert PromptSpec.parse(None) == PromptSpec()
    assert PromptSpec.parse("random", n=8, seed=3) == PromptSpec(kind="random", n=8, seed=3)
    with pytest.raises(SpecError, match="must be a positive integer"):
        PromptSpec(n=0)
    with pytest.raises(SpecError, match=r"prompt file 'missing\.txt' does not exist"):
        PromptSpec.parse("missing.txt")
    assert set(PROMPT_KINDS) == {"repeated", "random", "text"}


def test_head_and_layer_flags():
    assert parse_heads_flag("L0H1, L1H2") == ((0, 1), (1, 2))
    assert parse_layers_flag("0,2-3") == (0, 2, 3)
    assert parse_heads_flag(None) is None and parse_layers_flag(None) is None


def test_build_prompts_follows_the_models_bos_and_context():
    from interp.models.constructed import induction_circuit

    model = induction_circuit(n_ctx=32)
    prompts = build_prompts(model, PromptSpec(n=4, seed=1))
    assert prompts.tokens.shape == (4, 1 + 2 * 15)  # BOS + twice min(20, (32 - 1) // 2)
    assert (prompts.tokens[:, 0] == 63).all() and (prompts.tokens[:, 1:] < 63).all()
    with pytest.raises(SpecError, match="does not fit the model's context"):
        build_prompts(model, PromptSpec(n=4, prefix_len=16))


def test_json_prompt_file(tmp_path):
    from interp.models.constructed import induction_circuit

    path = tmp_path / "prompts.json"
    path.write_text("[[1, 2, 3], [4, 5]]")
    prompts = build_prompts(induction_circuit(n_ctx=16), PromptSpec.parse(str(path)))
    assert prompts.tokens.tolist() == [[1, 2, 3], [4, 5, 0]]
    assert prompts.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    path.write_text("[[1, 2,")
    with pytest.raises(SpecError, match=r"prompts\.json:1:\d+: not valid JSON"):
        build_prompts(induction_circuit(n_ctx=16), PromptSpec.parse(str(path)))


# --------------------------------------------------------------------------- commands on constructed models


@pytest.mark.heavy
def test_heads_json_to_stdout_is_parseable_and_finds_the_constructed_roles():
    result = run_cli("heads", "interp.models.constructed:induction_circuit", "--n", "12", "--json", "-")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["command"] == "heads" and document["model"] == "interp.models.constructed:induction_circuit"
    rows = {row["label"]: row for row in document["result"]["heads"]}
    assert all(type(row["layer"]) is int and type(row["head"]) is int for row in rows.values())
    assert rows["L0H0"]["prev_token"] == pytest.approx(1.0, abs=1e-6)
    assert rows["L1H0"]["induction"] == pytest.approx(1.0, abs=1e-6)
    assert rows["L0H1"]["first_token"] == pytest.approx(1.0, abs=1e-6)
    assert rows["L0H0"]["prev_token_ci_low"] <= rows["L0H0"]["prev_token"] <= rows["L0H0"]["prev_token_ci_high"]
    assert "Heads of" in result.stderr  # the human table moves to stderr when JSON takes stdout


def test_heads_selection_narrows_rows(capsys):
    assert cli.main(["heads", "interp.models.constructed:induction_circuit", "--n", "8", "--heads", "L1H0,L0H0", "-q",
                     "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["result"]["heads"]
    assert [r["label"] for r in rows] == ["L0H0", "L1H0"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_gpt):
    import interp

    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    interp.save(tiny_gpt, path)
    return str(path)


def test_verify_passes_on_a_saved_checkpoint(checkpoint, capsys):
    assert cli.main(["verify", checkpoint, "-q", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    rows = result["checks"]
    assert rows and all(r["passed"] for r in rows) and result["n_failed"] == 0 and result["n_checks"] == len(rows)
    # layers are integers (null for model-wide checks), never 0.0
    assert {type(r["layer"]) for r in rows} <= {int, type(None)} and any(type(r["layer"]) is int for r in rows)


def test_verify_table_prints_layers_as_integers(checkpoint, capsys):
    assert cli.main(["verify", checkpoint, "-q", "--verbose"]) == 0  # all pass: the table only with --verbose
    out = capsys.readouterr().out
    assert "│ 0     │" in out and "0.000" not in out


def test_verify_exit_1_when_a_check_fails(capsys):
    # the constructed heads are saturated (score gap 40): noise on q or k moves nothing, which verify reports
    assert cli.main(["verify", "interp.models.constructed:induction_circuit", "-q"]) == 1
    assert "checks passed" in capsys.readouterr().out


def test_json_to_an_unwritable_place_is_an_input_error(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    code = cli.main(["heads", "interp.models.constructed:induction_circuit", "--n", "8", "-q", "--json", str(target / "out.json")])
    assert code == 2
    assert f"--json {target / 'out.json'}: {target} is a file, not a folder" in capsys.readouterr().err


# --------------------------------------------------------------------------- audit-leakage exit codes


@pytest.fixture
def zoo_specs(tmp_path, monkeypatch):
    """`package.module:factory` specs for a correct and a leaky zoo model (zoo factories take a seed)."""
    (tmp_path / "zoo_specs.py").write_text(
        "from interp.models.zoo import ZOO\n"
        "def correct():\n    return ZOO['masked_fill'].build(0)\n"
        "def leaky():\n    return ZOO['off_by_one'].build(0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "zoo_specs:correct", "zoo_specs:leaky"


def test_audit_leakage_exit_0_when_causal(zoo_specs, capsys):
    assert cli.main(["audit-leakage", zoo_specs[0], "--max-len", "12", "-q"]) == 0
    assert "causal" in capsys.readouterr().out


def test_audit_leakage_exit_1_on_a_leak_with_json(zoo_specs, tmp_path, capsys):
    target = tmp_path / "audit.json"
    assert cli.main(["audit-leakage", zoo_specs[1], "--max-len", "12", "-q", "--json", str(target)]) == 1
    out = capsys.readouterr().out
    assert "LEAK (future)" in out and "blocks.0.mixer" in out
    document = json.loads(target.read_text())
    assert document["command"] == "audit-leakage" and document["model"] == zoo_specs[1]
    result = document["result"]
    assert result["causal"] is False and result["first_leaking_site"] == "blocks.0.mixer"


def test_audit_leakage_bad_input_exit_2(zoo_specs, capsys):
    assert cli.main(["audit-leakage", "interp.models.constructed:induction_circuit", "--max-len", "4096", "-q"]) == 2
    err = capsys.readouterr().err
    assert "exceeds the model's context" in err and "Traceback" not in err


@pytest.mark.heavy
def test_scan_json_lists_verdicts_for_every_head(capsys):
    assert cli.main(["scan", "interp.models.constructed:induction_circuit", "--n", "64", "-q", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    rows = result["claims"]
    assert result["shown"] == "all" and result["n_hidden"] == 0 and sum(result["counts"].values()) == len(rows)
    verdicts = {(r["label"], r["claim"]): r["verdict"] for r in rows}
    assert verdicts[("L0H0", "previous_token")] == "supported"
    assert verdicts[("L1H0", "induction")] == "supported"
    assert {r["label"] for r in rows} == {f"L{l}H{h}" for l in range(2) for h in range(4)}


def test_scan_of_some_heads(capsys):
    """--layers / --heads: only those heads get claims (on a large model their tests are the cost)."""
    assert cli.main(["scan", "interp.models.constructed:induction_circuit", "--n", "64", "--heads", "L1H0,L0H0", "-q",
                     "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["result"]["claims"]
    assert {r["label"] for r in rows} == {"L0H0", "L1H0"}
    assert cli.main(["scan", "interp.models.constructed:induction_circuit", "--layers", "7", "-q"]) == 2


def test_train_passes_its_arguments_through(capsys):
    assert cli.main(["train", "--", "--help"]) == 0
    assert "usage: interp train [-h] [--task {induction,stdlib-bytes}]" in capsys.readouterr().out
    assert cli.main(["train", "--task", "nonsense", "--out", "x"]) == 2  # interp.experiments.train's own usage error
    assert cli.main(["train", "stdlib-bpe", "--", "--help"]) == 0
    assert "usage: interp train stdlib-bpe [-h] {train,finish}" in capsys.readouterr().out
    assert cli.main(["train", "stdlib-bpe", "finish"]) == 2  # interp.experiments.stdlib_bpe's: RUN and --out missing
    assert "the following arguments are required: run, --out" in capsys.readouterr().err


@pytest.mark.heavy
def test_demo_reports_on_the_embedded_default_and_replaces_its_own_report(tmp_path, capsys, monkeypatch):
    out = tmp_path / "demo"
    monkeypatch.setenv("COLUMNS", "80")  # the findings table fits 80 columns, the narrowest tested (issue 23)
    assert cli.main(["demo", "--out", str(out), "-q"]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert f"report written to {out}" in text.replace("\n", "") and "Strongest findings" in text
    assert "induction" in text  # toy-induction's induction heads are among the findings
    assert (out / "report.html").is_file() and (out / "heads.csv").is_file()
    assert cli.main(["demo", "--out", str(out), "-q"]) == 0  # a second demo replaces the first report


@pytest.mark.heavy
def test_report_json_on_stdout_stays_parseable_with_progress_on(tmp_path):
    result = run_cli("report", "--out", str(tmp_path / "r"), "--n", "24", "--json", "-")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # progress bars and tables went to stderr
    assert document["command"] == "report" and document["model"] == "toy-induction"
    assert document["result"]["leakage"]["causal"] is True
    assert document["result"]["out_dir"] == str(tmp_path / "r") and (tmp_path / "r" / "report.html").is_file()
    # one bar over computing (8 analyses, the viewer's data and the circuit), rendering and writing (2)
    assert "13/13 stages" in result.stderr


# --------------------------------------------------------------------------- output shape (issue 12)


def test_version_flag_prints_the_toolkit_and_schema_versions():
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    from interp.schemas import REPORT_SCHEMA

    assert result.stdout.strip() == (f"interp {cli.toolkit_version()} (JSON schema {cli.JSON_SCHEMA}, "
                                     f"report schema {REPORT_SCHEMA})")


def test_envelope_has_one_shape_and_integers_stay_integers():
    document = cli.envelope("heads", "toy-induction", {"heads": [{"layer": 0.0, "head": 3.0, "score": 1.0, "x": float("nan")}],
                                                      "nested": {"n_prompts": 24.0, "offset": -1.0}})
    assert set(document) == {"command", "model", "version", "schema", "result", "error"} and document["error"] is None
    assert document["schema"] == cli.JSON_SCHEMA and document["command"] == "heads"
    row = document["result"]["heads"][0]
    assert type(row["layer"]) is int and type(row["head"]) is int and row["x"] is None
    assert type(row["score"]) is float  # a metric that happens to be 1.0 stays a float
    assert document["result"]["nested"] == {"n_prompts": 24, "offset": -1}
    assert cli.integers({"layer": 0.5}) == {"layer": 0.5}  # only integral values are converted
    assert cli.integers({"p": float("inf"), "q": [float("-inf"), 2.5]}) == {"p": None, "q": [None, 2.5]}  # valid JSON


def test_scan_footer_counts_what_supported_only_hides():
    counts = {"supported": 3, "refuted": 2, "inconclusive": 5}
    assert commands._scan_footer(counts, True).startswith("3 supported shown; 2 refuted and 5 inconclusive hidden by --supported-only")
    assert commands._scan_footer(counts, False).startswith("3 supported, 2 refuted, 5 inconclusive")
    assert "none hidden" in commands._scan_footer({"supported": 4, "refuted": 0, "inconclusive": 0}, True)


@pytest.mark.heavy
def test_scan_supported_only_reports_the_hidden_claims(capsys):
    assert cli.main(["scan", "interp.models.constructed:induction_circuit", "--n", "64", "--supported-only", "--json", "-"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)["result"]
    assert result["shown"] == "supported" and all(r["verdict"] == "supported" for r in result["claims"])
    assert result["n_hidden"] == sum(result["counts"].values()) - result["counts"]["supported"]
    assert "supported shown" in captured.err and "0 refuted, 0 inconclusive" not in captured.err


def test_headers_break_only_at_underscores_and_hidden_columns_are_counted():
    columns = ["label", "prev_token", "duplicate_token", "n_prompts"]
    cells = {"label": ["L0H0"], "prev_token": ["0.875"], "duplicate_token": ["0.001"], "n_prompts": ["24"]}
    split, dropped = tables._fit_columns(columns, cells, 200)
    assert not any(split.values()) and dropped == []
    split, dropped = tables._fit_columns(columns, cells, 44)
    assert all(split.values()) and dropped == []
    assert tables._header_lines("duplicate_token", True) == ["duplicate_", "token"]
    split, dropped = tables._fit_columns(columns, cells, 30)
    assert dropped == ["duplicate_token", "n_prompts"][-len(dropped):] and dropped
    split, dropped = tables._fit_columns(columns, cells, 36, drop_first=("prev_token",))
    assert dropped == ["prev_token"]  # the caller's least useful column goes first
    # text with spaces wraps at them: it needs only its longest word
    assert tables._column_need("name", {"name": ["L1H3: not previous_token"]}, False) == len("previous_token")
    assert commands._cut("one two three four", 12) == "one two ..." and commands._cut("short", 12) == "short"


@pytest.mark.parametrize("width", [80, 120])
def test_heads_table_fits_the_terminal_without_breaking_words(width, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main(["heads", "interp.models.constructed:induction_circuit", "--n", "8", "-q"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width
    header = [line for line in lines if line.startswith("┃")]
    words = {w for line in header for w in line.strip("┃").replace("┃", " ").split()}
    metric_parts = {"label", "prev_", "prev_token", "token", "self_", "self_token", "first_", "first_token", "local_",
                    "local_window", "window", "mean_", "mean_distance", "distance", "entropy", "induction", "duplicate_",
                    "duplicate_token", "copying", "n_", "n_prompts", "prompts"}
    assert words and words <= metric_parts, words - metric_parts  # every header piece is a word or a word_
    assert "CIs" in out and "all in --json" in out
    if width == 80:
        assert "not shown at 80 columns" in out


@pytest.mark.heavy
def test_report_progress_covers_rendering_and_writing(tmp_path):
    """The report's stages run in one bar that ends after the files are in place (it said "done" before
    plotting and HTML, a third of the time, had started)."""
    from interp.analyses import report
    from interp.models.constructed import induction_circuit
    from interp.progress import Stages
    from interp.specs import PromptSpec

    stages = Stages([], enabled=False)
    result = report.build_report(induction_circuit(), tmp_path / "r", prompt_spec=PromptSpec(n=12), progress=stages)
    run = list(stages.timings)  # in the order they ran
    assert run[-2:] == report.RENDER_STAGES and "leakage audit" in run[:-2] and set(run) == set(stages.names)
    assert set(report.RENDER_STAGES) <= set(result.timings) and (tmp_path / "r" / "report.html").is_file()


@pytest.mark.heavy
def test_claims_json_carries_each_evidence_with_its_power_and_per_prompt_values(tmp_path, monkeypatch, capsys):
    """`interp claims --json`: every claim's `evidence` (`Evidence.to_dict()`), with `write_change` and the per-prompt
    `values`. On the positional sender the path patch of L0H0's edge is exactly 0 without power: inconclusive, the zero
    ablation beside it (issue 42)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text('[prompts]\nkind = "repeated"\nn = 32\nprefix_len = 2\n'
                                     '[claims]\n"L0H0 -> L1H0 via k" = "composes"\n')
    assert cli.main(["claims", "interp.models.handbuilt:positional_sender", "c.toml", "-q", "--json", "-"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["result"]["claims"]
    assert row["verdict"] == "inconclusive" and "does not change L0H0's write" in row["reasons"]
    evidence = {e["kind"]: e for e in row["evidence"]}
    assert list(evidence) == ["observational", "necessity", "zero", "qk_attribution"]
    observational = evidence["observational"]
    assert observational["values"] == [0.0] * 32 and observational["write_change"] == 0.0
    assert observational["passed"] is None and observational["effect"] == 0.0
    assert evidence["zero"]["effect"] > 1.0 and len(evidence["zero"]["values"]) == 32
