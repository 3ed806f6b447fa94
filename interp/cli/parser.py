"""The `interp` command's flags: one subparser per command, each naming its handler; parsing them
imports no torch."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable, NoReturn

from interp.cli.audit import cmd_audit_leakage
from interp.cli.circuit import cmd_circuit
from interp.cli.commands import cmd_claims, cmd_demo, cmd_heads, cmd_report, cmd_scan, cmd_train, cmd_verify
from interp.cli.common import AUDIT_PROMPTS_DEFAULT, DEFAULT_SPEC, PROMPTS_DEFAULT
from interp.cli.output import JSON_SCHEMA, print_error, toolkit_version
from interp.cli.qk import cmd_qk
from interp.launch import add_flags as add_scale_flags
from interp.schemas import REPORT_SCHEMA
from interp.validate import SEED_MAX  # the API's seed range too: interp.validate.check_seed


class _Formatter(argparse.HelpFormatter):
    """Descriptions and epilogs filled to the terminal's width (argparse reads $COLUMNS, else the terminal).

    Each line of the text is one paragraph, filled at word boundaries; an indented line (an example, a
    file format) keeps its indent, and its continuation lines are indented four spaces more. Nothing
    is broken inside a word, nor after a hyphen.
    """

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(_fill_line(line, width, indent) for line in text.splitlines())

    def _split_lines(self, text: str, width: int) -> list[str]:
        """An option's help at spaces only: argparse's own wrap also breaks after hyphens ("toy-/induction")."""
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (`interp report: error: argument --n: ...`) are filled to the
    terminal as every other error line (`output.print_error`); subparsers are of the same class.

    No abbreviations (`allow_abbrev=False`): `interp scan --out x` is an unknown option, never taken for the
    prefix of another flag, and a flag added later cannot change what an old command line means."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print_error(f"{self.prog}: error: {message}")
        self.exit(2)


def _fill_line(line: str, width: int, indent: str) -> str:
    """One line of a description filled to `width` at spaces, keeping its leading indent."""
    import textwrap

    if not line.strip():
        return ""
    own = line[: len(line) - len(line.lstrip())]
    return textwrap.fill(line.strip(), width, initial_indent=indent + own,
                         subsequent_indent=indent + own + ("    " if own else ""), break_long_words=False,
                         break_on_hyphens=False)


def _add_common(p: argparse.ArgumentParser, *, n: str | None = str(PROMPTS_DEFAULT), json_: bool = True,
                seed: bool = True, backend: bool = True) -> None:
    """The flags most commands share; `n` is the default number of prompts as the help says it (None: no --n)."""
    if seed:
        p.add_argument("--seed", type=_seed, default=0, help="seed of every random choice (prompts, resampling); default 0")
    if n is not None:
        p.add_argument("--n", type=_positive_int, default=None, metavar="N", help=f"number of prompts (default: {n})")
    if json_:
        p.add_argument("--json", metavar="FILE|-", default=None, help="also write the result as JSON to FILE, or to stdout with -")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars or status lines")
    if not backend:
        return
    p.add_argument("--backend", choices=("auto", "native", "sdpa", "bridge"), default="auto",
                   help="how a Hugging Face model is hooked: native conversion, sdpa interception or the "
                        "TransformerLens bridge; auto (default) converts natively when it can")
    p.add_argument("--allow-download", action="store_true",
                   help="download a Hugging Face hub id (org/name[@revision]) missing from the local cache "
                        "(never while HF_HUB_OFFLINE=1); without it, hub ids load from the cache only")


def _add_prompts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", metavar="KIND|FILE", default=None,
                   help="prompt kind (repeated, random, text) or a file (.txt one text a line, .json token-id lists); default: repeated")
    p.add_argument("--prefix-len", type=_positive_int, default=None, metavar="N", help="repeated prompts: length of the repeated block")


def _add_behaviour(p: argparse.ArgumentParser) -> None:
    p.add_argument("--behaviour", choices=["next-token", "masked-lm", "embedding"], default=None,
                   help="what necessity, sufficiency, faithfulness and importance measure: next-token loss, masked-LM "
                        "loss, or the sentence-embedding change (default: the model's own: next-token for a causal LM, "
                        "embedding for an encoder)")


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", metavar="L,L|A-B", default=None, help="only these layers, e.g. 0,1 or 0-3")
    p.add_argument("--heads", metavar="LxHy,...", default=None, help="only these heads, e.g. L0H1,L1H2")


DEFAULT_MAX_LEN = 256  # interp.analyses.leakage.DEFAULT_MAX_LEN (tested equal; not imported: no torch for --help)


def _max_len(text: str) -> int | str:
    """--max-len: a length of at least 2 tokens, or "ctx" (the model's whole context)."""
    if text.strip().lower() == "ctx":
        return "ctx"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of tokens nor 'ctx' (the whole context)") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value}: a leak needs at least two positions; pass 2 or more, or ctx")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def number_in(low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False,
              hint: str = "") -> Callable[[str], float]:
    """An argparse type for a float flag: a finite number (NaN and infinities refused) in [low, high], each end open
    when asked; the message names the range and `hint` (what a sensible value is). Every float flag uses one."""
    interval = (f"{'(' if low_open else '['}{'-inf' if low is None else f'{low:g}'}, "
                f"{'inf' if high is None else f'{high:g}'}{')' if high_open or high is None else ']'}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number{'; ' + hint if hint else ''}") from None
        inside = math.isfinite(value) and (low is None or (value > low if low_open else value >= low)) and \
            (high is None or (value < high if high_open else value <= high))
        if not inside:
            raise argparse.ArgumentTypeError(f"{text} is outside {interval}{'; ' + hint if hint else ''}")
        return value

    parse.__name__ = "number"  # argparse names the type in some messages
    return parse


