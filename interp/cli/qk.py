"""`interp qk`: why a head attends where it does, as exact (query source x key source) terms of its score.

One prompt (`--text`, or `--prompts KIND|FILE --index I`): each attributed (query, key) pair with its contrast
key, and its `--top` largest terms. Many prompts (`--prompts` without `--index`): the terms' means over the
prompts with bootstrap CIs. Either way, each side's sources summed over the other side (`by_source`)."""
from __future__ import annotations

from typing import Any

from interp.cli.common import DEFAULT_SPEC, EXIT_OK, PROMPTS_DEFAULT, _load, _prompt_spec, _prompts
from interp.cli.output import _emit_json, _frame_records, _out_console
from interp.cli.tables import _frame_table
from interp.errors import BadInput

BY_SOURCE_ROWS = 3  # sources per side in the terminal's by-source table (--json keeps them all)


def cmd_qk(args) -> int:
    from interp.analyses import qk
    from interp.heads import parse_head

    head = parse_head(args.head)  # a malformed label fails before the model loads
    _check_flags(args)
    spec = args.spec or DEFAULT_SPEC
    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"),
                  allow_download=getattr(args, "allow_download", False))
    prompts, described = _chosen_prompts(model, args)
    query = _default_query(prompts) if args.query is None else args.query
    try:
        att = qk.attribute(model, prompts, head, query=query, key=args.key, against=args.against)
        att.matrix(args.view)  # a view with no pair (the difference view at query 0) is refused here, before printing
    except BadInput as error:
        raise BadInput(_as_flags(str(error))) from error
    console = _out_console(args)
    single = len(prompts) == 1
    if single:
        _print_pairs(console, att, args, spec, described, model)
    else:
        _print_aggregate(console, att, args, spec, described)
    by_source = att.by_source(args.view)
    console.print(_frame_table(_strongest(by_source), title=f"Each side's {BY_SOURCE_ROWS} largest sources", width=console.width,
                               columns=["side", "source", "mean", "ci_low", "ci_high"] if not single else
                               ["side", "source", "mean"]))
    console.print(f"Score units (q . k x attn.scale, before the softmax). A source's total is its row or column of "
                  f"terms summed; the norm's scale is frozen at this forward's, so the terms sum exactly to the "
                  f"{'score difference' if args.view == 'difference' else 'score'}.")
    result: dict[str, Any] = {"view": args.view, "prompts": described, "attribution": att.to_dict(top=args.top),
                              "by_source": _frame_records(by_source)}
    if not single:
        result["aggregate"] = _frame_records(_largest(att.aggregate(args.view), args.top))
    _emit_json(args, "qk", spec, result)
    return EXIT_OK


def _as_flags(message: str) -> str:
    """The API's refusal worded as the command's flags: `key=None` -> `no --key`, `query=5` -> `--query 5`."""
    import re

    message = re.sub(r"\b(query|key|against)=None", r"no --\1", message)
    message = re.sub(r"\b(query|key|against)=", r"--\1 ", message)
    return message.replace("view='score'", "--view score")


def _check_flags(args) -> None:
    """Combinations the flags cannot mean, refused before the model loads."""
    if args.text is not None:
        for flag, value in (("--prompts", args.prompts), ("--index", args.index), ("--n", args.n),
                            ("--prefix-len", args.prefix_len)):
            if value is not None:
                raise BadInput(f"--text gives the one prompt; {flag} chooses prompts of a set. Pass --text TEXT alone, "
                               "or --prompts KIND|FILE [--index I] without --text.")
        if not args.text.strip():
            raise BadInput("--text is empty; pass the prompt's text, e.g. --text '255 5 17 9 5' for toy-induction's "
                           "symbol tokens.")
    else:
        _prompt_spec(args)
    if args.index is not None and args.index < 0:
        raise BadInput(f"--index {args.index}: expected a prompt's index in the set, 0 or more.")


