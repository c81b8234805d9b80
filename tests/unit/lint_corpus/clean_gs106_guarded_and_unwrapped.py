"""No GS106: a save that branches on whether the model is wrapped, Accelerate's unwrapped model and its prepared
scheduler, and another library's `prepare` (torch.ao.quantization) are no DDP wrapper's state_dict."""

import torch
import torch.ao.quantization as quantization
import torch.distributed as dist
from accelerate import Accelerator
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import get_linear_schedule_with_warmup


class Trainer:
    def __init__(self, model):
        self.model = DDP(model)

    def save(self):
        if dist.get_rank() == 0:
            if isinstance(self.model, DDP):
                state = self.model.module.state_dict()
            else:
                state = self.model.state_dict()
            torch.save(state, "a.pt")
            torch.save(self.model.module.state_dict() if hasattr(self.model, "module") else self.model.state_dict(), "b.pt")


def accelerated():
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = get_linear_schedule_with_warmup(optimizer, 1, 10)
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    if accelerator.is_main_process:
        torch.save({"schedule": schedule.state_dict()}, "schedule.pt")
    model = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        torch.save(model.state_dict(), "model.pt")


def quantized():
    model = quantization.prepare(torch.nn.Linear(2, 2))
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "quantized.pt")


if __name__ == "__main__":
    dist.init_process_group("gloo")
    Trainer(torch.nn.Linear(2, 2)).save()
    accelerated()
    quantized()
    dist.destroy_process_group()
