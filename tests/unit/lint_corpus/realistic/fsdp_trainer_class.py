"""Text classification with FSDP and a small Trainer class (torchrun; full state dict saved by rank 0).

    torchrun --nnodes 2 --nproc_per_node 8 fsdp_trainer_class.py --epochs 3
"""
import argparse
import functools
import logging
import os

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from transformers.models.bert.modeling_bert import BertLayer

logger = logging.getLogger(__name__)


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        self.tokenizer = AutoTokenizer.from_pretrained(args.model)
        self.train_loader, self.val_loader = self._loaders()
        model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=4)
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={BertLayer})
        self.model = FSDP(model, auto_wrap_policy=policy, device_id=self.local_rank)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr)

    def _loaders(self):
        ds = load_dataset("ag_news")

        def encode(batch):
            return self.tokenizer(batch["text"], truncation=True, padding="max_length", max_length=128)

        ds = ds.map(encode, batched=True).with_format("torch", columns=["input_ids", "attention_mask", "label"])
        self.train_sampler = DistributedSampler(ds["train"], shuffle=True, seed=self.args.seed)
        val_sampler = DistributedSampler(ds["test"], shuffle=False)
        train_loader = DataLoader(ds["train"], batch_size=self.args.batch_size, sampler=self.train_sampler)
        val_loader = DataLoader(ds["test"], batch_size=self.args.batch_size, sampler=val_sampler)
        return train_loader, val_loader

    def _step(self, batch):
        batch = {k: v.to(self.device) for k, v in batch.items()}
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["label"])
        self.optimizer.zero_grad()
        out.loss.backward()
        self.optimizer.step()
        return out.loss.detach()

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        loss_sum = torch.zeros(1, device=self.device)
        correct, total = 0, 0
        for batch in self.val_loader:
            batch = {k: v.to(self.device) for k, v in batch.items()}
            out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["label"])
            loss_sum += out.loss * batch["label"].size(0)
            correct += (out.logits.argmax(-1) == batch["label"]).sum().item()
            total += batch["label"].size(0)
        dist.all_reduce(loss_sum)
        self.model.train()
        return loss_sum.item() / len(self.val_loader.dataset), correct / total

    def save(self, path):
        policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT, policy):
            state = self.model.state_dict()
        if self.rank == 0:
            torch.save(state, path)

    def fit(self):
        for epoch in range(self.args.epochs):
            self.train_sampler.set_epoch(epoch)
            for step, batch in enumerate(self.train_loader):
                loss = self._step(batch)
                if step % self.args.log_every == 0:
                    logger.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
            val_loss, val_acc = self.evaluate()
            if self.rank == 0:
                logger.info("epoch %d: val loss %.4f, val acc %.4f", epoch, val_loss, val_acc)
            self.save(os.path.join(self.args.out_dir, f"epoch{epoch}.pt"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--out-dir", default="fsdp-out")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    dist.init_process_group("nccl")
    try:
        os.makedirs(args.out_dir, exist_ok=True)
        Trainer(args).fit()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
