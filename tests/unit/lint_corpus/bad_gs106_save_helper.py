"""GS106: the DDP wrapper's state_dict handed to a helper that saves it (the PyTorch ImageNet example's
`save_checkpoint(state, is_best)`, the torchvision references' `save_on_master(*args, **kwargs)`), directly,
in a checkpoint dict, or as the model itself to a helper that saves its state_dict: every key starts with
'module.'. The finding is at the call that hands the wrapper's state over."""

import shutil

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def is_main_process():
    return dist.get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def export_weights(net, path):
    torch.save(net.state_dict(), path)


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}  # expect: GS106
    save_on_master(checkpoint, "model_1.pth")
    if dist.get_rank() == 0:
        save_checkpoint({"epoch": 1, "state_dict": model.state_dict(),  # expect: GS106
                         "optimizer": optimizer.state_dict()}, is_best=True)
        export_weights(model, "weights.pth")  # expect: GS106
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
