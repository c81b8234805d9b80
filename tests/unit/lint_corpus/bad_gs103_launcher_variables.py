"""GS103, GS109: a script that only reads the launcher's RANK / WORLD_SIZE (HF's Trainer starts the process
group) runs as several processes all the same."""

import os

from transformers import Trainer, TrainingArguments

rank = int(os.environ["RANK"])
world_size = int(os.environ.get("WORLD_SIZE", "1"))
print("starting")  # expect: GS103
if rank == 0:
    print("rank 0 prepares the output folder")
args = TrainingArguments(output_dir="out", per_device_train_batch_size=32 // world_size)  # expect: GS109
trainer = Trainer(model=None, args=args)
