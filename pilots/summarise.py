"""Markdown tables of the pilot logs: python pilots/summarise.py pilots/logs/*.json > pilots/RESULTS-tables.md"""
import json
import sys

for path in sys.argv[1:]:
    info = json.load(open(path))
    a = info["args"]
    print(f"### {path}\n")
    print(f"tokenizer {info['tokenizer']['kind']} (vocab {info['tokenizer']['d_vocab']}, held-out tokens/byte "
          f"{info['tokenizer'].get('heldout_tokens_per_byte')}); ctx {a['ctx']}, batch {a['batch']}, lr {a['lr']}, "
          f"d_model {a['d_model']}, {a['heads']} heads, {a['pos']} positions; planted {info['planted']}; "
          f"ICL positions {info['icl_positions']}\n")
    print("| step | tokens | train s | tok/s | train loss | held-out nats/tok | ind nat k1 | ind nat k2 | ind planted | prev-tok | ICL | planted 1st | planted 2nd |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    log = info["log"]
    every = max(1, len(log) // 16)
    for i, r in enumerate(log):
        if i % every and i != len(log) - 1:
            continue
        print(f"| {r['step']} | {r['tokens']:.2e} | {r['train_s']} | {r['tok_per_s']} | {r['train_loss']} | {r['heldout_nats']} "
              f"| {r['ind_nat_k1']} ({r['ind_nat_k1_head']}) | {r['ind_nat_k2']} ({r['ind_nat_k2_head']}) "
              f"| {r['ind_planted']} ({r['ind_planted_head']}) | {r['prev_tok']} ({r['prev_tok_head']}) | {r['icl']} "
              f"| {r['planted_first']} | {r['planted_second']} |")
    best = max(log, key=lambda r: r["ind_planted"])
    print(f"\nbest planted induction {best['ind_planted']} at step {best['step']}; best natural k2 "
          f"{max(r['ind_nat_k2'] for r in log)}; best natural k1 {max(r['ind_nat_k1'] for r in log)}\n")