# --tol: below 0.05, or real leaks would read as rounding (the audit itself refuses more than 0.01 for float32 models)
_tol = number_in(0, 0.05, low_open=True, high_open=True,
                 hint="pass a positive finite value below 0.05 (default 5e-5; rounding measures <= 3e-5 in float32)")
# --threshold: a fraction of the clean-vs-patched gap
_fraction = number_in(0, 1, high_open=True, hint="pass a fraction of the gap such as 0.01")


def _seed(text: str) -> int:
    """--seed: an integer in [0, 2**32 - 1] (a larger one overflows torch's generators)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 2**32 - 1]; pass a smaller non-negative seed")
    return value


SPEC_HELP = (f"model spec: built-in name (e.g. smollm2-135m), checkpoint path, GGUF file, package.module:factory, HF "
             f"folder or hub id org/name[@revision] (default: {DEFAULT_SPEC})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="interp",
        description="Look inside attention, and test what you think you see.",
        epilog=(
            "examples:\n"
            "  interp report                  # report on the embedded toy-induction model\n"
            "  interp audit-leakage my_pkg.models:gpt --json -\n"
            "  interp claims toy-induction examples/claims.toml --strict\n\n"
            "exit codes: 0 ok, 1 a finding (leak, failed check, refuted claim with --strict, empty circuit), 2 bad "
            "input (a flag, a file, a model that fails), 3 an internal error (a bug of interp: please report it with "
            "the traceback printed).\n\n"
            "--json writes {command, model, version, schema, result} (see CHANGELOG.md for schema changes).\n\n"
            "Run `interp COMMAND --help` for each command's options."
        ),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action=_VersionAction, help="print the toolkit's version and the JSON and report schema versions, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def command(name: str, handler: Callable, summary: str, example: str, description: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(
            name, help=summary, description=f"{summary}.\n\n{description}".rstrip(),
            epilog=f"example:\n  {example}", formatter_class=_Formatter,
        )
        p.set_defaults(handler=handler)
        return p

    for add in (_report_parser, _audit_parser, _claims_parser, _scan_parser, _heads_parser, _circuit_parser,
                _qk_parser, _verify_parser, _train_parser, _demo_parser):
        add(command)
    return add_scale_flags(parser)  # --workers / --device / --dtype on every command (interp.launch)


class _VersionAction(argparse.Action):
    """`interp --version`: the toolkit's version and the JSON schema's, looked up only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"interp {toolkit_version()} (JSON schema {JSON_SCHEMA}, report schema {REPORT_SCHEMA})")
        parser.exit()


