"""Masked-autoencoder pretraining in the style of MAE/DeiT research code: the distributed set-up and a
print replaced on every rank but the first live in the project's own `util/misc.py`."""

import argparse
import json
import os
import time

import torch
import torch.backends.cudnn as cudnn
import torchvision.datasets as datasets
import torchvision.transforms as transforms

import util.misc as misc


def get_args_parser():
    parser = argparse.ArgumentParser("MAE pre-training", add_help=False)
    parser.add_argument("--batch_size", default=64, type=int)
    parser.add_argument("--epochs", default=400, type=int)
    parser.add_argument("--accum_iter", default=1, type=int)
    parser.add_argument("--mask_ratio", default=0.75, type=float)
    parser.add_argument("--blr", type=float, default=1.5e-4)
    parser.add_argument("--data_path", default="/datasets01/imagenet_full_size/061417/", type=str)
    parser.add_argument("--output_dir", default="./output_dir")
    parser.add_argument("--seed", default=0, type=int)
    parser.add_argument("--num_workers", default=10, type=int)
    parser.add_argument("--dist_url", default="env://")
    return parser


class TinyMAE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Conv2d(3, 64, 16, 16)
        self.decoder = torch.nn.ConvTranspose2d(64, 3, 16, 16)

    def forward(self, imgs, mask_ratio):
        latent = self.encoder(imgs)
        keep = (torch.rand_like(latent[:, :1]) > mask_ratio).float()
        pred = self.decoder(latent * keep)
        return ((pred - imgs) ** 2).mean()


def train_one_epoch(model, data_loader, optimizer, epoch, args):
    model.train(True)
    print("Epoch: [{}]".format(epoch))
    for data_iter_step, (samples, _) in enumerate(data_loader):
        samples = samples.cuda(non_blocking=True)
        loss = model(samples, mask_ratio=args.mask_ratio)
        loss = loss / args.accum_iter
        loss.backward()
        if (data_iter_step + 1) % args.accum_iter == 0:
            optimizer.step()
            optimizer.zero_grad()
        if data_iter_step % 20 == 0:
            print("step {} loss {:.4f}".format(data_iter_step, loss.item()))
    return {"loss": loss.item()}


def main(args):
    misc.init_distributed_mode(args)
    print("job dir: {}".format(os.path.dirname(os.path.realpath(__file__))))
    print("{}".format(args).replace(", ", ",\n"))
    device = torch.device("cuda")
    seed = args.seed + misc.get_rank()
    torch.manual_seed(seed)
    cudnn.benchmark = True

    transform_train = transforms.Compose([transforms.RandomResizedCrop(224, scale=(0.2, 1.0)), transforms.ToTensor()])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_path, "train"), transform=transform_train)
    print(dataset_train)
    num_tasks = misc.get_world_size()
    global_rank = misc.get_rank()
    sampler_train = torch.utils.data.DistributedSampler(dataset_train, num_replicas=num_tasks, rank=global_rank, shuffle=True)
    print("Sampler_train = %s" % str(sampler_train))
    data_loader_train = torch.utils.data.DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size,
                                                    num_workers=args.num_workers, pin_memory=True, drop_last=True)

    model = TinyMAE().to(device)
    model_without_ddp = model
    print("Model = %s" % str(model_without_ddp))
    eff_batch_size = args.batch_size * args.accum_iter * misc.get_world_size()
    lr = args.blr * eff_batch_size / 256
    print("actual lr: %.2e" % lr)
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu], find_unused_parameters=True)
        model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=lr, betas=(0.9, 0.95))

    print(f"Start training for {args.epochs} epochs")
    start_time = time.time()
    for epoch in range(args.epochs):
        train_stats = train_one_epoch(model, data_loader_train, optimizer, epoch, args)
        if args.output_dir and (epoch % 20 == 0 or epoch + 1 == args.epochs):
            misc.save_on_master({"model": model_without_ddp.state_dict(), "epoch": epoch},
                                os.path.join(args.output_dir, "checkpoint-%s.pth" % epoch))
        log_stats = {**{f"train_{k}": v for k, v in train_stats.items()}, "epoch": epoch}
        if args.output_dir and misc.is_main_process():
            with open(os.path.join(args.output_dir, "log.txt"), mode="a", encoding="utf-8") as f:
                f.write(json.dumps(log_stats) + "\n")
    print("Training time {:.0f} s".format(time.time() - start_time))


if __name__ == "__main__":
    args = get_args_parser().parse_args()
    main(args)
