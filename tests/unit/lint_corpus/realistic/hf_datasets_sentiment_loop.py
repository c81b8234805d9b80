"""DistilBERT sentiment fine-tuning with a hand-written loop over Hugging Face datasets, torchrun.

Each rank trains on its own part of the data (datasets.distributed.split_dataset_by_node); the test
set is scored once, on rank 0.

    torchrun --nproc_per_node 4 hf_datasets_sentiment_loop.py --train-samples 20000
"""
import argparse
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from datasets.distributed import split_dataset_by_node
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, get_scheduler


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="distilbert-base-uncased")
    p.add_argument("--train-samples", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--out", default="sst-out")
    return p.parse_args()


def score(model, loader, device):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            correct += (logits.argmax(-1) == batch["labels"]).sum().item()
            total += batch["labels"].numel()
    model.train()
    return correct / total


def report(model, loader, device, epoch):
    acc = score(model, loader, device)
    print(f"epoch {epoch}: test accuracy {acc:.4f} on {len(loader.dataset)} reviews")


def main():
    args = parse()
    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    raw = load_dataset("imdb")
    train = raw["train"].shuffle().select(range(args.train_samples))
    train = split_dataset_by_node(train, rank=rank, world_size=world_size)
    test = raw["test"].shuffle(seed=0).select(range(5000))

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=256)

    train = train.map(tokenize, batched=True, remove_columns=["text"]).rename_column("label", "labels")
    test = test.map(tokenize, batched=True, remove_columns=["text"]).rename_column("label", "labels")
    collator = DataCollatorWithPadding(tokenizer)
    train_loader = DataLoader(train.with_format("torch"), batch_size=args.batch_size, shuffle=True, collate_fn=collator)
    test_loader = DataLoader(test.with_format("torch"), batch_size=128, collate_fn=collator)

    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    steps = args.epochs * len(train_loader)
    scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=steps // 10, num_training_steps=steps)
    print(f"rank {rank}: {len(train)} training reviews, {len(train_loader)} steps per epoch")

    for epoch in range(args.epochs):
        for step, batch in enumerate(train_loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if rank == 0 and step % 100 == 0:
                print(f"epoch {epoch} step {step}/{len(train_loader)} loss {loss.item():.4f}")
        if rank == 0:
            report(model.module, test_loader, device, epoch)
        dist.barrier()

    model.module.save_pretrained(args.out)
    if rank == 0:
        tokenizer.save_pretrained(args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
