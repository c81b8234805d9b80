"""Tweet sentiment with a DistilBERT encoder, HF datasets and a hand-written DDP loop (no Trainer, no Accelerate).

    torchrun --standalone --nproc_per_node=4 manual_ddp_text_classifier.py
"""
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                          get_linear_schedule_with_warmup)

MODEL_NAME = "distilbert-base-uncased"
EPOCHS = 4
BATCH_PER_GPU = 32
LR = 3e-5
MAX_LEN = 128
TARGET_LOSS = 0.05


def ddp_setup():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return dist.get_rank(), local_rank, dist.get_world_size()


def load_splits(tokenizer, rank):
    if rank != 0:
        dist.barrier()  # rank 0 downloads and tokenizes first; the others then read its cache
    raw = load_dataset("tweet_eval", "sentiment")

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=MAX_LEN)

    tokenized = raw.map(tokenize, batched=True, remove_columns=["text"])
    if rank == 0:
        dist.barrier()
    tokenized = tokenized.rename_column("label", "labels")
    tokenized.set_format("torch")
    train = tokenized["train"].shuffle()
    return train, tokenized["validation"], tokenized["test"]


def evaluate(model, loader, device):
    model.eval()
    correct, count = 0, 0
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(**batch).logits
            correct += (logits.argmax(-1) == batch["labels"]).sum().item()
            count += batch["labels"].numel()
    stats = torch.tensor([correct, count], dtype=torch.float64, device=device)
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item()


def main():
    rank, local_rank, world_size = ddp_setup()
    device = torch.device(f"cuda:{local_rank}")
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_NAME)
    train_set, val_set, test_set = load_splits(tokenizer, rank)
    collator = DataCollatorWithPadding(tokenizer)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=BATCH_PER_GPU, sampler=train_sampler, collate_fn=collator)
    val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False),
                            collate_fn=collator)
    test_loader = DataLoader(test_set, batch_size=64, shuffle=False, collate_fn=collator)

    model = AutoModelForSequenceClassification.from_pretrained(MODEL_NAME, num_labels=3)
    for p in model.distilbert.embeddings.parameters():
        p.requires_grad = False  # frozen for the first epoch
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    total_steps = EPOCHS * len(train_loader)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.06 * total_steps), total_steps)

    best = 0.0
    for epoch in range(EPOCHS):
        train_sampler.set_epoch(epoch)
        if epoch == 1:
            for p in model.module.distilbert.embeddings.parameters():
                p.requires_grad = True
        model.train()
        epoch_loss = 0.0
        for step, batch in enumerate(train_loader):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            epoch_loss += loss.item()
            if rank == 0 and step % 100 == 0:
                print(f"epoch {epoch} step {step}/{len(train_loader)} loss {loss.item():.4f}")
        val_acc = evaluate(model, val_loader, device)
        if rank == 0:
            print(f"epoch {epoch}: validation accuracy {val_acc:.4f}")
            if val_acc > best:
                best = val_acc
                model.module.save_pretrained("best_model")
                tokenizer.save_pretrained("best_model")
        if epoch_loss / len(train_loader) < TARGET_LOSS:
            break  # converged
    test_acc = evaluate(model, test_loader, device)
    print(f"test accuracy {test_acc:.4f} (best validation {best:.4f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
