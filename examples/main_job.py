"""Train a small Scaleformer translator (English -> Spanish Bible verses) on the shipped data, then
evaluate it on held-out books, print examples, save the folder and reload it with AutoModelForSeq2SeqLM.

    python examples/main_job.py                       # about 10 minutes on 2 CPU cores
    python examples/main_job.py --train_minutes 1     # a quick look

Held-out quality is chrF and BLEU (sacreBLEU) of greedy decoding on the test books (Esther, Joel,
Galatians, James), printed beside the copy-the-source baseline.
"""

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modeling_scaleformer import ScaleformerConfig, ScaleformerForConditionalGeneration  # noqa: E402


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def length_grouped_batches(pairs: list[tuple[list[int], list[int]]], tokens_per_batch: int, rng: random.Random):
    """Batches of similar source length, at most `tokens_per_batch` padded source+target tokens each."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), rng.random()))
    batches, current, longest = [], [], 0
    for i in order:
        longest_next = max(longest, len(pairs[i][0]) + len(pairs[i][1]))
        if current and longest_next * (len(current) + 1) > tokens_per_batch:
            batches.append(current)
            current, longest_next = [], len(pairs[i][0]) + len(pairs[i][1])
        current.append(i)
        longest = longest_next
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(pairs, indices, pad_id: int):
    src = [pairs[i][0] for i in indices]
    tgt = [pairs[i][1] for i in indices]
    ls, lt = max(map(len, src)), max(map(len, tgt))
    input_ids = torch.full((len(src), ls), pad_id)
    attention_mask = torch.zeros(len(src), ls, dtype=torch.long)
    labels = torch.full((len(tgt), lt), -100)
    for row, (s, t) in enumerate(zip(src, tgt)):
        input_ids[row, : len(s)] = torch.tensor(s)
        attention_mask[row, : len(s)] = 1
        labels[row, : len(t)] = torch.tensor(t)
    return input_ids, attention_mask, labels


@torch.no_grad()
def translate(model, tokenizer, sources: list[str], batch_size: int, max_new_tokens: int) -> list[str]:
    model.eval()
    outputs = []
    for start in range(0, len(sources), batch_size):
        enc = tokenizer(sources[start : start + batch_size], return_tensors="pt", padding=True, truncation=False)
        generated = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, no_repeat_ngram_size=3, repetition_penalty=1.2
        )
        outputs += tokenizer.batch_decode(generated, skip_special_tokens=True)
    return [o.strip() for o in outputs]


def scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", default=str(ROOT / "examples" / "data" / "bible"))
    parser.add_argument("--tokenizer", default=str(ROOT / "examples" / "tokenizer"))
    parser.add_argument("--config", default=str(ROOT / "configs" / "scaleformer-tiny.json"))
    parser.add_argument("--output_dir", default=str(ROOT / "outputs" / "main-job"))
    parser.add_argument("--train_minutes", type=float, default=9.0, help="wall-clock training budget")
    parser.add_argument("--tokens_per_batch", type=int, default=3000)
    parser.add_argument("--learning_rate", type=float, default=1.5e-3)
    parser.add_argument("--warmup_steps", type=int, default=60)
    parser.add_argument("--eval_examples", type=int, default=200, help="test verses to translate (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.train_minutes <= 0:
        parser.error("--train_minutes must be positive")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    train = read_jsonl(Path(args.data_dir) / "train.jsonl")
    test = read_jsonl(Path(args.data_dir) / "test.jsonl")
    if args.eval_examples:
        test = test[: args.eval_examples]
    pairs = [(tokenizer(r["en"]).input_ids, tokenizer(r["es"]).input_ids) for r in train]

    config = ScaleformerConfig.from_pretrained(args.config, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               decoder_start_token_id=tokenizer.bos_token_id)
    model = ScaleformerForConditionalGeneration(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters, d_model {config.d_model}, "
          f"{config.encoder_layers}+{config.decoder_layers} layers, horizon {config.rpe_horizon}")
    print(f"data: {len(pairs)} training verse pairs, {len(test)} test verses; budget {args.train_minutes} min")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / args.warmup_steps, math.sqrt(args.warmup_steps / (s + 1)))
    )
    model.train()
    start, step, epoch, seen_tokens = time.time(), 0, 0, 0
    budget = args.train_minutes * 60
    while time.time() - start < budget:
        epoch += 1
        for indices in length_grouped_batches(pairs, args.tokens_per_batch, rng):
            input_ids, attention_mask, labels = collate(pairs, indices, tokenizer.pad_token_id)
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            seen_tokens += int(attention_mask.sum()) + int((labels != -100).sum())
            if step % 50 == 0:
                elapsed = time.time() - start
                print(f"step {step:5d}  epoch {epoch}  loss {loss.item():.3f}  {elapsed / 60:.1f} min  "
                      f"{seen_tokens / elapsed:.0f} tokens/s", flush=True)
            if time.time() - start >= budget:
                break
    print(f"trained {step} steps ({epoch} epochs) in {(time.time() - start) / 60:.1f} min")

    sources, references = [r["en"] for r in test], [r["es"] for r in test]
    t0 = time.time()
    hypotheses = translate(model, tokenizer, sources, batch_size=32, max_new_tokens=96)
    model_scores = scores(hypotheses, references)
    copy_scores = scores(sources, references)
    print(f"\nheld-out test ({len(test)} verses of Esther, Joel, Galatians, James), greedy decoding "
          f"in {time.time() - t0:.0f} s:")
    print(f"  scaleformer   BLEU {model_scores['bleu']:5.2f}  chrF {model_scores['chrf']:5.2f}")
    print(f"  copy source   BLEU {copy_scores['bleu']:5.2f}  chrF {copy_scores['chrf']:5.2f}")
    for src, hyp, ref in list(zip(sources, hypotheses, references))[:3]:
        print(f"\n  en:  {src}\n  out: {hyp}\n  ref: {ref}")

    out = Path(args.output_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "main_job_results.json").write_text(json.dumps(
        {"steps": step, "train_minutes": args.train_minutes, "test_verses": len(test),
         "scaleformer": model_scores, "copy_source": copy_scores}, indent=2))
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    check = translate(reloaded, tokenizer, sources[:4], batch_size=4, max_new_tokens=96)
    if check != hypotheses[:4]:
        raise SystemExit("the reloaded model translates differently from the trained one")
    print(f"\nsaved to {out}; reloaded with AutoModelForSeq2SeqLM and checked")


if __name__ == "__main__":
    main()
