#!/usr/bin/env python
"""Fine-tune GPT-neo on IMDB reviews with the Hugging Face Trainer, launched by torchrun.

    torchrun --nproc_per_node=8 hf_trainer_gptneo_imdb.py --output-path /scratch/out
"""
import argparse
import math
import os
import time

import torch
from datasets import load_dataset
from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                          TrainingArguments)


def tokenize_splits(train_dataset, eval_dataset, tokenizer, max_length):
    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=max_length)

    train_tok = train_dataset.map(tokenize, batched=True, remove_columns=["text", "label"])
    eval_tok = eval_dataset.map(tokenize, batched=True, remove_columns=["text", "label"])
    return train_tok, eval_tok


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name", default="gpt-imdb-model")
    parser.add_argument("--output-path", required=True)
    parser.add_argument("--logging-path", default="logs")
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--train-samples", type=int, default=50000)
    args, _ = parser.parse_known_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])

    print("Using PyTorch version:", torch.__version__)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        print(f"Rank {rank} of {world_size} (local {local_rank}) uses {torch.cuda.get_device_name(device)}")
    else:
        device = torch.device("cpu")
    output_dir = os.path.join(args.output_path, args.model_name)
    logging_dir = os.path.join(args.logging_path, args.model_name)

    pretrained_model = "EleutherAI/gpt-neo-1.3B"
    if rank == 0:
        print("Loading model and tokenizer")
    start = time.time()
    tokenizer = AutoTokenizer.from_pretrained(pretrained_model, use_fast=True)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(pretrained_model)
    model.to(device)
    if rank == 0:
        print(f"Loading model and tokenizer took: {time.time() - start:.2f} seconds")

    train_dataset = load_dataset("imdb", split="train+unsupervised", keep_in_memory=True)
    train_dataset = train_dataset.shuffle().select(range(args.train_samples))
    splits = train_dataset.train_test_split(test_size=0.05)
    train_dataset, validate_dataset = splits["train"], splits["test"]
    test_dataset = load_dataset("imdb", split="test", keep_in_memory=True).shuffle(seed=42).select(range(2000))

    train_batch_size = 32
    eval_batch_size = 128
    training_args = TrainingArguments(
        output_dir=output_dir,
        save_strategy="steps",
        save_steps=100,
        save_total_limit=4,
        logging_dir=logging_dir,
        eval_strategy="steps",
        eval_steps=200,
        learning_rate=2e-5,
        weight_decay=0.01,
        bf16=True,
        per_device_train_batch_size=train_batch_size // world_size,
        per_device_eval_batch_size=eval_batch_size,
        max_steps=args.max_steps,
        dataloader_num_workers=args.num_workers,
        report_to=["tensorboard"],
        ddp_find_unused_parameters=False,
    )

    train_tok, validate_tok = tokenize_splits(train_dataset, validate_dataset, tokenizer, 256)
    _, test_tok = tokenize_splits(train_dataset.select(range(10)), test_dataset, tokenizer, 256)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False, return_tensors="pt")

    if rank == 0:
        print("Sample of tokenized data")
        print(train_tok[0])
        print("Length of dataset (tokenized)", len(train_tok))

    trainer = Trainer(
        model=model,
        args=training_args,
        tokenizer=tokenizer,
        data_collator=collator,
        train_dataset=train_tok,
        eval_dataset=validate_tok,
    )
    trainer.train()
    trainer.save_model(os.path.join(output_dir, "final"))
    tokenizer.save_pretrained(os.path.join(output_dir, "final"))

    eval_results = trainer.evaluate()
    test_results = trainer.evaluate(test_tok)
    if trainer.is_world_process_zero():
        print(f"Perplexity on validation: {math.exp(eval_results['eval_loss']):.2f}")
        print(f"Perplexity on test: {math.exp(test_results['eval_loss']):.2f}")
        prompt = "The movie 'How to run ML on a supercomputer' was great because"
        inputs = tokenizer(prompt, return_tensors="pt").to(device)
        outputs = model.generate(**inputs, do_sample=True, max_length=80, num_return_sequences=4)
        for text in tokenizer.batch_decode(outputs, skip_special_tokens=True):
            print("-", text)
