"""A CNN on CIFAR-10 with DeepSpeed ZeRO-1 (`deepspeed --num_gpus 8 deepspeed_cifar_cnn.py`)."""
import argparse
import os

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as transforms
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 32,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 1000}},
    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 15},
    "zero_optimization": {"stage": 1},
    "steps_per_print": 2000,
}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc3(F.relu(self.fc2(x)))


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR-10 with DeepSpeed")
    parser.add_argument("--local_rank", type=int, default=-1, help="passed by the deepspeed launcher")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data", default="./data")
    parser.add_argument("--ckpt-dir", default="ds_checkpoints")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = add_argument()
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
    if rank == 0:
        torchvision.datasets.CIFAR10(root=args.data, train=True, download=True)
    torch.distributed.barrier()
    trainset = torchvision.datasets.CIFAR10(root=args.data, train=True, download=False, transform=transform)
    testset = torchvision.datasets.CIFAR10(root=args.data, train=False, download=False, transform=transform)
    train_sampler = DistributedSampler(trainset)
    trainloader = DataLoader(trainset, batch_size=args.batch_size, sampler=train_sampler, num_workers=2)

    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=parameters,
                                                         config=DS_CONFIG)
    local_device = model_engine.local_rank
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        running_loss = 0.0
        for i, (inputs, labels) in enumerate(trainloader):
            inputs, labels = inputs.to(local_device).half(), labels.to(local_device)
            loss = criterion(model_engine(inputs), labels)
            model_engine.backward(loss)
            model_engine.step()
            running_loss += loss.item()
            if i % 200 == 199 and model_engine.global_rank == 0:
                print(f"[{epoch + 1}, {i + 1:5d}] loss: {running_loss / 200:.3f}")
                running_loss = 0.0
        model_engine.save_checkpoint(args.ckpt_dir, tag=f"epoch{epoch}")

    if model_engine.global_rank == 0:
        testloader = DataLoader(testset, batch_size=256, shuffle=False)
        correct, total = 0, 0
        with torch.no_grad():
            for images, labels in testloader:
                outputs = model_engine(images.to(local_device).half())
                predicted = outputs.argmax(dim=1).cpu()
                total += labels.size(0)
                correct += (predicted == labels).sum().item()
        print(f"Accuracy of the network on the 10000 test images: {100 * correct / total:.1f} %")
    torch.save(model_engine.module.state_dict(), os.path.join(args.ckpt_dir, "final_weights.pt"))


if __name__ == "__main__":
    main()
