"""Train 4 steps of global batch 8 through gpuscale.setup; write the final weights and losses.

argv: OUT --strategy S [--zero-stage Z] [--max-per-device M] [--precision P] [--eval-uneven] [--fused auto|on|off] [--compile BACKEND]
With --max-per-device smaller than the per-rank share, each step is split into gradient-accumulation
micro-batches; the optimizer must still see exactly the gradient of the whole global batch.
Rank 0 writes OUT/final.pt, OUT/result.json (losses per step, plan, grad norms, eval accuracy).
"""

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--strategy", default="ddp")
parser.add_argument("--zero-stage", type=int, default=None)
parser.add_argument("--max-per-device", type=int, default=None)
parser.add_argument("--precision", default="fp32")
parser.add_argument("--clip", type=float, default=None)
parser.add_argument("--fused", choices=("auto", "on", "off"), default="auto", help="setup(fused=...): the fused SGD kernel")
parser.add_argument("--compile", default=None, help="setup(compile=BACKEND)")
parser.add_argument("--eval-uneven", action="store_true", help="evaluate with unpadded shards of unequal length")
args = parser.parse_args()
out = Path(args.out)

with gpuscale.init() as rt:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 6), torch.randn(32, 1))
    plan = gpuscale.plan_batch(8, rt.world_size, scaling="strong", max_per_device=args.max_per_device)
    loader = gpuscale.make_loader(data, plan, seed=3)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    options = {"zero_stage": args.zero_stage} if args.strategy == "deepspeed" else {}
    options.update({} if args.fused == "auto" else {"fused": args.fused == "on"}, **({"compile": args.compile} if args.compile else {}))
    training = gpuscale.setup(net, lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9), plan=plan,
                              strategy=args.strategy, precision=args.precision, clip_grad_norm=args.clip, **options)
    allreduces = [0]
    if isinstance(training.model, torch.nn.parallel.DistributedDataParallel):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_hook(state, bucket):
            allreduces[0] += 1
            return allreduce_hook(state, bucket)

        training.model.register_comm_hook(state=None, hook=counting_hook)
    losses, norms, step, micro = [], [], 0, 0
    step_loss = 0.0
    for x, y in loader:
        with training.autocast():
            loss = F.mse_loss(training.model(x).float(), y)
        training.backward(loss)
        step_loss += loss.item() / plan.grad_accum_steps
        micro += 1
        if training.step():
            step += 1
            losses.append(gpuscale.all_reduce_sum([step_loss])[0] / rt.world_size)
            norms.append(training.grad_norm)
            step_loss = 0.0
    assert micro == step * plan.grad_accum_steps, (micro, step)

    evaluation = torch.utils.data.TensorDataset(torch.randn(5, 6), torch.randn(5, 1))  # shards of 3 and 2: 2 and 1 batches
    eval_plan = gpuscale.plan_batch(2, rt.world_size)
    counted = 0
    with torch.no_grad():
        if args.eval_uneven:
            for x, _ in gpuscale.make_loader(evaluation, eval_plan, train=False):
                training.model(x)
                counted += len(x)
        else:
            for (x, _), keep in gpuscale.make_loader(evaluation, eval_plan, train=False, even=True).masked():
                training.model(x)
                counted += int(keep.sum())
    eval_samples = gpuscale.all_reduce_sum([float(counted)])[0]
    final = gpuscale.full_state_dict(training.model)
    if rt.is_main:
        torch.save(final, out / "final.pt")
        (out / "result.json").write_text(json.dumps({
            "losses": losses, "grad_norms": norms, "plan": plan.as_dict(), "precision": training.precision.name,
            "eval_samples": eval_samples, "ddp_allreduces": allreduces[0],
            "fused": bool(getattr(training.optimizer, "defaults", {}).get("fused")),
            "compiled": getattr(training.model, "_compiled_call_impl", None) is not None,
        }))