def _report_parser(command) -> None:
    p = command("report", cmd_report, "Write a per-head pattern report (HTML, CSV, Markdown, PNG)",
                "interp report toy-induction --n 64 --out reports/toy --force",
                "One card per head (mean pattern, offset profile, metrics with CIs, claims tested), the leakage "
                "verdict, head similarity and importance, redundancy findings and a methods section.")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_prompts(p)
    _add_selection(p)
    p.add_argument("--out", metavar="DIR", default=None, help="output directory (default: reports/<model>)")
    p.add_argument("--force", action="store_true", help="replace an earlier report in the output directory (only its own files; other files are never deleted)")
    p.add_argument("--claims", metavar="FILE", default=None, help="also test the claims in this TOML claims file")
    _add_behaviour(p)
    p.add_argument("--max-cards", type=_positive_int, default=None, metavar="N",
                   help="most head cards the report may have (default 64; MiniLM-L6 has 72 heads)")
    p.add_argument("--colour-scale", choices=["common", "per_head"], default="common",
                   help="pattern heat maps on one 0-1 scale (default), or each on its own (said on its colour bar)")
    p.add_argument("--max-len", type=_max_len, default=None, metavar="N|ctx",
                   help=f"longest sequence the leakage audit runs (default: the model's context, at most {DEFAULT_MAX_LEN}, "
                        "as audit-leakage; ctx: the whole context)")
    p.add_argument("--bidirectional", action="store_true",
                   help="the model is meant to attend both ways (an encoder): the leakage audit checks padding and "
                        "batch only (as audit-leakage --bidirectional)")
    _add_common(p)


