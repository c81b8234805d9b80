"""Fine-tune DistilBERT on IMDB sentiment with the HF Trainer, written as the transformers docs write it.

Launched with `torchrun --nproc_per_node 8 hf_trainer_docs_classifier.py` (or `accelerate launch`): the
script itself never reads a rank; the Trainer starts the process group, shards the data and saves once.
"""

import argparse
import json
import os

import evaluate
import numpy as np
import torch
from datasets import load_dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="distilbert-base-uncased")
parser.add_argument("--output-dir", default="imdb-distilbert")
parser.add_argument("--epochs", type=float, default=2)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()

set_seed(42)
tokenizer = AutoTokenizer.from_pretrained(args.model)
imdb = load_dataset("imdb")
print(f"Loaded {len(imdb['train'])} training and {len(imdb['test'])} test reviews")

small_train = imdb["train"].shuffle().select(range(5000))
small_test = imdb["test"].shuffle(seed=42).select(range(1000))


def preprocess(examples):
    return tokenizer(examples["text"], truncation=True)


tokenized_train = small_train.map(preprocess, batched=True)
tokenized_test = small_test.map(preprocess, batched=True)
collator = DataCollatorWithPadding(tokenizer=tokenizer)
accuracy = evaluate.load("accuracy")


def compute_metrics(eval_pred):
    predictions, labels = eval_pred
    predictions = np.argmax(predictions, axis=1)
    correct = (predictions == labels).sum()
    acc = correct / len(labels)
    return {"accuracy": acc, "f1_ready": accuracy.compute(predictions=predictions, references=labels)["accuracy"]}


model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2)
training_args = TrainingArguments(
    output_dir=args.output_dir,
    learning_rate=2e-5,
    per_device_train_batch_size=args.batch_size,
    per_device_eval_batch_size=args.batch_size,
    num_train_epochs=args.epochs,
    weight_decay=0.01,
    eval_strategy="epoch",
    save_strategy="epoch",
    load_best_model_at_end=True,
    report_to="none",
)
trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=tokenized_train,
    eval_dataset=tokenized_test,
    processing_class=tokenizer,
    data_collator=collator,
    compute_metrics=compute_metrics,
)
trainer.train()
results = trainer.evaluate()
print(results)
trainer.save_model(os.path.join(args.output_dir, "best"))
model.config.save_pretrained(os.path.join(args.output_dir, "best-config"))
with open(os.path.join(args.output_dir, "eval_results.json"), "w") as f:
    json.dump(results, f)
if trainer.is_world_process_zero():
    torch.save(trainer.model.state_dict(), os.path.join(args.output_dir, "weights.pt"))
    print(f"Accuracy on {len(small_test)} reviews: {results['eval_accuracy']:.3f}")
