"""The workload with gpuscale (runs under torchrun or gpuscale run): init, plan_batch, make_loader, setup."""

import os
import sys

import torch.nn.functional as F

import gpuscale

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workload import PER_RANK_BATCH, Recorder, args, make_data, make_model, make_optimizer  # noqa: E402

out, steps, warmup = args()
with gpuscale.init(show_placement=False) as rt:
    data = make_data()
    plan = gpuscale.plan_batch(PER_RANK_BATCH * rt.world_size, rt.world_size, scaling="strong")
    loader = gpuscale.make_loader(data, plan, seed=0)
    training = gpuscale.setup(make_model(), make_optimizer, plan=plan)
    model = training.model
    rec = Recorder(steps, warmup)
    going = True
    while going:
        for x, y in loader:
            with training.autocast():
                loss = F.cross_entropy(model(x), y)
            training.backward(loss)
            training.step()
            if not rec.step_done(loss):
                going = False
                break
    rec.write(out, rt.rank, rt.world_size, variant="gpuscale", bind=os.environ.get("GPUSCALE_BIND", "auto"))