def _audit_parser(command) -> None:
    p = command("audit-leakage", cmd_audit_leakage, "Check that no output position depends on a later token",
                "interp audit-leakage toy-induction --max-len 64 --json audit.json",
                "Truncation, perturbation, gradient and pattern checks; batch mixing, padding. A model must be "
                "causal unless it declares itself an encoder (HookedEncoder, a Hugging Face encoder config) or you "
                "pass --bidirectional. Each leak is located at the line of code where it appears (also in --sarif, "
                "--junit).\n\n"
                "The model runs in a child process: a model that calls sys.exit or os._exit, or crashes, ends the "
                "command with exit 2, and every requested --json / --sarif / --junit file is written on every exit code "
                "(a failure document when the audit could not run).\n\n"
                "Exit 0: causal; 1: a leak, or a check the model calls for could not run; 2: bad input, or a model "
                "that fails; 3: an internal error.")
    p.add_argument("spec", help=SPEC_HELP.replace(" (default: toy-induction)", ""))
    p.add_argument("--max-len", type=_max_len, default=None, metavar="N|ctx",
                   help=f"longest sequence audited (default: the model's context, at most {DEFAULT_MAX_LEN}; ctx: the whole "
                        "context, which can take long: the estimate is printed first)")
    p.add_argument("--tol", type=_tol, default=None, metavar="X",
                   help="relative influence below which a change is numerical noise (default: 5e-5; 5e-3 for float16 "
                        "or bfloat16 weights)")
    p.add_argument("--bidirectional", action="store_true",
                   help="the model is meant to attend both ways (an encoder): audit padding and batch only; without it, "
                        "a model that does not declare itself an encoder must be causal")
    p.add_argument("--no-padding", action="store_true",
                   help="skip the padding check (else a model taking an attention_mask must pass it)")
    p.add_argument("--sarif", metavar="FILE|-", default=None,
                   help="also write SARIF 2.1.0 (one result per leak, at the line where it appears) to FILE or stdout")
    p.add_argument("--junit", metavar="FILE|-", default=None, help="also write JUnit XML (one test case per check)")
    p.add_argument("--packed", action="store_true",
                   help="also audit packed documents: no document may read another, none be cut (the forward must take "
                        "position_ids resetting at each document, cu_seq_lens, or document_ids), e.g. --packed")
    p.add_argument("--doc-sep", type=_doc_sep, default=None, metavar="TOKEN",
                   help="packed documents end with this token id (or eos: the config's eos_token_id), which the model "
                        "finds itself; implies --packed, e.g. --doc-sep 50256")
    p.add_argument("--packed-prompts", metavar="FILE.json", default=None,
                   help="with --doc-sep: your own packed rows (a JSON list of token-id lists, documents separated by "
                        "the token); the first row holding it is audited, e.g. --packed-prompts rows.json")
    p.add_argument("--kv-cache", action="store_true",
                   help="also check that prefill then decode (past_key_values, or a step(tokens, cache) method) equals "
                        "the full forward, e.g. --kv-cache")
    p.add_argument("--window", type=_window, default=None, metavar="W|config",
                   help="also check sliding windows: W keys per windowed layer, itself included (key j visible from "
                        "query i iff i-W < j <= i); config reads sliding_window / layer_types, e.g. --window 4096")
    p.add_argument("--attn-impls", type=_attn_impls, default=None, nargs="?", const="all", metavar="IMPL,IMPL",
                   help="also compare attention implementations (attn_implementation strings; alone: every one the model "
                        "runs), the other contracts asked for run under each, e.g. --attn-impls eager,sdpa,flex_attention")
    p.add_argument("--compiled", action="store_true",
                   help="with --attn-impls: FlexAttention as the model calls it, compiled where it compiles it (slow on "
                        "CPU, float32 only), instead of unfused, e.g. --attn-impls eager,flex_attention --compiled")
    _add_common(p, n=f"{AUDIT_PROMPTS_DEFAULT} per length")


def _doc_sep(text: str) -> int | str:
    """--doc-sep: a token id (at least 0), or "eos" (the model's own eos_token_id)."""
    if text == "eos":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token id: give the integer id of the token that ends each "
                                         "document, or eos") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a token id (ids start at 0)")
    return value


def _window(text: str) -> int | str:
    """--window: the keys a windowed query sees (at least 1), or "config" (the model's declared window)."""
    if text == "config":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a window: give W, the keys a query sees (e.g. 4096), or "
                                         "config") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--window {value}: a window counts the keys a query sees, itself included, "
                                         "so it is at least 1")
    return value


ATTN_IMPLS = ("eager", "sdpa", "flex_attention")


def _attn_impls(text: str) -> tuple[str, ...] | str:
    """--attn-impls: a comma-separated list of attn_implementation strings, or all."""
    if text == "all":
        return text
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ATTN_IMPLS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: give implementations among {', '.join(ATTN_IMPLS)}, separated by "
                                         "commas")
    return names


def _claims_parser(command) -> None:
    p = command("claims", cmd_claims, "Test the claims written in a TOML claims file",
                "interp claims toy-induction examples/claims.toml --strict --json -",
                "FILE format (see interp/specs.py):\n"
                "  model = \"toy-induction\"      # optional when SPEC is given\n"
                "  [prompts]\n  kind = \"repeated\"\n  n = 64\n"
                "  [claims]\n  L1H2 = \"induction\"\n  L0H1 = [\"previous_token\", \"not induction\"]\n"
                "  \"L0H1 ~ L0H3\" = \"redundant\"")
    p.usage = "interp claims [options] [SPEC] FILE"
    p.add_argument("paths", nargs="*", metavar="[SPEC] FILE", help="model spec (optional when the file names one) and the claims file")
    p.add_argument("--list-kinds", action="store_true", help="list the claim kinds a claims file may use, and exit")
    p.add_argument("--strict", action="store_true", help="exit 1 when any claim does not get its expected verdict")
    p.add_argument("--prefix-len", type=_positive_int, default=None, metavar="N", help="override the file's prompts.prefix_len")
    p.add_argument("--seed", type=_seed, default=None, help="override the file's prompts.seed")
    _add_behaviour(p)
    _add_common(p, n=f"the file's prompts.n, else {PROMPTS_DEFAULT}", seed=False)


