"""Clean: a helper saves the plain model's state_dict, handed over as `model.module.state_dict()`, through
`model_without_ddp = model.module`, or as the unwrapped model; the wrapper's own state_dict handed to a helper
that only logs it is not saved."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save_on_master(*args, **kwargs):
    if dist.get_rank() == 0:
        torch.save(*args, **kwargs)


def save_checkpoint(state, filename="checkpoint.pth.tar"):
    torch.save(state, filename)


def export_weights(net, path):
    torch.save(net.state_dict(), path)


def count_keys(state):
    return len(state)


def main():
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 2)
    model_without_ddp = model
    model = DDP(model)
    model_without_ddp = model.module
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    checkpoint = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}
    save_on_master(checkpoint, "model_1.pth")
    if dist.get_rank() == 0:
        save_checkpoint({"epoch": 1, "state_dict": model.module.state_dict()})
        export_weights(model.module, "weights.pth")
        export_weights(model_without_ddp, "plain.pth")
        print(count_keys(model.state_dict()), "keys")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
