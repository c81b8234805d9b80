"""GS108: attribution code asks for the gradient of inputs after wrapping (inputs_embeds, head_mask,
tensors made in the function): not an unfreeze. Parameters unfrozen after wrapping are."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(16, 8)
        self.encoder = nn.Linear(8, 8)
        self.classifier = nn.Linear(8, 2)

    def forward(self, input_ids=None, inputs_embeds=None, head_mask=None):
        if inputs_embeds is None:
            inputs_embeds = self.embeddings(input_ids)
        hidden = self.encoder(inputs_embeds)
        if head_mask is not None:
            hidden = hidden * head_mask
        return self.classifier(hidden.mean(1))


def saliency(model, input_ids):
    inputs_embeds = model.module.embeddings(input_ids).detach()
    inputs_embeds.requires_grad_(True)
    head_mask = torch.ones(8)
    head_mask.requires_grad_(True)
    emb = model.module.embeddings(input_ids)
    emb.requires_grad_()
    weights = torch.ones(8)
    weights.requires_grad = True
    model(inputs_embeds=inputs_embeds * weights, head_mask=head_mask).sum().backward()
    return inputs_embeds.grad, emb


def main():
    dist.init_process_group("gloo")
    dataset = TensorDataset(torch.randint(0, 16, (64, 4)), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    net = Encoder()
    net.encoder.requires_grad_(False)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(4):
        sampler.set_epoch(epoch)
        if epoch == 2:
            for name, param in model.named_parameters():
                if "encoder" in name:
                    param.requires_grad = True  # expect: GS108
            model.module.encoder.requires_grad_(True)  # expect: GS108
        for ids, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(ids), y).backward()
            opt.step()
        inputs_embeds = model.module.embeddings(ids)
        inputs_embeds.requires_grad_(True)
        head_mask = torch.ones(8, requires_grad=False)
        head_mask.requires_grad_(True)
        saliency(model, ids)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