def _scan_parser(command) -> None:
    p = command("scan", cmd_scan, "Propose a claim for every head and test it on held-out prompts",
                "interp scan toy-induction --n 128 --supported-only")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_prompts(p)
    _add_selection(p)  # on a large model the claims' tests are the cost: scan some layers or heads
    p.add_argument("--supported-only", action="store_true",
                   help="show only supported claims (the footer counts the hidden ones; --json keeps only the shown)")
    _add_behaviour(p)
    _add_common(p)


def _heads_parser(command) -> None:
    p = command("heads", cmd_heads, "Per-head positional and induction metrics with bootstrap CIs",
                "interp heads toy-induction --prompts repeated --n 64 --json heads.json")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_prompts(p)
    _add_selection(p)
    _add_common(p)


def _circuit_parser(command) -> None:
    p = command("circuit", cmd_circuit, "Discover the circuit behind the behaviour, test it and draw it",
                "interp circuit toy-induction --n 64 --png circuit.png --json circuit.json",
                "Edges (SENDER -> RECEIVER via q, k, v, in or direct) are found on half of the prompts (acdc: remove "
                "each edge whose path patch moves the behaviour by less than the threshold; eap: attribution "
                "patching) and tested on the other half: faithfulness, completeness and minimality, each with a CI. "
                "Each kept edge's own path-patching effect on the held-out half is printed and drawn.\n\n"
                "Exit 0: a circuit was found and tested; 1: no edge was kept (an empty circuit, still written to "
                "--json); 2: bad input (including a model that cannot be path patched: it needs pre-norm blocks with "
                "split q/k/v inputs).")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_prompts(p)
    p.add_argument("--method", choices=["acdc", "eap", "nodes"], default="acdc",
                   help="acdc (exact path patches, default), eap (attribution patching: one backward pass) or nodes "
                        "(ACDC over heads and MLPs: one patched forward per node, for large models)")
    p.add_argument("--max-edges", type=_positive_int, default=None, metavar="N",
                   help="ACDC's budget: refuse models with more edges than N, with an estimate of the time (default 5000)")
    p.add_argument("--threshold", type=_fraction, default=None, metavar="X",
                   help="keep an edge whose removal moves the behaviour by at least X of the clean-vs-patched gap "
                        "(default: the method's fixed 0.01)")
    p.add_argument("--png", metavar="FILE", default=None, help="also draw the circuit to FILE (.png)")
    p.add_argument("--curve", action="store_true",
                   help="also MIB's faithfulness curve of the discovery scores over circuit sizes on the held-out half: "
                        "faithfulness per fraction of edges kept with CIs, CPR and CMD with CIs, and 5 random "
                        "rankings as the baseline (JSON: result.curve)")
    _add_behaviour(p)
    _add_common(p)


