"""GS112: the process group is started and never destroyed."""

import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", init_method="env://")  # expect: GS112
    value = torch.ones(1) * int(os.environ["RANK"])
    dist.all_reduce(value)
    if dist.get_rank() == 0:
        print(f"sum of ranks: {value.item()}")


if __name__ == "__main__":
    main()
