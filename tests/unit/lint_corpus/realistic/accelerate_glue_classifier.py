"""BERT on GLUE MRPC with Hugging Face Accelerate (any number of GPUs: `accelerate launch`).

    accelerate launch accelerate_glue_classifier.py --epochs 3 --unfreeze-epoch 1
"""
import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32


def get_dataloaders(accelerator, tokenizer, batch_size):
    raw = load_dataset("glue", "mrpc")
    raw["train"] = raw["train"].shuffle()

    def tokenize_function(examples):
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)

    with accelerator.main_process_first():
        tokenized = raw.map(tokenize_function, batched=True, remove_columns=["idx", "sentence1", "sentence2"])
    tokenized = tokenized.rename_column("label", "labels")

    def collate_fn(examples):
        return tokenizer.pad(examples, padding="longest", return_tensors="pt")

    train_dataloader = DataLoader(tokenized["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size)
    eval_dataloader = DataLoader(tokenized["validation"], shuffle=False, collate_fn=collate_fn,
                                 batch_size=EVAL_BATCH_SIZE)
    return train_dataloader, eval_dataloader


def training_function(args):
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")

    gradient_accumulation_steps = 1
    batch_size = args.batch_size
    if batch_size > MAX_GPU_BATCH_SIZE:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, tokenizer, batch_size)

    model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased", return_dict=True)
    for param in model.bert.parameters():
        param.requires_grad = False
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=args.lr)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader
    )
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=100,
        num_training_steps=(len(train_dataloader) * args.epochs) // gradient_accumulation_steps,
    )

    for epoch in range(args.epochs):
        if epoch == args.unfreeze_epoch:
            accelerator.unwrap_model(model).bert.requires_grad_(True)
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

        model.eval()
        correct, seen, eval_loss = 0, 0, 0.0
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            eval_loss += accelerator.gather(outputs.loss.detach()).mean().item()
            correct += (predictions == batch["labels"]).sum().item()
            seen += batch["labels"].numel()
        accelerator.print(f"epoch {epoch}: eval loss {eval_loss / len(eval_dataloader):.4f}, "
                          f"accuracy {correct / seen:.4f}")
        print(f"finished epoch {epoch}")

    accelerator.wait_for_everyone()
    os.makedirs(args.output_dir, exist_ok=True)
    unwrapped = accelerator.unwrap_model(model)
    torch.save(unwrapped.state_dict(), os.path.join(args.output_dir, "model.pt"))
    accelerator.save_state(os.path.join(args.output_dir, "state"))
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="Simple example of a training script with Accelerate.")
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default="no")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--unfreeze-epoch", type=int, default=1)
    parser.add_argument("--output-dir", default="mrpc-out")
    training_function(parser.parse_args())


if __name__ == "__main__":
    main()