def _position(text: str) -> int:
    """--query / --against: a position (negative ones count back from the end)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a position (an integer; -1 is the last)") from None


def _key(text: str) -> int | str:
    """--key: a position, or "all" (every key the query sees)."""
    return "all" if text.strip().lower() == "all" else _position(text)


def _qk_parser(command) -> None:
    p = command("qk", cmd_qk, "Why a head attends where it does: its score split into source pairs",
                "interp qk toy-induction --head L1H0 --prompts repeated --index 0",
                "The head's pre-softmax score at (query, key) is split exactly into (query source x key source) terms, "
                "the norm's scale frozen at this forward's: sources are the embeddings, earlier heads (L0H2), MLPs, "
                "biases. The default view splits s(q, k) - s(q, k') against a contrast key k' (the highest-scoring "
                "other key; --against), which equals log p_k - log p_k': why the head prefers k.\n\n"
                "One prompt (--text, or --prompts with --index): each pair's terms; many prompts (--prompts without "
                "--index): their means over prompts with bootstrap CIs. --query defaults to the last token, --key to "
                "the query's highest-attention key. See docs/tutorials/qk-attribution.md.\n\n"
                "Exit 0: attributed; 2: bad input (a head that does not exist, a position out of range, a key after "
                "the query or on padding, --against equal to --key, a post-norm model).")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    p.add_argument("--head", required=True, metavar="LxHy", help="the head to explain, e.g. L1H0")
    p.add_argument("--text", metavar="TEXT", default=None,
                   help="the one prompt, tokenised by the model's tokenizer (toy-induction: symbol ids, '255 5 17 5')")
    _add_prompts(p)
    p.add_argument("--index", type=int, default=None, metavar="I",
                   help="attribute only prompt I of --prompts' set (default: every prompt, averaged)")
    p.add_argument("--query", type=_position, default=None, metavar="Q",
                   help="the query position (default: the last token; negative counts from the end)")
    p.add_argument("--key", type=_key, default=None, metavar="K|all",
                   help="the key position, or all (every key the query sees); default: the query's highest-attention key")
    p.add_argument("--against", type=_position, default=None, metavar="K2",
                   help="the contrast key of the difference (default: the highest-scoring other key)")
    p.add_argument("--top", type=_positive_int, default=5, metavar="N", help="terms shown per pair (default 5)")
    p.add_argument("--view", choices=["difference", "score"], default="difference",
                   help="split s(q, k) - s(q, k') (default: what the softmax sees) or the score s(q, k) itself")
    _add_common(p)


def _verify_parser(command) -> None:
    p = command("verify", cmd_verify, "Prove the model's hooks carry what their names say",
                "interp verify toy-induction",
                "Scores pre-softmax and masked, pattern = softmax(scores), z = pattern @ v, results sum to the "
                "attention output, an edit at each hook changes the output. Prints one line when every check "
                "passes, the table of checks with --verbose or when one fails.\n\n"
                "Exit 0: every check passed; 1: a check failed; 2: bad input.")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    p.add_argument("--verbose", "-v", action="store_true", help="print the table of checks even when all pass")
    _add_common(p, n=None, seed=False)


def _train_parser(command) -> None:
    p = command("train", cmd_train, "Train a shipped model's recipe (arguments pass through)",
                "interp train --task induction --seed 0 --out models/checkpoints/toy-induction",
                "toy-induction and stdlib-bytes: `interp train [--task induction | stdlib-bytes] ...` "
                "(interp.experiments.train); stdlib-bpe: `interp train stdlib-bpe train ...`, then "
                "`interp train stdlib-bpe finish RUN --out NAME` (interp.experiments.stdlib_bpe). Each parses its own "
                "arguments: `-- --help` shows them.\n\nExit 0: trained and written; 2: bad arguments, "
                "nothing written.")
    p.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="arguments for interp.experiments.train, or `stdlib-bpe` and those of interp.experiments.stdlib_bpe")


def _demo_parser(command) -> None:
    p = command("demo", cmd_demo, "Report on the embedded default model and print the strongest findings",
                "interp demo --out reports/toy-induction",
                "Replaces an earlier report in the output directory; refuses any other non-empty directory.")
    p.add_argument("--out", metavar="DIR", default=str(Path("reports") / DEFAULT_SPEC), help="output directory")
    _add_common(p, json_=False, backend=False)  # the embedded model: no backend, no logits key to choose
