"""Pilot for issue #25: do induction heads form on the stdlib corpus within the CPU budget?

    OMP_NUM_THREADS=1 PYTHONPATH=. python pilots/induction_pilot.py --tokenizer regex --ctx 128 --batch 8 \
        --lr 2e-3 --minutes 10 --out pilots/logs/regex-c128-b8.json

Tokenizer "regex": Python source split by a fixed regex (identifiers, digit runs, newline+indentation,
space runs, single punctuation); vocabulary = the 256 byte values + the most frequent multi-byte pieces
of the *training* split (ties broken by the piece's bytes, so deterministic); a piece not in the
vocabulary falls back to its bytes. Tokenizer "bytes": the 256 byte values.

Every --eval-every steps it measures on held-out text (never trained on):
- natural induction (k=1, k=2): the toolkit's score (`interp.analyses.induction.scores_per_prompt`) on
  held-out windows of one file each, Repeats(match_len=k), best head;
- planted induction: on `textcorpus.planted_repeats` (text, span, span again), best head, and the
  planted copy gap (loss on the second copy vs the first);
- previous-token: mean attention q -> q-1, best head;
- in-context learning score: mean loss at a late position minus an early one (positions recorded);
- held-out loss (nats/token and bits/byte using the held-out tokens/byte).
No planted or duplicated spans in the training stream. One thread (torch.set_num_threads(1)).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path

import torch

torch.set_num_threads(1)

from interp.analyses.induction import scores_per_prompt  # noqa: E402
from interp.data import PromptSet, Repeats  # noqa: E402
from interp.models.config import GPTConfig  # noqa: E402
from interp.models.gpt import HookedGPT  # noqa: E402
from interp.models.textcorpus import load_corpus, planted_repeats, random_windows, text_windows  # noqa: E402

PIECE = re.compile(rb"\n[ \t]*|[ \t]+|[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[^A-Za-z0-9_\s]|\s")


def build_vocab(train: bytes, size: int) -> list[bytes]:
    counts = Counter(p for p in PIECE.findall(train) if len(p) > 1)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [p for p, _ in ranked[: size - 256]]


def encode(data: bytes, table: dict[bytes, int]) -> torch.Tensor:
    out: list[int] = []
    for piece in PIECE.findall(data):
        i = table.get(piece)
        if i is None:
            out.extend(piece)
        else:
            out.append(i)
    return torch.tensor(out, dtype=torch.long)


def attn_patterns(model, tokens):
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    return [cache[f"blocks.{l}.attn.hook_pattern"] for l in range(model.cfg.n_layers)]  # (b, h, q, k)


@torch.no_grad()
def measure(model, natural, planted, prefix_len, offset, early, late):
    row = {}
    for k in (1, 2):
        ps = PromptSet(natural, repeats=Repeats(match_len=k))
        s = scores_per_prompt(model, ps, batch_size=32)["induction"].nanmean(0)  # (layer, head)
        row[f"ind_nat_k{k}"] = round(float(s.max()), 4)
        row[f"ind_nat_k{k}_head"] = "L%dH%d" % divmod(int(s.argmax()), s.shape[1])
    ps = PromptSet(planted, repeats=Repeats(period=prefix_len, offset=offset, n_repeats=2))
    s = scores_per_prompt(model, ps, batch_size=32)["induction"].nanmean(0)
    row["ind_planted"] = round(float(s.max()), 4)
    row["ind_planted_head"] = "L%dH%d" % divmod(int(s.argmax()), s.shape[1])
    prev = []
    for pat in attn_patterns(model, natural):
        prev.append(pat.diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, -1)))  # (head,)
    prev = torch.stack(prev)
    row["prev_tok"] = round(float(prev.max()), 4)
    row["prev_tok_head"] = "L%dH%d" % divmod(int(prev.argmax()), prev.shape[1])
    per = model(natural, return_type="loss", loss_per_token=True)  # (b, pos-1): per[:, i] predicts token i+1
    row["heldout_nats"] = round(float(per.mean()), 4)
    # loss at a late token minus an early one, each averaged over 8 positions ending there (64 windows of
    # single tokens are too noisy): positions (late-7..late) vs (early-7..early)
    row["icl"] = round(float(per[:, late - 8 : late].mean() - per[:, early - 8 : early].mean()), 4)
    pp = model(planted, return_type="loss", loss_per_token=True)
    first = pp[:, offset : offset + prefix_len - 1].mean()  # predicts span tokens 1..L-1, first copy
    second = pp[:, offset + prefix_len : offset + 2 * prefix_len - 1].mean()
    row["planted_first"] = round(float(first), 4)
    row["planted_second"] = round(float(second), 4)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", choices=["regex", "bytes"], default="regex")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--pos", default="rotary", choices=["rotary", "standard"])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--n-eval", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_start = time.time()
    corpus = load_corpus()
    info = {"args": vars(args), "corpus_checksum": corpus.checksum, "python": corpus.python_version}
    if args.tokenizer == "regex":
        t0 = time.time()
        vocab = build_vocab(corpus.train, args.vocab)
        table = {p: 256 + i for i, p in enumerate(vocab)}
        train = encode(corpus.train, table)
        held = encode(corpus.held_out, table)
        d_vocab = 256 + len(vocab)
        info["tokenizer"] = {"kind": "regex pieces + byte fallback", "d_vocab": d_vocab,
                             "train_tokens_per_byte": round(train.numel() / len(corpus.train), 4),
                             "heldout_tokens_per_byte": round(held.numel() / len(corpus.held_out), 4),
                             "heldout_single_byte_token_fraction": round(float((held < 256).float().mean()), 4),
                             "seconds": round(time.time() - t0, 1), "top_pieces": [p.decode("latin-1") for p in vocab[:30]]}
    else:
        train = torch.frombuffer(bytearray(corpus.train), dtype=torch.uint8).long()
        held = torch.frombuffer(bytearray(corpus.held_out), dtype=torch.uint8).long()
        d_vocab = 256
        info["tokenizer"] = {"kind": "bytes", "d_vocab": 256, "heldout_tokens_per_byte": 1.0}
    info["n_train_tokens"] = int(train.numel())
    print(json.dumps(info["tokenizer"]), flush=True)
    C = args.ctx
    prefix_len = offset = C // 4 if C <= 128 else 50  # planted: offset text, span, span; fits C
    natural = text_windows(held, args.n_eval, C, seed=7)
    planted = planted_repeats(held, args.n_eval, prefix_len, offset, seed=11)
    early, late = max(9, C // 10), C - 1
    info.update(planted={"prefix_len": prefix_len, "offset": offset}, icl_positions={"early": early, "late": late})
    cfg = GPTConfig(n_layers=2, n_heads=args.heads, d_model=args.d_model, n_ctx=C, d_vocab=d_vocab, attn_only=True,
                    positional_embedding_type=args.pos, seed=args.seed, model_name="pilot")
    model = HookedGPT(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(args.seed)
    warm = 100
    log, losses = [], []
    train_time, step = 0.0, 0
    deadline = args.minutes * 60
    while True:
        if step % args.eval_every == 0:
            model.eval()
            te = time.time()
            row = {"step": step, "tokens": step * args.batch * C, "train_s": round(train_time, 1),
                   "train_loss": round(sum(losses[-50:]) / max(1, len(losses[-50:])), 4) if losses else None,
                   **measure(model, natural, planted, prefix_len, offset, early, late)}
            row["eval_s"] = round(time.time() - te, 1)
            row["tok_per_s"] = round(step * args.batch * C / train_time) if train_time else None
            log.append(row)
            print(json.dumps(row), flush=True)
            model.train()
            info["log"] = log
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(info, indent=1))
            if time.time() - t_start > deadline:
                break
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, (step + 1) / warm)
        tokens = random_windows(train, args.batch, C, gen)
        loss = model(tokens, return_type="loss")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        train_time += time.time() - t0
        step += 1
    info["total_s"] = round(time.time() - t_start, 1)
    Path(args.out).write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