def _chosen_prompts(model, args) -> tuple[Any, dict[str, Any]]:
    """The prompts attributed, and how they were chosen (for the title and the JSON)."""
    if args.text is not None:
        import interp.data as data
        from interp.modelinfo import context_length

        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise BadInput(f"{type(model).__name__} has no tokenizer, so --text cannot be tokenised; pass "
                           "--prompts FILE.json --index I (a JSON list of token-id lists) instead.")
        try:
            prompts = data.text_prompts(args.text, tokenizer, n_ctx=context_length(model))
        except ValueError as error:
            raise BadInput(f"--text: {error}") from error
        return prompts, {"text": args.text}
    prompts = _prompts(model, args, default_n=PROMPTS_DEFAULT)  # --index I: prompt I of the set other commands see
    described: dict[str, Any] = {"kind": prompts.kind, "n": len(prompts)}
    if args.index is None:
        return prompts, described
    if args.index >= len(prompts):
        raise BadInput(f"--index {args.index} is past the {len(prompts)} prompts of this set (0..{len(prompts) - 1}); "
                       "choose one of them, or pass --n larger.")
    return prompts[args.index], {**described, "index": args.index}


def _default_query(prompts) -> int:
    """The last real token: of the one prompt, or of every prompt when they are all as long."""
    lengths = prompts.real_mask().sum(1)
    last = prompts.real_mask().cumsum(1).argmax(1)  # (prompt,) the last real position
    if len(prompts) > 1 and not bool((last == last[0]).all()):
        raise BadInput(f"the prompts are of different lengths ({int(lengths.min())}..{int(lengths.max())} tokens), so "
                       "they have no common last position; pass --query Q (a position real in every prompt), or "
                       "--index I to attribute one prompt.")
    return int(last[0])


def _print_pairs(console, att, args, spec: str, described: dict[str, Any], model) -> None:
    """One prompt: each (query, key) pair's line, then its --top terms."""
    from interp.viewer import token_strings

    pairs = att.pairs if args.view == "score" else att.pairs[att.pairs["against"] >= 0]
    where = "--text" if "text" in described else f"{described['kind']} prompt {described['index']}"
    tokens = att.pairs[["query_token", "key_token", "against_token"]].to_numpy().ravel().tolist()
    names = dict(zip(tokens, token_strings(model, [max(t, 0) for t in tokens])))
    for r in pairs.head(3).itertuples():
        line = (f"{att.label} of {spec} on {where}: query {r.query} ({names[r.query_token]!r}) gives key {r.key} "
                f"({names[r.key_token]!r}) weight {r.weight:.3f}, score {r.score:.3f}")
        if r.against >= 0:
            line += (f"; against key {r.against} ({names[r.against_token]!r}, weight {r.against_weight:.3f}, score "
                     f"{r.against_score:.3f}): difference {r.difference:.3f} = log p_k - log p_k'")
        console.print(line)
    if len(pairs) > 3:
        console.print(f"... {len(pairs) - 3} more pairs (--json lists them all)")
    top = att.top(args.top, args.view)
    columns = ["rank", "query_source", "key_source", "contribution", "share"]
    if len(pairs) > 1:
        columns = ["query", "key", "against"] + columns
    what = "s(q, k) - s(q, k')" if args.view == "difference" else "s(q, k)"
    console.print(_frame_table(top, title=f"The {args.top} largest terms of {what}",
                               columns=columns, width=console.width))


def _print_aggregate(console, att, args, spec: str, described: dict[str, Any]) -> None:
    """Many prompts: the --top largest mean terms over prompts, with their CIs."""
    pairs = att.pairs if args.view == "score" else att.pairs[att.pairs["against"] >= 0]
    total = pairs["difference" if args.view == "difference" else "score"]
    console.print(f"{att.label} of {spec} on {described['n']} {described['kind']} prompts, {len(pairs)} (query, key) pairs: "
                  f"mean {'score difference' if args.view == 'difference' else 'score'} {total.mean():.3f}, "
                  f"mean weight {pairs['weight'].mean():.3f}")
    console.print(_frame_table(_largest(att.aggregate(args.view), args.top),
                               title=f"The {args.top} largest mean terms (95% CIs)",
                               columns=["query_source", "key_source", "mean", "ci_low", "ci_high", "n_prompts"],
                               width=console.width))


def _largest(frame, n: int):
    """The `n` rows of largest |mean|."""
    return frame.loc[frame["mean"].abs().sort_values(ascending=False, kind="stable").index[:n]].reset_index(drop=True)


def _strongest(by_source):
    """Each side's BY_SOURCE_ROWS sources of largest |mean|, query side first."""
    import pandas as pd

    return pd.concat([_largest(part, BY_SOURCE_ROWS) for _, part in by_source.groupby("side", sort=False)],
                     ignore_index=True)
